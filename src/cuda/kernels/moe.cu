// 26B-A4B mixture of experts with no host in the loop (GEMMA4.md 2.6). The router's logits come from a GEMV;
// moe_route does softmax over all experts, top-K, renormalisation and per_expert_scale on the device and
// writes "groups": a list of (expert, entries) that the expert kernels read from device memory. At decode the
// K groups are the K slots of the one token; at prefill there is one group per expert holding every (token,
// slot) that chose it, so each expert's rows are streamed once per 4 entries. Expert weights stay in the
// checkpoint layout: gate_up [E][2*Ie][H] (gate rows first) and down [E][H][Ie] are already row-contiguous
// per expert.
#include <algorithm>
#include <cfloat>
#include <string>

#include "cuda/check.h"
#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"
#include "cuda/kernels/launch.h"
#include "cuda/kernels/moe.cuh"

namespace markbase::cuda {

namespace {

using namespace moe_kernels;

// Softmax over E logits, the top K (ties to the lower id), renormalised and times per_expert_scale, by the
// whole block (E <= blockDim.x, K <= kRankMaxK; p: E floats of shared memory holding the logits, published
// by a barrier). Warp 0 turns the logits into probabilities; then every expert's thread counts the experts
// ahead of it (larger, or equal with a lower id) and the K first take their slot; slot k's thread loads its
// per-expert scale and writes ids[k], w[k] (and, for one token, the K slot groups). The H200 A/B: 26B-A4B
// -2.7% per token against K dependent arg-max rounds by one
// warp, whose lane 0 wrote each id to global memory and read it back before loading its scale; the same ids
// and weights.
constexpr int kRankMaxK = 32;
__device__ void route_ranks(float* p, int E, int K, const bf16* pes, int* ids, float* w, bool slot_groups,
                            int* group_expert, int* group_off, int* entries, ExpertRange held) {
    __shared__ float top_p[kRankMaxK];
    __shared__ int top_id[kRankMaxK];
    const int t = threadIdx.x, lane = t & 31;
    if (t < 32) {
        float mx = -FLT_MAX;
        for (int e = lane; e < E; e += 32) mx = fmaxf(mx, p[e]);
        mx = warp_max(mx);
        float sum = 0.0f;
        for (int e = lane; e < E; e += 32) {
            const float v = expf(p[e] - mx);
            p[e] = v;
            sum += v;
        }
        sum = warp_sum(sum);
        for (int e = lane; e < E; e += 32) p[e] = p[e] / sum;
    } else if (t < 32 + K) {
        top_id[t - 32] = 0;  // a slot no expert ranks into (NaN logits) still names a real expert
        top_p[t - 32] = 0.0f;
    }
    __syncthreads();
    if (t < E) {
        const float v = p[t];
        int r = 0;
        for (int j = 0; j < E; ++j) {
            const float o = p[j];
            r += (o > v || (o == v && j < t)) ? 1 : 0;
        }
        if (r < K) {
            top_p[r] = v;
            top_id[r] = t;
        }
    }
    __syncthreads();
    if (t < K) {
        float top_sum = 0.0f;
        for (int k = 0; k < K; ++k) top_sum += top_p[k];  // largest first
        const int id = top_id[t];
        ids[t] = id;
        w[t] = top_p[t] / top_sum * bf16_at(pes, id);
        if (slot_groups) {
            group_expert[t] = held_index(id, held);
            group_off[t] = t;
            entries[t] = t;
            if (t == 0) group_off[K] = K;
        }
    }
}

// One block per token: the experts' input norm over the block, then the routing (route_ranks).
__global__ void route_kernel(const float* logits, int E, int K, const bf16* pes, int* sel_id, float* sel_w,
                             bool slot_groups, int* group_expert, int* group_off, int* entries,
                             const float* x, const bf16* norm_w, int H, float eps, float* e_in,
                             ExpertRange held) {
    extern __shared__ float p[];
    __shared__ float red[32];
    pdl_begin();
    const int t = blockIdx.x;
    for (int e = threadIdx.x; e < E; e += blockDim.x) p[e] = logits[static_cast<int64_t>(t) * E + e];
    if (!x) {             // e_in written by the update before the router (one GPU)
        __syncthreads();  // publishes p
    } else {              // the experts' input: pre_feedforward_layernorm_2(r), by the whole block
        // one block walks the row: unrolled, restrict-qualified loops keep several loads in flight
        const float* __restrict__ xr = x + static_cast<int64_t>(t) * H;
        float ss = 0.0f;
#pragma unroll 4
        for (int k = threadIdx.x; k < H; k += blockDim.x) ss = fmaf(xr[k], xr[k], ss);
        ss = block_sum(ss, red);  // its barriers also publish p
        const float inv = 1.0f / sqrtf(ss / static_cast<float>(H) + eps);
        float* __restrict__ er = e_in + static_cast<int64_t>(t) * H;
#pragma unroll 4
        for (int k = threadIdx.x; k < H; k += blockDim.x) er[k] = xr[k] * inv * bf16_at(norm_w, k);
    }
    route_ranks(p, E, K, pes, sel_id + t * K, sel_w + t * K, slot_groups, group_expert, group_off, entries,
                held);
}

// One token (decode): route_kernel's work by 1024 threads, x, its norm weights
// and the logits (into shared memory) loaded in one batch, so the norm costs one L2 round trip. The same
// routing, the norm's sum in another order.
constexpr int kWideThreads = 1024;
constexpr int kWidePer = 4;  // H <= 4096
__global__ void __launch_bounds__(kWideThreads)
    route_wide_kernel(const float* logits, int E, int K, const bf16* pes, int* sel_id, float* sel_w,
                      int* group_expert, int* group_off, int* entries, const float* __restrict__ x,
                      const bf16* __restrict__ norm_w, int H, float eps, float* __restrict__ e_in,
                      ExpertRange held) {
    extern __shared__ float p[];  // [E]: the logits, then their probabilities
    __shared__ float red[32];
    pdl_begin();
    if (threadIdx.x < E) p[threadIdx.x] = logits[threadIdx.x];
    if (!x) {             // e_in written by the update before the router (one GPU)
        __syncthreads();  // publishes p
        route_ranks(p, E, K, pes, sel_id, sel_w, true, group_expert, group_off, entries, held);
        return;
    }
    float xv[kWidePer], wv[kWidePer];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kWidePer; ++j) {
        const int k = threadIdx.x + j * kWideThreads;
        xv[j] = k < H ? x[k] : 0.0f;
        wv[j] = k < H ? bf16_at(norm_w, k) : 0.0f;
        ss = fmaf(xv[j], xv[j], ss);
    }
    ss = block_sum(ss, red);  // its barriers also publish p
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(H) + eps);
#pragma unroll
    for (int j = 0; j < kWidePer; ++j) {
        const int k = threadIdx.x + j * kWideThreads;
        if (k < H) e_in[k] = xv[j] * inv * wv[j];
    }
    route_ranks(p, E, K, pes, sel_id, sel_w, true, group_expert, group_off, entries, held);
}
// Decode (one token): slot g's expert is group_expert[g] and its entry is g. A warp per output row with U
// (Dual: U + U) 16-byte loads in flight per lane, so a 2816-wide row takes two dependent load rounds instead
// of six (the grouped kernels above: 26B-A4B -5.7% per token).
template <bool Dual, int U>
__device__ __forceinline__ void expert_decode_rows(const float* x, int Kin, bool x_per_slot, const bf16* w,
                                                   int rows, int64_t expert_stride, int64_t up_offset,
                                                   const int* group_expert, float* out, int out_width) {
    pdl_begin();  // the experts are chosen by the previous kernel: nothing to load before it ends
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = blockIdx.y, j = blockIdx.x * kWarps + warp;
    if (j >= rows) return;
    const int e = group_expert[g];
    if (e < 0) {  // held by another rank
        if (lane == 0) out[static_cast<int64_t>(g) * out_width + j] = 0.0f;
        return;
    }
    const uint4* w1 = reinterpret_cast<const uint4*>(w + e * expert_stride + static_cast<int64_t>(j) * Kin);
    const uint4* w2 =
        reinterpret_cast<const uint4*>(w + e * expert_stride + up_offset + static_cast<int64_t>(j) * Kin);
    const float4* x4 = reinterpret_cast<const float4*>(x + (x_per_slot ? static_cast<int64_t>(g) * Kin : 0));
    const int nchunk = Kin >> 3;
    float a1 = 0.0f, a2 = 0.0f;
    for (int c0 = 0; c0 < nchunk; c0 += 32 * U) {
        uint4 v1[U], v2[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = c0 + u * 32 + lane;
            v1[u] = c < nchunk ? ld_stream(w1 + c) : make_uint4(0, 0, 0, 0);
            if constexpr (Dual) v2[u] = c < nchunk ? ld_stream(w2 + c) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = c0 + u * 32 + lane;
            if (c >= nchunk) continue;
            const float4 xa = __ldg(x4 + 2 * c), xb = __ldg(x4 + 2 * c + 1);
            a1 += dot8(v1[u], xa, xb);
            if constexpr (Dual) a2 += dot8(v2[u], xa, xb);
        }
    }
    a1 = warp_sum(a1);
    if constexpr (Dual) a2 = warp_sum(a2);
    if (lane == 0) out[static_cast<int64_t>(g) * out_width + j] = Dual ? gelu_tanh(a1) * a2 : a1;
}

// Registers capped for MinBlocks blocks per SM: the experts' gate/up at 3 (U = 6; at 8 it spills), 26B-A4B
// -1.8% per token against 2 blocks at U = 8 beside the dense MLP.
template <bool Dual, int U, int MinBlocks>
__global__ void __launch_bounds__(kThreads, MinBlocks)
    expert_decode_occ_kernel(const float* x, int Kin, bool x_per_slot, const bf16* w, int rows,
                             int64_t expert_stride, int64_t up_offset, const int* group_expert, float* out,
                             int out_width) {
    expert_decode_rows<Dual, U>(x, Kin, x_per_slot, w, rows, expert_stride, up_offset, group_expert, out,
                                out_width);
}

// Decode: e[j] = sum_k sel_w[k] * (down[expert of slot k][j] . h[k]), so the combine reads one vector
// instead of K and a rank's experts_sum launch goes (26B-A4B -0.2% alone, -0.4% beside the prenormed
// router; a slot kernel summed by the combine, and a warp per row over all 8 slots, were slower). Warp w the
// dot of slot w (then w + 8, ...). Each slot's dot is expert_decode_rows's (lane's chunks lane + 32 u in u
// order, then warp_sum), and one thread adds the slots in residual_moe_wide_kernel's order (acc += w * dot
// from slot 0): e is bit-identical to the slots summed by the combine.
constexpr int kSumChunks = 3;  // 16-byte chunks per lane: rows of at most 96 chunks (Ie <= 768)
constexpr int kSumMaxK = 32;   // slots (moe_route's kRankMaxK)
// R = 4 output rows per block at 3 blocks per SM: warp w loads slot w's R rows (R x 1.4 KB, contiguous in
// the expert's matrix) in one batch, so the 26B-A4B's 2816 rows take 704 blocks, 1.8 waves instead of 3.6 of
// one-row blocks, each wave a DRAM round trip (the H200 A/B: -1.6% per token against one row, 2 rows -0.6%;
// bit-identical at every R). The timeline put the gain mostly in the combine after it (ffn_combine 6.8 ->
// 4.7 us per layer).
constexpr int kSumRows = 4;
template <int R, int MinBlocks>
__global__ void __launch_bounds__(kThreads, MinBlocks)
    expert_down_sum_kernel(const float* h, int Ie, const bf16* down, int H, int K, const int* group_expert,
                           const float* sel_w, float* e) {
    __shared__ float dots[kSumMaxK][R];
    // the expert ids were written two kernels back (route), which with the early PDL trigger may still be
    // running: wait first
    pdl_begin();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int j0 = blockIdx.x * R;
    const int nchunk = Ie >> 3;
    for (int s = warp; s < K; s += kWarps) {
        const int ex = group_expert[s];  // -1: another rank's expert, a zero slot
        uint4 v[R][kSumChunks];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const uint4* w = reinterpret_cast<const uint4*>(down + ex * static_cast<int64_t>(H) * Ie +
                                                            static_cast<int64_t>(j0 + r) * Ie);
#pragma unroll
            for (int u = 0; u < kSumChunks; ++u) {
                const int c = u * 32 + lane;
                v[r][u] = ex >= 0 && j0 + r < H && c < nchunk ? ld_stream(w + c) : make_uint4(0, 0, 0, 0);
            }
        }
        float a[R];
#pragma unroll
        for (int r = 0; r < R; ++r) a[r] = 0.0f;
        if (ex >= 0) {
            const float4* x4 = reinterpret_cast<const float4*>(h + static_cast<int64_t>(s) * Ie);
#pragma unroll
            for (int u = 0; u < kSumChunks; ++u) {
                const int c = u * 32 + lane;
                if (c < nchunk) {
                    const float4 xa = __ldg(x4 + 2 * c), xb = __ldg(x4 + 2 * c + 1);
#pragma unroll
                    for (int r = 0; r < R; ++r) a[r] += dot8(v[r][u], xa, xb);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float t = warp_sum(a[r]);
            if (lane == 0) dots[s][r] = t;
        }
    }
    __syncthreads();
    if (threadIdx.x < R && j0 + static_cast<int>(threadIdx.x) < H) {
        float acc = 0.0f;
        for (int s = 0; s < K; ++s) acc += sel_w[s] * dots[s][threadIdx.x];
        e[j0 + threadIdx.x] = acc;
    }
}
}  // namespace

void moe_gate_up_decode(const float* x, int H, const bf16* gate_up, int Ie, int K, const int* group_expert,
                        float* h, cudaStream_t s) {
    if (H % 8) throw Error("internal: expert input width must be a multiple of 8");
    launch_kernel(expert_decode_occ_kernel<true, 6, 3>, dim3((Ie + kWarps - 1) / kWarps, K), dim3(kThreads),
                  0, s, x, H, false, gate_up, Ie, 2 * static_cast<int64_t>(Ie) * H,
                  static_cast<int64_t>(Ie) * H, group_expert, h, Ie);
    CUDA_CHECK_LAUNCH();
}

void moe_down_sum_decode(const float* h, int Ie, const bf16* down, int H, int K, const int* group_expert,
                         const float* sel_w, float* e, cudaStream_t s) {
    if (Ie % 8 || Ie / 8 > 32 * kSumChunks || K > kSumMaxK)
        throw Error("internal: the summed expert down takes widths that are multiples of 8 up to " +
                    std::to_string(256 * kSumChunks) + " and up to " + std::to_string(kSumMaxK) +
                    " slots, not " + std::to_string(Ie) + " and " + std::to_string(K));
    launch_kernel(expert_down_sum_kernel<kSumRows, 3>, dim3((H + kSumRows - 1) / kSumRows), dim3(kThreads), 0,
                  s, h, Ie, down, H, K, group_expert, sel_w, e);
    CUDA_CHECK_LAUNCH();
}

void moe_route(const float* logits, int n, int E, int K, const bf16* per_expert_scale, int* sel_id,
               float* sel_w, bool groups_for_slots, int* group_expert, int* group_off, int* entries,
               const float* x, const bf16* norm_w, int H, float eps, float* e_in, cudaStream_t s,
               ExpertRange held, bool wide) {
    if (E > 256 || K > kRankMaxK)
        throw Error("internal: routing takes at most 256 experts and top-" + std::to_string(kRankMaxK));
    if (wide && n == 1 && groups_for_slots && H <= kWideThreads * kWidePer && E <= kWideThreads) {
        launch_kernel(route_wide_kernel, dim3(1), dim3(kWideThreads), static_cast<size_t>(E) * sizeof(float),
                      s, logits, E, K, per_expert_scale, sel_id, sel_w, group_expert, group_off, entries, x,
                      norm_w, H, eps, e_in, held);
        CUDA_CHECK_LAUNCH();
        return;
    }
    launch_kernel(route_kernel, dim3(n), dim3(256), static_cast<size_t>(E) * sizeof(float), s, logits, E, K,
                  per_expert_scale, sel_id, sel_w, groups_for_slots, group_expert, group_off, entries, x,
                  norm_w, H, eps, e_in, held);
    CUDA_CHECK_LAUNCH();
}

}  // namespace markbase::cuda
