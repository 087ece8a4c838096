// Batched decode's attention pieces (AttnArgs.tok_pos: token t at its own position in its own sequence slot's
// cache; fixed pieces of split_len keys) where attention_group.cu's grouped kernel does not apply, and their
// merge (attn_combine_kernel). The same online softmax as attention.cu's decode pieces.
#include <cfloat>

#include "cuda/check.h"
#include "cuda/kernels/attention.cuh"
#include "cuda/kernels/launch.h"

namespace markbase::cuda {

namespace {

using namespace attn_kernels;

// Merge of a head's first n pieces into its output row: out = sum_s o_s * exp(m_s - M) / sum_s l_s *
// exp(m_s - M). Reads through L2 (__ldcg): the pieces may have been written by other blocks of the running
// grid.
__device__ void merge_pieces(const AttnArgs& a, int64_t base, int n, float* out) {
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
        if (dim < a.d) out[dim] = acc[i] * inv;
    }
}

// The online softmax over one scored tile: the running max and sum (m, l) move to the tile's, the output
// accumulator is rescaled, and the tile's values are added key by key (thread tid owns dims tid + i
// kThreads).
__device__ __forceinline__ void partial_tile_values(const AttnArgs& a, const float* v_cache, int g,
                                                    int64_t ts, int cnt, float* sc, float& m, float& l,
                                                    float (&acc)[kMaxDimsPerThread], int tid, int d) {
    float tmax = -FLT_MAX;
    for (int j = 0; j < cnt; ++j) tmax = fmaxf(tmax, sc[j]);
    const float new_m = fmaxf(m, tmax);
    const float corr = __expf(m - new_m);
    __syncthreads();
    if (tid < cnt) sc[tid] = expf(sc[tid] - new_m);
    __syncthreads();
    float lsum = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxDimsPerThread; ++i) acc[i] *= corr;
#pragma unroll 4
    for (int j = 0; j < cnt; ++j) {
        const float p = sc[j];
        lsum += p;
        const float* vp = v_cache + (((ts + j) % a.cap) * a.nKV + g) * d;
#pragma unroll
        for (int i = 0; i < kMaxDimsPerThread; ++i) {
            const int dim = tid + i * kThreads;
            if (dim < d) acc[i] = fmaf(p, __ldg(vp + dim), acc[i]);
        }
    }
    l = l * corr + lsum;
    m = new_m;
}

// Batched decode's pieces (AttnArgs.tok_pos: each query reads its own sequence slot's cache; fixed pieces,
// merged by attn_combine_kernel).
__global__ void __launch_bounds__(kThreads) attn_partial_kernel(const AttnArgs a) {
    extern __shared__ float4 smem4[];
    float* qs = reinterpret_cast<float*>(smem4);  // [d]
    __shared__ float sc[kTile];
    pdl_begin();
    const int sp = blockIdx.x, h = blockIdx.y, t = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int d = a.d;
    // split_len 0 (decode graphs): spread the current range evenly over the pieces, at least min_split keys
    // each; with active_only, the pieces past the range take no part at all
    const PieceGeometry geo = piece_geometry<true>(a, t);
    const int64_t slot_off = static_cast<int64_t>(a.tok_slot[t]) * a.slot_stride;
    const float* k_cache = a.k_cache + slot_off;
    const float* v_cache = a.v_cache + slot_off;
    if (sp >= geo.active) return;
    const int64_t pos = geo.pos, lo = geo.lo, split_len = geo.split_len;
    const int64_t start = lo + static_cast<int64_t>(sp) * split_len;
    const int64_t end = min(pos + 1, start + split_len);
    const int64_t idx = (static_cast<int64_t>(t) * a.nH + h) * a.nsplit + sp;
    float m = -FLT_MAX, l = 0.0f;
    float acc[kMaxDimsPerThread];
#pragma unroll
    for (int i = 0; i < kMaxDimsPerThread; ++i) acc[i] = 0.0f;

    if (start < end) {
        const int g = h / (a.nH / a.nKV);
        const float* q = a.q + (static_cast<int64_t>(t) * a.nH + h) * d;
        for (int j = tid; j < d; j += kThreads) qs[j] = q[j];
        __syncthreads();
        const int d4 = d / 4;
        for (int64_t ts = start; ts < end; ts += kTile) {
            const int cnt = static_cast<int>(min(static_cast<int64_t>(kTile), end - ts));
            // scores: each warp takes 4 consecutive keys at a time, their loads in flight together
            for (int j0 = warp * 4; j0 < cnt; j0 += kThreads / 32 * 4) {
                const float4* kp[4];
                float s[4];
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const int j = min(j0 + u, cnt - 1);
                    kp[u] = reinterpret_cast<const float4*>(k_cache + (((ts + j) % a.cap) * a.nKV + g) * d);
                    s[u] = 0.0f;
                }
                dot4_keys(kp, smem4, lane, d4, s);
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    s[u] = warp_sum(s[u]);
                    if (lane == 0 && j0 + u < cnt) sc[j0 + u] = s[u];
                }
            }
            __syncthreads();
            partial_tile_values(a, v_cache, g, ts, cnt, sc, m, l, acc, tid, d);
            __syncthreads();
        }
        float* po = a.part_o + idx * d;
#pragma unroll
        for (int i = 0; i < kMaxDimsPerThread; ++i) {
            const int dim = tid + i * kThreads;
            if (dim < d) po[dim] = acc[i];
        }
    }
    if (tid == 0) {
        a.part_ml[2 * idx] = m;
        a.part_ml[2 * idx + 1] = l;  // 0 for an empty piece
    }
}

__global__ void __launch_bounds__(kThreads) attn_combine_kernel(const AttnArgs a) {
    pdl_begin();
    const int h = blockIdx.x, t = blockIdx.y;
    const int64_t base = (static_cast<int64_t>(t) * a.nH + h) * a.nsplit;
    merge_pieces(a, base, piece_geometry<true>(a, t).active,
                 a.out + (static_cast<int64_t>(t) * a.nH + h) * a.d);
}

}  // namespace

namespace attn_kernels {

void attention_batched_pieces(const AttnArgs& a, int n, cudaStream_t s) {
    launch_kernel(attn_partial_kernel, dim3(a.nsplit, a.nH, n), dim3(kThreads),
                  static_cast<size_t>(a.d) * sizeof(float), s, a);
}

}  // namespace attn_kernels

void attention_combine(const AttnArgs& a, int n, cudaStream_t s) {
    if (!a.tok_pos) throw Error("internal: a separate attention merge is batched decode's");
    launch_kernel(attn_combine_kernel, dim3(a.nH, n), dim3(kThreads), 0, s, a);
    CUDA_CHECK_LAUNCH();
}

}  // namespace markbase::cuda
