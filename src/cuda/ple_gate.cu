// The per-layer-input gate of the PLE models at one token with the MLP's residual update folded in
// (MARKBASE_CUDA_PLE_FOLD): x' = (x + RMSNorm(y) * w) * scale, then g[r] = gelu(W_gate[r] . x') * ple[r]
// (GEMMA4.md 2.4). Today the update is a one-block launch of its own between the down projection and this
// gate; each phase of the decode step costs ~2 us however little it does (session 7's persistent lab), and
// the gate is small (P = 256 rows, ~32 blocks), so every block recomputing the update from y and x (two
// vectors of H floats from L2) is cheap where a whole GEMV's thousands of blocks doing it (session 6's
// RES_FOLD) was not. Block 0 stores x' to the other residual buffer (never in place: the other blocks are
// still reading x).
#include <string>

#include "cuda/check.h"
#include "cuda/device_common.cuh"
#include "cuda/kernels.h"
#include "cuda/launch.h"

namespace markbase::cuda {

namespace {

constexpr int kThreads = 256;  // 8 warps, one gate row each
constexpr int kRowsPerBlock = kThreads / 32;
constexpr int kMaxHidden = 4096;  // x' staged in shared memory (16 KB)
constexpr int kPer = kMaxHidden / kThreads;
constexpr int kU = 4;  // 16-byte weight chunks per lane in flight

__global__ void __launch_bounds__(kThreads)
    ple_gate_fold_kernel(const float* __restrict__ x, const float* __restrict__ y, const bf16* __restrict__ w,
                         float scale, float eps, int H, const bf16* __restrict__ wg, int P,
                         const float* __restrict__ ple, float* __restrict__ g, float* __restrict__ x_out) {
    __shared__ __align__(16) float xs[kMaxHidden];
    __shared__ float red[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row = blockIdx.x * kRowsPerBlock + warp;
    const bool active = row < P;
    const int nchunk = H >> 3;
    const uint4* wr = reinterpret_cast<const uint4*>(wg + static_cast<int64_t>(active ? row : 0) * H);
    uint4 v[kU];
    auto load = [&](int base) {
#pragma unroll
        for (int u = 0; u < kU; ++u) {
            const int c = base + u * 32 + lane;
            v[u] = active && c < nchunk ? ld_stream(wr + c) : make_uint4(0, 0, 0, 0);
        }
    };
    load(0);  // weights and the update's norm weights never depend on the previous kernel
    float wv[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        const int k = threadIdx.x + j * kThreads;
        wv[j] = k < H ? bf16_at(w, k) : 0.0f;
    }
    pdl_begin();

    // the residual update, as residual_add_norm computes it (y and x requested in one batch)
    float yv[kPer], xv[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        const int k = threadIdx.x + j * kThreads;
        yv[j] = k < H ? y[k] : 0.0f;
        xv[j] = k < H ? x[k] : 0.0f;
    }
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kPer; ++j) ss = fmaf(yv[j], yv[j], ss);
    ss = block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(H) + eps);
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        const int k = threadIdx.x + j * kThreads;
        if (k < H) {
            const float nx = (xv[j] + yv[j] * inv * wv[j]) * scale;
            xs[k] = nx;
            if (blockIdx.x == 0) x_out[k] = nx;
        }
    }
    __syncthreads();

    // one warp per gate row against x'
    const float4* x4 = reinterpret_cast<const float4*>(xs);
    float acc = 0.0f;
    for (int base = 0; base < nchunk; base += 32 * kU) {
        if (base) load(base);
#pragma unroll
        for (int u = 0; u < kU; ++u) {
            const int c = base + u * 32 + lane;
            if (c < nchunk) acc += dot8(v[u], x4[2 * c], x4[2 * c + 1]);
        }
    }
    acc = warp_sum(acc);
    if (lane == 0 && active) g[row] = gelu_tanh(acc) * ple[row];
}

}  // namespace

bool ple_gate_fold_fits(int H) {
    return H % 8 == 0 && H <= kMaxHidden;
}

void ple_gate_fold(const float* x, const float* y, const bf16* w, float scale, float eps, int H,
                   const bf16* wg, int P, const float* ple, float* g, float* x_out, cudaStream_t s) {
    if (!ple_gate_fold_fits(H))
        throw Error("internal: the folded PLE gate takes a hidden width <= " + std::to_string(kMaxHidden) +
                    ", a multiple of 8 (got " + std::to_string(H) + ")");
    if (x_out == x) throw Error("internal: the folded PLE gate stores the new x to the other buffer");
    launch_kernel(ple_gate_fold_kernel, dim3((P + kRowsPerBlock - 1) / kRowsPerBlock), dim3(kThreads), 0, s,
                  x, y, w, scale, eps, H, wg, P, ple, g, x_out);
    CUDA_CHECK_LAUNCH();
}

}  // namespace markbase::cuda
