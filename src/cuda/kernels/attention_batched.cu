// The merge of batched decode's attention pieces (attention_warp.cu) into each head's output
// (attn_combine_kernel): the pieces' partial softmax sums rescaled to their common max.
#include <cfloat>

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

}  // namespace

void attention_combine(const AttnArgs& a, int n, cudaStream_t s) {
    if (!a.tok_pos) throw Error("internal: a separate attention merge is batched decode's");
    launch_kernel(attn_combine_kernel, dim3(a.nH, n), dim3(kThreads), 0, s, a);
    CUDA_CHECK_LAUNCH();
}

}  // namespace markbase::cuda
