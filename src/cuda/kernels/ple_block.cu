// The per-layer-input block (GEMMA4.md 2.4) of a few tokens in one launch: x = (x +
// RMSNorm(proj(gelu(gate(x))
// * ple_i)) * w) * layer_scalar. Unfused it is five launches a layer (the bf16 rounding of x, the gate GEMM
// of 256 x H, GeGLU, the projection of H x 256, the residual update): ~0.8 MB products that cost a launch's
// latency each, ~1 ms of E2B's 96-sequence step in the serving profile.
//
// A cluster of kRanks blocks takes kTokens tokens. Rank r computes gate outputs [32 r, 32 r + 32) for them
// (x staged in shared memory; each dot product a warp's, its lanes splitting K in 16-byte loads all in flight
// at once, the tokens' sums meeting by shuffles), applies GeGLU with the tokens' PLE rows and hands its 32 x
// kTokens values to every rank through distributed shared memory; then rank r computes the projection's
// columns [r H / kRanks, (r + 1) H / kRanks) over all 256, and the ranks' sums of squares for the norm meet
// the same way, in rank order: deterministic, no atomics. (A first form gave each thread one output and
// token over the whole K: 192 dependent 16-byte loads a thread, ~85 us a layer, 3x the five launches.) With
// round_inputs (gemm_inputs=bf16) x and the GeGLU output are rounded to bf16 before their products, as the
// unfused path's GEMM operands are; else both stay fp32 (the halves' products, to ~2^-16).
#include <string>

#include "cuda/check.h"
#include "cuda/kernels/cluster.cuh"
#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"
#include "cuda/kernels/launch.h"
#include "model/error.h"

namespace markbase::cuda {

namespace {

constexpr int kRanks = 8;   // blocks a cluster
constexpr int kTokens = 8;  // tokens a cluster
constexpr int kThreads = 256;
constexpr int kP = 256;                 // the PLE width this kernel takes (every Gemma 4 with PLE)
constexpr int kGateRows = kP / kRanks;  // 32 gate outputs a rank: thread t takes output t / 8, token t % 8
constexpr int kPad = 4;                 // floats after each shared row: rows 16 bytes apart in the banks

size_t smem_bytes(int H) {
    return sizeof(float) * (static_cast<size_t>(kTokens) * (H + kPad) + kTokens * (kP + kPad) +
                            kTokens * kGateRows + static_cast<size_t>(kTokens) * (H / kRanks) + kTokens);
}

__device__ __forceinline__ float round_bf16(float v) {
    return __uint_as_float(static_cast<uint32_t>(float_to_bf16_bits(v)) << 16);
}

// acc[t] += the dot of 8 bf16 weights (one 16-byte load) with 8 floats of token t's shared row at `s`
__device__ __forceinline__ void dot8_tokens(uint4 w, const float* s, int ld, float (&acc)[kTokens]) {
    const float w0 = __uint_as_float(w.x << 16), w1 = __uint_as_float(w.x & 0xffff0000u);
    const float w2 = __uint_as_float(w.y << 16), w3 = __uint_as_float(w.y & 0xffff0000u);
    const float w4 = __uint_as_float(w.z << 16), w5 = __uint_as_float(w.z & 0xffff0000u);
    const float w6 = __uint_as_float(w.w << 16), w7 = __uint_as_float(w.w & 0xffff0000u);
#pragma unroll
    for (int t = 0; t < kTokens; ++t) {
        const float4 a = *reinterpret_cast<const float4*>(s + t * ld);
        const float4 b = *reinterpret_cast<const float4*>(s + t * ld + 4);
        float v = acc[t];
        v = fmaf(w0, a.x, v), v = fmaf(w1, a.y, v), v = fmaf(w2, a.z, v), v = fmaf(w3, a.w, v);
        v = fmaf(w4, b.x, v), v = fmaf(w5, b.y, v), v = fmaf(w6, b.z, v), acc[t] = fmaf(w7, b.w, v);
    }
}

// every lane ends with the warp's sums
__device__ __forceinline__ void warp_sum(float (&acc)[kTokens]) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int t = 0; t < kTokens; ++t) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], o);
}

struct PleArgs {
    float* x;          // [n][H]
    const float* ple;  // this layer's PLE rows, [n] x ld_ple
    int64_t ld_ple;
    const bf16* gate;  // [256][H]
    const bf16* proj;  // [H][256]
    const bf16* norm;  // [H]
    int H, n;
    float eps, scale;
    bool round_inputs;
};

// Every dot product is one warp's: its lanes split the K range in 16-byte loads (all of a row's loads in
// flight at once), the 8 tokens' partial sums then meet by shuffles.
template <int C>  // 16-byte chunks of a gate row a lane: C x 32 x 8 = H
__global__ void __launch_bounds__(kThreads) ple_block_kernel(PleArgs a) {
    extern __shared__ __align__(16) float smem[];
    constexpr int H = C * 256, cols = H / kRanks, ldx = H + kPad, ldh = kP + kPad;
    const int rank = static_cast<int>(blockIdx.x % kRanks), tid = threadIdx.x, lane = tid & 31,
              warp = tid >> 5;
    const int tok0 = static_cast<int>(blockIdx.x / kRanks) * kTokens;
    float* xs = smem;                        // [kTokens][ldx]
    float* hs = xs + kTokens * ldx;          // [kTokens][ldh]: every rank's GeGLU outputs
    float* mine = hs + kTokens * ldh;        // [kTokens][kGateRows]: this rank's
    float* ys = mine + kTokens * kGateRows;  // [kTokens][cols]: this rank's projection columns
    float* ssq = ys + kTokens * cols;        // [kTokens]: their sums of squares
    pdl_begin();
    // x of the cluster's tokens (zeros past n), rounded to bf16 where the products take that
    for (int i = tid; i < kTokens * H / 4; i += kThreads) {
        const int t = i / (H / 4), k = (i - t * (H / 4)) * 4;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (tok0 + t < a.n) v = *reinterpret_cast<const float4*>(a.x + int64_t{tok0 + t} * H + k);
        if (a.round_inputs)
            v = make_float4(round_bf16(v.x), round_bf16(v.y), round_bf16(v.z), round_bf16(v.w));
        *reinterpret_cast<float4*>(xs + t * ldx + k) = v;
    }
    __syncthreads();
    // gate outputs warp * 4 .. + 3 of this rank's 32, two at a time (2 C loads a lane in flight), then GeGLU
    // with the tokens' PLE values
    for (int u = 0; u < kGateRows / 8; u += 2) {
        const int ol0 = warp * (kGateRows / 8) + u;
        uint4 wc[2][C];
#pragma unroll
        for (int v = 0; v < 2; ++v) {
            const uint4* w = reinterpret_cast<const uint4*>(a.gate + int64_t{rank * kGateRows + ol0 + v} * H);
#pragma unroll
            for (int c = 0; c < C; ++c) wc[v][c] = w[lane + 32 * c];
        }
#pragma unroll
        for (int v = 0; v < 2; ++v) {
            const int ol = ol0 + v, o = rank * kGateRows + ol;
            float acc[kTokens] = {};
#pragma unroll
            for (int c = 0; c < C; ++c) dot8_tokens(wc[v][c], xs + (lane + 32 * c) * 8, ldx, acc);
            warp_sum(acc);
#pragma unroll
            for (int t = 0; t < kTokens; ++t)
                if (lane == t) {
                    float h = 0.0f;
                    if (tok0 + t < a.n) h = gelu_tanh(acc[t]) * a.ple[int64_t{tok0 + t} * a.ld_ple + o];
                    mine[t * kGateRows + ol] = a.round_inputs ? round_bf16(h) : h;
                }
        }
    }
    __syncthreads();
    cluster_arrive_release();
    cluster_wait_acquire();
    for (int i = tid; i < kTokens * kP; i += kThreads) {  // every rank's outputs
        const int t = i / kP, p = i - t * kP;
        hs[t * ldh + p] =
            cluster_map(mine, static_cast<unsigned>(p / kGateRows))[t * kGateRows + p % kGateRows];
    }
    __syncthreads();
    // projection columns warp + 8 m of this rank's, 8 at a time (8 loads a lane in flight): a lane's 8 of
    // the 256
    constexpr int kBatch = 8;
    static_assert(cols % (8 * kBatch) == 0, "whole batches of columns");
    for (int m0 = 0; m0 < cols / 8; m0 += kBatch) {
        uint4 wc[kBatch];
#pragma unroll
        for (int b = 0; b < kBatch; ++b)
            wc[b] = reinterpret_cast<const uint4*>(a.proj +
                                                   int64_t{rank * cols + warp + 8 * (m0 + b)} * kP)[lane];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
            const int jl = warp + 8 * (m0 + b);
            float acc[kTokens] = {};
            dot8_tokens(wc[b], hs + lane * 8, ldh, acc);
            warp_sum(acc);
#pragma unroll
            for (int t = 0; t < kTokens; ++t)
                if (lane == t) ys[t * cols + jl] = acc[t];
        }
    }
    __syncthreads();
    {  // warp t: token t's sum of squares over this rank's columns
        float sq = 0.0f;
        for (int j = lane; j < cols; j += 32) sq = fmaf(ys[warp * cols + j], ys[warp * cols + j], sq);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
        if (lane == 0) ssq[warp] = sq;
    }
    __syncthreads();
    cluster_arrive_release();
    cluster_wait_acquire();
    {  // warp t: token t's columns of x, normalised by the ranks' sums in rank order
        float ss = 0.0f;
        for (unsigned r = 0; r < kRanks; ++r) ss += cluster_map(ssq, r)[warp];
        const float inv = 1.0f / sqrtf(ss / static_cast<float>(H) + a.eps);
        const int t = tok0 + warp;
        if (t < a.n)
            for (int j = lane; j < cols; j += 32) {
                const int col = rank * cols + j;
                float* xp = a.x + int64_t{t} * H + col;
                *xp = (*xp + ys[warp * cols + j] * inv * bf16_at(a.norm, col)) * a.scale;
            }
    }
    cluster_arrive_relaxed();  // no block leaves while another still reads its shared memory
    cluster_wait_acquire();
}

template <int C>
void launch(const PleArgs& a, cudaStream_t s) {
    const dim3 grid(static_cast<unsigned>((a.n + kTokens - 1) / kTokens * kRanks)), block(kThreads);
    launch_kernel_cluster(ple_block_kernel<C>, grid, block, smem_bytes(a.H), s, kRanks, a);
}

}  // namespace

bool ple_block_fits(int H, int P, int n) {
    return P == kP && (H == 1536 || H == 2560) && n >= 1 && n <= kPleBlockMaxN;
}

void ple_block_prepare() {
    const int smem = static_cast<int>(smem_bytes(2560));
    CUDA_CHECK(cudaFuncSetAttribute(ple_block_kernel<6>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CUDA_CHECK(cudaFuncSetAttribute(ple_block_kernel<10>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
}

void ple_block(float* x, const float* ple, int64_t ld_ple, const bf16* gate, const bf16* proj,
               const bf16* norm, int H, int P, int n, float eps, float scale, bool round_inputs,
               cudaStream_t s) {
    if (!ple_block_fits(H, P, n))
        throw Error("internal: ple_block takes hidden 1536 or 2560, PLE width 256, 1 to " +
                    std::to_string(kPleBlockMaxN) + " tokens; got " + std::to_string(H) + ", " +
                    std::to_string(P) + ", " + std::to_string(n));
    const PleArgs a{x, ple, ld_ple, gate, proj, norm, H, n, eps, scale, round_inputs};
    if (H == 1536) return launch<6>(a, s);
    launch<10>(a, s);
}

}  // namespace markbase::cuda
