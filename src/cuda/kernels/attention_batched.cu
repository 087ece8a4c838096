// The merge of batched decode's attention pieces (attention_warp.cu, attention_mma.cu) into each head's
// output: the pieces' partial softmax sums rescaled to their common max. attn_combine_kernel walks a head's
// pieces in one block, one L2 round trip after another: right for the serving step's few pieces a sequence
// (13 at 768 keys); over a long context's hundreds (one sequence after 32,768 keys: 513 pieces of 64) that
// chain took 268 us for E2B's 8 heads on the H100, six times the pieces' own 43 us
// (bench/results/cuda-batch-attn-lab.txt). attn_combine_wide_kernel spreads a head over its columns and
// 8 warps of pieces each, 4 pieces' loads in flight per warp.
#include <cfloat>
#include <string>

#include "cuda/check.h"
#include "cuda/kernels/attention.cuh"
#include "cuda/kernels/launch.h"

namespace markbase::cuda {

namespace {

using namespace attn_kernels;

// Merge of a head's first n pieces into its output row (a.out + o): out = sum_s o_s * exp(m_s - M) / sum_s
// l_s * exp(m_s - M), and with a.out_hi its bf16 halves at the same offsets. Reads through L2 (__ldcg): the
// pieces may have been written by other blocks of the running grid.
__device__ void merge_pieces(const AttnArgs& a, int64_t base, int n, int64_t o) {
    float M = -FLT_MAX;
    for (int s = 0; s < n; ++s)
        if (__ldcg(a.part_ml + 2 * (base + s) + 1) > 0.0f) M = fmaxf(M, __ldcg(a.part_ml + 2 * (base + s)));
    float L = 0.0f;
    float acc[kMaxDimsPerThread];
#pragma unroll
    for (int i = 0; i < kMaxDimsPerThread; ++i) acc[i] = 0.0f;
    for (int s = 0; s < n; ++s) {
        const float ls = __ldcg(a.part_ml + 2 * (base + s) + 1);
        if (!(ls > 0.0f)) continue;  // empty piece: its partial output was never written
        const float f = __expf(__ldcg(a.part_ml + 2 * (base + s)) - M);
        L += ls * f;
        const float* po = a.part_o + (base + s) * a.d;
#pragma unroll
        for (int i = 0; i < kMaxDimsPerThread; ++i) {
            const int dim = threadIdx.x + i * kThreads;
            if (dim < a.d) acc[i] = fmaf(__ldcg(po + dim), f, acc[i]);
        }
    }
    const float inv = 1.0f / L;
#pragma unroll
    for (int i = 0; i < kMaxDimsPerThread; ++i) {
        const int dim = threadIdx.x + i * kThreads;
        if (dim < a.d) {
            const float v = acc[i] * inv;
            a.out[o + dim] = v;
            if (a.out_hi) split_store(v, a.out_hi, a.out_lo, o + dim);
        }
    }
}

__global__ void __launch_bounds__(kThreads) attn_combine_kernel(const AttnArgs a) {
    pdl_begin();
    const int h = blockIdx.x, t = blockIdx.y;
    const int64_t base = (static_cast<int64_t>(t) * a.nH + h) * a.nsplit;
    merge_pieces(a, base, piece_geometry<true>(a, t).active, (static_cast<int64_t>(t) * a.nH + h) * a.d);
}

// The wide merge: block (column group cg, head h, token t), warp w taking pieces w, w + 8, ... and lane the
// float4 column 32 cg + lane. Every block first finds the head's M, L and each piece's factor
// exp(m_s - M) (0 for an empty piece, whose partial output was never written) in shared memory; the warps'
// partial sums meet in shared memory at the end.
constexpr int kWideWarps = 8;
__global__ void __launch_bounds__(32 * kWideWarps) attn_combine_wide_kernel(const AttnArgs a) {
    extern __shared__ float fs[];  // [nsplit]
    __shared__ float4 red[kWideWarps][32];
    __shared__ float scratch[32];
    pdl_begin();
    const int h = blockIdx.y, t = blockIdx.z, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int n = piece_geometry<true>(a, t).active, d4 = a.d / 4, c = blockIdx.x * 32 + lane;
    const int64_t base = (static_cast<int64_t>(t) * a.nH + h) * a.nsplit;
    float mx = -FLT_MAX;
    for (int s = tid; s < n; s += blockDim.x)
        if (__ldcg(a.part_ml + 2 * (base + s) + 1) > 0.0f) mx = fmaxf(mx, __ldcg(a.part_ml + 2 * (base + s)));
    const float M = block_max(mx, scratch);
    float lp = 0.0f;
    for (int s = tid; s < n; s += blockDim.x) {
        const float ls = __ldcg(a.part_ml + 2 * (base + s) + 1);
        const float f = ls > 0.0f ? __expf(__ldcg(a.part_ml + 2 * (base + s)) - M) : 0.0f;
        fs[s] = f;
        lp = fmaf(ls, f, lp);
    }
    const float L = block_sum(lp, scratch);  // ends with a barrier: fs is visible
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 acc = zero;
    const float4* po4 = reinterpret_cast<const float4*>(a.part_o + base * a.d) + c;
    for (int s0 = warp; s0 < n; s0 += 4 * kWideWarps) {
        float4 v[4];
        float f[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int s = s0 + u * kWideWarps;
            f[u] = s < n ? fs[s] : 0.0f;
            v[u] = c < d4 && f[u] > 0.0f ? __ldcg(po4 + static_cast<int64_t>(s) * d4) : zero;
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            acc.x = fmaf(v[u].x, f[u], acc.x);
            acc.y = fmaf(v[u].y, f[u], acc.y);
            acc.z = fmaf(v[u].z, f[u], acc.z);
            acc.w = fmaf(v[u].w, f[u], acc.w);
        }
    }
    red[warp][lane] = acc;
    __syncthreads();
    if (warp != 0 || c >= d4) return;
    float4 sum = zero;
    for (int w = 0; w < kWideWarps; ++w) {
        const float4 r = red[w][lane];
        sum = make_float4(sum.x + r.x, sum.y + r.y, sum.z + r.z, sum.w + r.w);
    }
    const float inv = 1.0f / L;
    const int64_t o = (static_cast<int64_t>(t) * a.nH + h) * a.d + 4 * c;
    const float vals[4] = {sum.x * inv, sum.y * inv, sum.z * inv, sum.w * inv};
    for (int k = 0; k < 4; ++k) {
        a.out[o + k] = vals[k];
        if (a.out_hi) split_store(vals[k], a.out_hi, a.out_lo, o + k);
    }
}

}  // namespace

void attention_combine(const AttnArgs& a, int n, cudaStream_t s) {
    if (!a.tok_pos) throw Error("internal: a separate attention merge is batched decode's");
    if (a.nsplit <= kWideMergePieces) {
        launch_kernel(attn_combine_kernel, dim3(a.nH, n), dim3(kThreads), 0, s, a);
    } else {
        const size_t smem = sizeof(float) * static_cast<size_t>(a.nsplit);
        if (smem > 40 * 1024)
            throw Error("internal: " + std::to_string(a.nsplit) +
                        " attention pieces a head exceed the wide merge's shared memory");
        launch_kernel(attn_combine_wide_kernel, dim3((a.d / 4 + 31) / 32, a.nH, n), dim3(32 * kWideWarps),
                      smem, s, a);
    }
    CUDA_CHECK_LAUNCH();
}

}  // namespace markbase::cuda
