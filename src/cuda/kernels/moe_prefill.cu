// The 26B-A4B's experts at prefill (moe.cu routes): the entries bucketed by expert, the grouped GEMV kernels
// (a warp per weight row over each expert's entries), and the batched-GEMM passes' gather, GeGLU and scatter
// (in passes of max_n rows per expert, or the compact pass's padded rows).
#include <algorithm>
#include <string>

#include "cuda/check.h"
#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"
#include "cuda/kernels/launch.h"
#include "cuda/kernels/moe.cuh"

namespace markbase::cuda {

namespace {

using namespace moe_kernels;

__global__ void bucket_kernel(const int* sel_id, int total, int E, int* group_expert, int* group_off,
                              int* entries, ExpertRange held) {
    extern __shared__ int cnt[];  // [2*E]: counts, then cursors
    int* cur = cnt + E;
    pdl_begin();
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < total; i += blockDim.x) atomicAdd(&cnt[sel_id[i]], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int off = 0;
        for (int e = 0; e < E; ++e) {
            group_expert[e] = held_index(e, held);
            group_off[e] = off;
            cur[e] = off;
            off += cnt[e];
        }
        group_off[E] = off;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < total; i += blockDim.x) entries[atomicAdd(&cur[sel_id[i]], 1)] = i;
}
// One warp per weight row (Dual: a gate row and its up row); up to kEntries inputs per pass.
// in_div maps an entry to its input row (K for the gate/up inputs, which are per token; 1 for down's).
template <bool Dual>
__global__ void __launch_bounds__(kThreads)
    expert_kernel(const float* x, int Kin, int in_div, const bf16* w, int rows, int64_t expert_stride,
                  int64_t up_offset, const int* group_expert, const int* group_off, const int* entries,
                  float* out, int out_width) {
    pdl_begin();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = blockIdx.y;
    const int j = blockIdx.x * kWarps + warp;
    if (j >= rows) return;
    const int e = group_expert[g], o0 = group_off[g], o1 = group_off[g + 1];
    if (e < 0) {  // held by another rank: this rank's share of those entries is zero
        if (lane == 0)
            for (int b = o0; b < o1; ++b) out[static_cast<int64_t>(entries[b]) * out_width + j] = 0.0f;
        return;
    }
    const uint4* w1 = reinterpret_cast<const uint4*>(w + e * expert_stride + static_cast<int64_t>(j) * Kin);
    const uint4* w2 =
        reinterpret_cast<const uint4*>(w + e * expert_stride + up_offset + static_cast<int64_t>(j) * Kin);
    const int nchunk = Kin >> 3;
    for (int base = o0; base < o1; base += kEntries) {
        const int ne = min(kEntries, o1 - base);
        int ent[kEntries];
        const float4* xr[kEntries];
#pragma unroll
        for (int i = 0; i < kEntries; ++i) {
            ent[i] = entries[base + min(i, ne - 1)];
            xr[i] = reinterpret_cast<const float4*>(x + static_cast<int64_t>(ent[i] / in_div) * Kin);
        }
        float a1[kEntries], a2[kEntries];
#pragma unroll
        for (int i = 0; i < kEntries; ++i) a1[i] = a2[i] = 0.0f;
        for (int c0 = 0; c0 < nchunk; c0 += 32 * kUnroll) {
            uint4 v1[kUnroll], v2[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int c = c0 + u * 32 + lane;
                v1[u] = c < nchunk ? ld_stream(w1 + c) : make_uint4(0, 0, 0, 0);
                if constexpr (Dual) v2[u] = c < nchunk ? ld_stream(w2 + c) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int c = c0 + u * 32 + lane;
                if (c >= nchunk) continue;
#pragma unroll
                for (int i = 0; i < kEntries; ++i) {
                    if (i >= ne) continue;
                    const float4 xa = __ldg(xr[i] + 2 * c), xb = __ldg(xr[i] + 2 * c + 1);
                    a1[i] += dot8(v1[u], xa, xb);
                    if constexpr (Dual) a2[i] += dot8(v2[u], xa, xb);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < kEntries; ++i) {
            a1[i] = warp_sum(a1[i]);
            if constexpr (Dual) a2[i] = warp_sum(a2[i]);
        }
        if (lane == 0) {
#pragma unroll
            for (int i = 0; i < kEntries; ++i) {
                if (i >= ne) continue;
                out[static_cast<int64_t>(ent[i]) * out_width + j] = Dual ? gelu_tanh(a1[i]) * a2[i] : a1[i];
            }
        }
    }
}
// Prefill experts as batched GEMMs: expert e's tokens gathered into rows [e][0, n_e) of a [E][max_n][H]
// block (hi/lo bf16; rows past n_e zeroed; expert e's rows start at e * e_stride, so with lo = hi + max_n * H
// and e_stride = 2 max_n H each expert's [hi; lo] is one stacked block), and back from a [E][max_n][H]
// result to the (token, slot) rows (halves: from [E][2 max_n][H], the two halves summed).
__global__ void gather_split_kernel(const float* x, int H, int K, const int* entries, const int* group_off,
                                    int first, int max_n, bf16* hi, bf16* lo, int64_t e_stride) {
    pdl_begin();
    const int p = blockIdx.x, e = blockIdx.y;
    const int o0 = group_off[e], ne = group_off[e + 1] - o0;
    const int64_t dst = static_cast<int64_t>(e) * e_stride + static_cast<int64_t>(p) * H;
    if (first + p < ne) {
        const float* src = x + static_cast<int64_t>(entries[o0 + first + p] / K) * H;
        for (int k = threadIdx.x; k < H; k += blockDim.x) split_store(src[k], hi, lo, dst + k);
    } else {
        for (int k = threadIdx.x; k < H; k += blockDim.x) hi[dst + k] = lo[dst + k] = 0;
    }
}

__global__ void scatter_rows_kernel(const float* y, int H, const int* entries, const int* group_off,
                                    int first, int max_n, float* slots, bool halves) {
    pdl_begin();
    const int p = blockIdx.x, e = blockIdx.y;
    const int o0 = group_off[e], ne = group_off[e + 1] - o0;
    if (first + p >= ne) return;
    float* dst = slots + static_cast<int64_t>(entries[o0 + first + p]) * H;
    if (halves) {
        const float* src = y + (static_cast<int64_t>(e) * 2 * max_n + p) * H;
        const int64_t lo = static_cast<int64_t>(max_n) * H;
        for (int k = threadIdx.x; k < H; k += blockDim.x) dst[k] = src[k] + src[lo + k];
        return;
    }
    const float* src = y + (static_cast<int64_t>(e) * max_n + p) * H;
    for (int k = threadIdx.x; k < H; k += blockDim.x) dst[k] = src[k];
}

// The stacked gate/up GEMM's output y2 [E][2 max_n][2 Ie] (gate columns, then up; hi rows, then lo) to the
// down GEMM's stacked input: v = gelu(g) * u with g, u the halves' sums, as bf16 hi into rows [e][p] and lo
// into rows [e][max_n + p] of [E][2 max_n][Ie].
__global__ void geglu_halves_kernel(const float* y2, int max_n, int Ie, bf16* h) {
    pdl_begin();
    const int p = blockIdx.x, e = blockIdx.y;
    const float* hi = y2 + (static_cast<int64_t>(e) * 2 * max_n + p) * 2 * Ie;
    const float* lo = hi + static_cast<int64_t>(max_n) * 2 * Ie;
    bf16* out_hi = h + (static_cast<int64_t>(e) * 2 * max_n + p) * Ie;
    bf16* out_lo = out_hi + static_cast<int64_t>(max_n) * Ie;
    for (int j = threadIdx.x; j < Ie; j += blockDim.x) {
        const float g = hi[j] + lo[j], u = hi[Ie + j] + lo[Ie + j];
        split_store(gelu_tanh(g) * u, out_hi, out_lo, j);  // as geglu_split
    }
}

// The compact layout (one pass over each expert's own rows): expert e's rows padded to r_e = row_off[e + 1] -
// row_off[e], its stacked block [hi: r_e rows; lo: r_e rows] at row 2 row_off[e]. grid (max r_e, E); a block
// per (row p, expert e), rows past r_e exit, padding rows (p >= the expert's entries) are zeros.
__global__ void gather_compact_kernel(const float* x, int H, int K, const int* entries, const int* group_off,
                                      const int* row_off, bf16* xs) {
    pdl_begin();
    const int p = blockIdx.x, e = blockIdx.y;
    const int r0 = row_off[e], re = row_off[e + 1] - r0;
    if (p >= re) return;
    const int o0 = group_off[e], ne = group_off[e + 1] - o0;
    bf16* hi = xs + (2 * static_cast<int64_t>(r0) + p) * H;
    bf16* lo = hi + static_cast<int64_t>(re) * H;
    if (p < ne) {
        const float* src = x + static_cast<int64_t>(entries[o0 + p] / K) * H;
        for (int k = threadIdx.x; k < H; k += blockDim.x) split_store(src[k], hi, lo, k);
    } else {
        for (int k = threadIdx.x; k < H; k += blockDim.x) hi[k] = lo[k] = 0;
    }
}

// gelu(g) * u of the halves' sums, [2 r_e][gate Ie | up Ie] fp32 -> [2 r_e][Ie] bf16 hi and lo rows
__global__ void geglu_compact_kernel(const float* y2, const int* row_off, int Ie, bf16* h) {
    pdl_begin();
    const int p = blockIdx.x, e = blockIdx.y;
    const int r0 = row_off[e], re = row_off[e + 1] - r0;
    if (p >= re) return;
    const float* hi = y2 + (2 * static_cast<int64_t>(r0) + p) * 2 * Ie;
    const float* lo = hi + static_cast<int64_t>(re) * 2 * Ie;
    bf16* out_hi = h + (2 * static_cast<int64_t>(r0) + p) * Ie;
    bf16* out_lo = out_hi + static_cast<int64_t>(re) * Ie;
    for (int j = threadIdx.x; j < Ie; j += blockDim.x) {
        const float g = hi[j] + lo[j], u = hi[Ie + j] + lo[Ie + j];
        split_store(gelu_tanh(g) * u, out_hi, out_lo, j);  // as geglu_split
    }
}

// the down output's halves summed back into the (token, slot) rows
__global__ void scatter_compact_kernel(const float* y, int H, const int* entries, const int* group_off,
                                       const int* row_off, float* slots) {
    pdl_begin();
    const int p = blockIdx.x, e = blockIdx.y;
    const int o0 = group_off[e], ne = group_off[e + 1] - o0;
    const int r0 = row_off[e], re = row_off[e + 1] - r0;
    if (p >= ne || p >= re) return;  // re = 0: an expert another rank holds (its entries stay zero here)
    const float* src = y + (2 * static_cast<int64_t>(r0) + p) * H;
    const int64_t lo = static_cast<int64_t>(re) * H;
    float* dst = slots + static_cast<int64_t>(entries[o0 + p]) * H;
    for (int k = threadIdx.x; k < H; k += blockDim.x) dst[k] = src[k] + src[lo + k];
}

// e[t][k'] = sum_k sel_w[t][k] * slots[t*K + k][k'], one block per token.
__global__ void weighted_sum_kernel(const float* slots, const float* sel_w, int K, int H, float* e) {
    pdl_begin();
    const int t = blockIdx.x;
    const float* w = sel_w + static_cast<int64_t>(t) * K;
    const float* sl = slots + static_cast<int64_t>(t) * K * H;
    for (int j = threadIdx.x; j < H; j += blockDim.x) {
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) acc = fmaf(w[k], sl[static_cast<int64_t>(k) * H + j], acc);
        e[static_cast<int64_t>(t) * H + j] = acc;
    }
}
}  // namespace

void moe_weighted_sum(const float* slots, const float* sel_w, int K, int H, int n, float* e, cudaStream_t s) {
    launch_kernel(weighted_sum_kernel, dim3(n), dim3(256), 0, s, slots, sel_w, K, H, e);
    CUDA_CHECK_LAUNCH();
}

void moe_gather_split(const float* x, int H, int K, const int* entries, const int* group_off, int E,
                      int first, int max_n, bf16* hi, bf16* lo, cudaStream_t s, int64_t e_stride) {
    if (max_n <= 0) return;
    if (e_stride <= 0) e_stride = static_cast<int64_t>(max_n) * H;
    launch_kernel(gather_split_kernel, dim3(max_n, E), dim3(256), 0, s, x, H, K, entries, group_off, first,
                  max_n, hi, lo, e_stride);
    CUDA_CHECK_LAUNCH();
}

void moe_scatter_rows(const float* y, int H, const int* entries, const int* group_off, int E, int first,
                      int max_n, float* slots, cudaStream_t s, bool halves) {
    if (max_n <= 0) return;
    launch_kernel(scatter_rows_kernel, dim3(max_n, E), dim3(256), 0, s, y, H, entries, group_off, first,
                  max_n, slots, halves);
    CUDA_CHECK_LAUNCH();
}

void moe_geglu_halves(const float* y2, int E, int max_n, int Ie, bf16* h, cudaStream_t s) {
    if (max_n <= 0) return;
    launch_kernel(geglu_halves_kernel, dim3(max_n, E), dim3(256), 0, s, y2, max_n, Ie, h);
    CUDA_CHECK_LAUNCH();
}

void moe_gather_compact(const float* x, int H, int K, const int* entries, const int* group_off,
                        const int* row_off, int E, int max_r, bf16* xs, cudaStream_t s) {
    if (max_r <= 0) return;
    launch_kernel(gather_compact_kernel, dim3(max_r, E), dim3(256), 0, s, x, H, K, entries, group_off,
                  row_off, xs);
    CUDA_CHECK_LAUNCH();
}

void moe_geglu_compact(const float* y2, const int* row_off, int E, int max_r, int Ie, bf16* h,
                       cudaStream_t s) {
    if (max_r <= 0) return;
    launch_kernel(geglu_compact_kernel, dim3(max_r, E), dim3(256), 0, s, y2, row_off, Ie, h);
    CUDA_CHECK_LAUNCH();
}

void moe_scatter_compact(const float* y, int H, const int* entries, const int* group_off, const int* row_off,
                         int E, int max_r, float* slots, cudaStream_t s) {
    if (max_r <= 0) return;
    launch_kernel(scatter_compact_kernel, dim3(max_r, E), dim3(256), 0, s, y, H, entries, group_off, row_off,
                  slots);
    CUDA_CHECK_LAUNCH();
}

void moe_bucket(const int* sel_id, int n, int E, int K, int* group_expert, int* group_off, int* entries,
                cudaStream_t s, ExpertRange held) {
    launch_kernel(bucket_kernel, dim3(1), dim3(1024), 2 * static_cast<size_t>(E) * sizeof(int), s, sel_id,
                  n * K, E, group_expert, group_off, entries, held);
    CUDA_CHECK_LAUNCH();
}

void moe_gate_up(const float* x, int H, const bf16* gate_up, int Ie, int K, const int* group_expert,
                 const int* group_off, const int* entries, int n_groups, float* h, cudaStream_t s) {
    if (H % 8) throw Error("internal: expert input width must be a multiple of 8");
    const int64_t stride = 2 * static_cast<int64_t>(Ie) * H;
    launch_kernel(expert_kernel<true>, dim3((Ie + kWarps - 1) / kWarps, n_groups), dim3(kThreads), 0, s, x, H,
                  K, gate_up, Ie, stride, static_cast<int64_t>(Ie) * H, group_expert, group_off, entries, h,
                  Ie);
    CUDA_CHECK_LAUNCH();
}

void moe_down(const float* h, int Ie, const bf16* down, int H, const int* group_expert, const int* group_off,
              const int* entries, int n_groups, float* slots, cudaStream_t s) {
    if (Ie % 8) throw Error("internal: expert width must be a multiple of 8");
    const int64_t stride = static_cast<int64_t>(H) * Ie;
    launch_kernel(expert_kernel<false>, dim3((H + kWarps - 1) / kWarps, n_groups), dim3(kThreads), 0, s, h,
                  Ie, 1, down, H, stride, int64_t{0}, group_expert, group_off, entries, slots, H);
    CUDA_CHECK_LAUNCH();
}

}  // namespace markbase::cuda
