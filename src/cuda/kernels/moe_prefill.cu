// The 26B-A4B's experts at prefill (moe.cu routes): the entries bucketed by expert, the grouped GEMV kernels
// (a warp per weight row over each expert's entries: the widths moe_gemm does not tile), and the weighted sum
// of a tensor-parallel rank's slots.
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
