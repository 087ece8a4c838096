// The per-layer-input block (GEMMA4.md 2.4) of a few tokens in one launch: x = (x +
// RMSNorm(proj(gelu(gate(x))
// * ple_i)) * w) * layer_scalar. Unfused it is five launches a layer (the bf16 rounding of x, the gate GEMM
// of 256 x H, GeGLU, the projection of H x 256, the residual update): ~0.8 MB products that cost a launch's
// latency each, ~1 ms of E2B's 96-sequence step in the serving profile.
//
// A cluster of kRanks blocks takes kTokens tokens. Rank r computes gate outputs [32 r, 32 r + 32) for them
// (x staged in shared memory, one output and token a thread over the whole H), applies GeGLU with the tokens'
// PLE rows and hands its 32 x kTokens values to every rank through distributed shared memory; then rank r
// computes the projection's columns [r H / kRanks, (r + 1) H / kRanks) over all 256, and the ranks' sums of
// squares for the norm meet the same way, in rank order: deterministic, no atomics. With round_inputs
// (gemm_inputs=bf16) x and the GeGLU output are rounded to bf16 before their products, as the unfused path's
// GEMM operands are; else both stay fp32 (the halves' products, to ~2^-16).
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
                            kTokens * kGateRows + 2 * kTokens + 8 * 2);
}

__device__ __forceinline__ float round_bf16(float v) {
    return __uint_as_float(static_cast<uint32_t>(float_to_bf16_bits(v)) << 16);
}

// dot of 8 bf16 weights (one 16-byte load) with 8 floats of shared memory
__device__ __forceinline__ float dot8(uint4 w, const float* s, float acc) {
    const float4 a = *reinterpret_cast<const float4*>(s), b = *reinterpret_cast<const float4*>(s + 4);
    acc = fmaf(__uint_as_float(w.x << 16), a.x, acc);
    acc = fmaf(__uint_as_float(w.x & 0xffff0000u), a.y, acc);
    acc = fmaf(__uint_as_float(w.y << 16), a.z, acc);
    acc = fmaf(__uint_as_float(w.y & 0xffff0000u), a.w, acc);
    acc = fmaf(__uint_as_float(w.z << 16), b.x, acc);
    acc = fmaf(__uint_as_float(w.z & 0xffff0000u), b.y, acc);
    acc = fmaf(__uint_as_float(w.w << 16), b.z, acc);
    return fmaf(__uint_as_float(w.w & 0xffff0000u), b.w, acc);
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

template <int R>  // projection columns a thread: R x 64 = H / kRanks
__global__ void __launch_bounds__(kThreads) ple_block_kernel(PleArgs a) {
    extern __shared__ __align__(16) float smem[];
    const int H = a.H, rank = static_cast<int>(blockIdx.x % kRanks), tid = threadIdx.x;
    const int tok0 = static_cast<int>(blockIdx.x / kRanks) * kTokens;
    float* xs = smem;                          // [kTokens][H + kPad]
    float* hs = xs + kTokens * (H + kPad);     // [kTokens][kP + kPad]: every rank's GeGLU outputs
    float* mine = hs + kTokens * (kP + kPad);  // [kTokens][kGateRows]: this rank's
    float* ssq = mine + kTokens * kGateRows;   // [kTokens]: this rank's sums of squares
    float* part = ssq + 2 * kTokens;           // [8 warps][2 tokens]
    pdl_begin();
    // x of the cluster's tokens (zeros past n), rounded to bf16 where the products take that
    for (int i = tid; i < kTokens * H / 4; i += kThreads) {
        const int t = i / (H / 4), k = (i - t * (H / 4)) * 4;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (tok0 + t < a.n) v = *reinterpret_cast<const float4*>(a.x + int64_t{tok0 + t} * H + k);
        if (a.round_inputs)
            v = make_float4(round_bf16(v.x), round_bf16(v.y), round_bf16(v.z), round_bf16(v.w));
        *reinterpret_cast<float4*>(xs + t * (H + kPad) + k) = v;
    }
    __syncthreads();
    {  // gate output o of token t, then GeGLU with the token's PLE value
        const int ol = tid / kTokens, t = tid % kTokens, o = rank * kGateRows + ol;
        const uint4* w = reinterpret_cast<const uint4*>(a.gate + int64_t{o} * H);
        const float* xr = xs + t * (H + kPad);
        float acc = 0.0f;
#pragma unroll 4
        for (int c = 0; c < H / 8; ++c) acc = dot8(w[c], xr + 8 * c, acc);
        float h = 0.0f;
        if (tok0 + t < a.n) h = gelu_tanh(acc) * a.ple[int64_t{tok0 + t} * a.ld_ple + o];
        mine[t * kGateRows + ol] = a.round_inputs ? round_bf16(h) : h;
    }
    __syncthreads();
    cluster_arrive_release();
    cluster_wait_acquire();
    for (int i = tid; i < kTokens * kP; i += kThreads) {  // every rank's outputs, in place
        const int t = i / kP, p = i - t * kP;
        hs[t * (kP + kPad) + p] =
            cluster_map(mine, static_cast<unsigned>(p / kGateRows))[t * kGateRows + p % kGateRows];
    }
    __syncthreads();
    // projection columns j = col0 + (tid % 64) + 64 q, tokens 2 (tid / 64) and + 1
    const int col0 = rank * (H / kRanks), tp = tid / 64;
    float y[R][2];
#pragma unroll
    for (int q = 0; q < R; ++q) {
        const int j = col0 + (tid % 64) + 64 * q;
        const uint4* w = reinterpret_cast<const uint4*>(a.proj + int64_t{j} * kP);
        float s0 = 0.0f, s1 = 0.0f;
#pragma unroll 4
        for (int c = 0; c < kP / 8; ++c) {
            const uint4 wc = w[c];
            s0 = dot8(wc, hs + (2 * tp) * (kP + kPad) + 8 * c, s0);
            s1 = dot8(wc, hs + (2 * tp + 1) * (kP + kPad) + 8 * c, s1);
        }
        y[q][0] = s0;
        y[q][1] = s1;
    }
    // the norm's sums of squares: per warp (its 32 columns x R, two tokens), then per rank in warp order
    float sq0 = 0.0f, sq1 = 0.0f;
#pragma unroll
    for (int q = 0; q < R; ++q) sq0 = fmaf(y[q][0], y[q][0], sq0), sq1 = fmaf(y[q][1], y[q][1], sq1);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        sq0 += __shfl_xor_sync(0xffffffffu, sq0, o);
        sq1 += __shfl_xor_sync(0xffffffffu, sq1, o);
    }
    const int warp = tid >> 5;
    if ((tid & 31) == 0) part[warp * 2] = sq0, part[warp * 2 + 1] = sq1;
    __syncthreads();
    if (tid < kTokens) {  // token t: warps 2 (t / 2) and + 1, value t % 2
        const int w0 = 2 * (tid / 2);
        ssq[tid] = part[w0 * 2 + tid % 2] + part[(w0 + 1) * 2 + tid % 2];
    }
    __syncthreads();
    cluster_arrive_release();
    cluster_wait_acquire();
    float inv[2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
        float ss = 0.0f;
        for (unsigned r = 0; r < kRanks; ++r) ss += cluster_map(ssq, r)[2 * tp + u];
        inv[u] = 1.0f / sqrtf(ss / static_cast<float>(H) + a.eps);
    }
#pragma unroll
    for (int q = 0; q < R; ++q) {
        const int j = col0 + (tid % 64) + 64 * q;
        const float w = bf16_at(a.norm, j);
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const int t = tok0 + 2 * tp + u;
            if (t < a.n) {
                float* xp = a.x + int64_t{t} * H + j;
                *xp = (*xp + y[q][u] * inv[u] * w) * a.scale;
            }
        }
    }
    cluster_arrive_relaxed();  // no block leaves while another still reads its shared memory
    cluster_wait_acquire();
}

template <int R>
void launch(const PleArgs& a, cudaStream_t s) {
    const dim3 grid(static_cast<unsigned>((a.n + kTokens - 1) / kTokens * kRanks)), block(kThreads);
    launch_kernel_cluster(ple_block_kernel<R>, grid, block, smem_bytes(a.H), s, kRanks, a);
}

}  // namespace

bool ple_block_fits(int H, int P, int n) {
    return P == kP && H % (kRanks * 64) == 0 && (H / kRanks / 64 == 3 || H / kRanks / 64 == 5) && n >= 1 &&
           n <= kPleBlockMaxN;
}

void ple_block_prepare() {
    const int smem = static_cast<int>(smem_bytes(5 * 64 * kRanks));
    CUDA_CHECK(cudaFuncSetAttribute(ple_block_kernel<3>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CUDA_CHECK(cudaFuncSetAttribute(ple_block_kernel<5>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
}

void ple_block(float* x, const float* ple, int64_t ld_ple, const bf16* gate, const bf16* proj,
               const bf16* norm, int H, int P, int n, float eps, float scale, bool round_inputs,
               cudaStream_t s) {
    if (!ple_block_fits(H, P, n))
        throw Error("internal: ple_block takes hidden 1536 or 2560, PLE width 256, 1 to " +
                    std::to_string(kPleBlockMaxN) + " tokens; got " + std::to_string(H) + ", " +
                    std::to_string(P) + ", " + std::to_string(n));
    const PleArgs a{x, ple, ld_ple, gate, proj, norm, H, n, eps, scale, round_inputs};
    if (H / kRanks / 64 == 3) return launch<3>(a, s);
    launch<5>(a, s);
}

}  // namespace markbase::cuda
