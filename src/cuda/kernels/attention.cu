// Attention over the KV cache (fp32, bf16 or e4m3, kv_elems.cuh) at decode (one token, or batched decode's
// one token per sequence), flash-decoding style: the key range a query sees is cut into nsplit pieces; one
// block per (piece, head, token) computes an unnormalised partial softmax-weighted sum with its running max
// and sum (online softmax over tiles of 128 keys), and the last piece of each head (decode) or a combine
// kernel (batched decode) merges the pieces. Prefill runs attention_gemm.cu. Positions come from device
// memory, so a captured graph stays valid as the sequence grows: pieces past the current range just report an
// empty result. Ring slots: position p lives at p % cap, as in the CPU cache. Scale 1.0, no softcap
// (GEMMA4.md 2.5.3); GQA maps head h to KV head h / (nH/nKV).
#include <algorithm>
#include <cfloat>

#include "cuda/check.h"
#include "cuda/kernels/attention.cuh"
#include "cuda/kernels/cluster.cuh"
#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"
#include "cuda/kernels/kv_elems.cuh"
#include "cuda/kernels/launch.h"

namespace markbase::cuda {

namespace {

using namespace attn_kernels;

// ---- decode pieces (split_len 0, merge by the last piece) ----
// The same math as attn_partial_kernel, with more loads in flight for longer pieces: in the V phase the
// keys of a tile are spread over the 4 warps (key j to warp j % 4), each lane owning up to 4 float4 columns
// of the head (lane_col), 4 keys' columns loaded before the first use; the warps' partial outputs are summed
// through shared memory at the end. The merge reads every piece's (m, l) in parallel and then the partial
// outputs with independent loads (every merged piece holds keys, so l > 0 for each; merge_pieces_v2).
constexpr int kWarpsAttn = kThreads / 32;

// The v2 merge, by the last piece of a head: every piece's (m, l) read once (pieces tid, tid + kThreads,
// ...: one round for <= kThreads pieces), then thread c owns float4 column c of the output (d / 4 <=
// kThreads) and requests 8 pieces' partials before using any. A merge of n pieces waits for about n / 8
// L2 round trips; the earlier form (each thread walking its d / kThreads dims one after the other, 4
// pieces per round, and (m, l) read twice) waited for ~d / kThreads x n / 4 + 2: the H200 A/B of this form
// measured E2B -3.9%, E4B -2.7%, 26B-A4B -1.8%, 31B -0.6%, E2B at a 2000-token context -4.3%,
// bit-identical (the same sums in the same order). (Requesting the first 8 pieces' partials together with
// (m, l), before the block reductions, measured -0.1..+0.2%; code in ac2ab10.)
__device__ void merge_pieces_v2(const AttnArgs& a, int64_t base, int n, float* out, float* fs,
                                float* scratch) {
    const int tid = threadIdx.x, d4 = a.d / 4;
    const float4* po4 = reinterpret_cast<const float4*>(a.part_o + base * a.d) + tid;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 v[8];
    auto load8 = [&](int s0) {
#pragma unroll
        for (int u = 0; u < 8; ++u)
            v[u] = tid < d4 && s0 + u < n ? __ldcg(po4 + static_cast<int64_t>(s0 + u) * d4) : zero;
    };
    float m0 = -FLT_MAX, l0 = 0.0f;
    if (tid < n) {
        m0 = __ldcg(a.part_ml + 2 * (base + tid));
        l0 = __ldcg(a.part_ml + 2 * (base + tid) + 1);
    }
    float mx = m0;
    for (int s = tid + kThreads; s < n; s += kThreads) mx = fmaxf(mx, __ldcg(a.part_ml + 2 * (base + s)));
    const float M = block_max(mx, scratch);
    float lp = 0.0f;
    if (tid < n) {
        const float f = __expf(m0 - M);
        fs[tid] = f;
        lp = l0 * f;
    }
    for (int s = tid + kThreads; s < n; s += kThreads) {
        const float f = __expf(__ldcg(a.part_ml + 2 * (base + s)) - M);
        fs[s] = f;
        lp += __ldcg(a.part_ml + 2 * (base + s) + 1) * f;
    }
    const float L = block_sum(lp, scratch);  // ends with a barrier: fs is visible
    const float inv = 1.0f / L;
    if (tid >= d4) return;
    float4 acc = zero;
    for (int s0 = 0; s0 < n; s0 += 8) {
        load8(s0);
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            if (s0 + u < n) {
                const float f = fs[s0 + u];
                acc.x = fmaf(v[u].x, f, acc.x);
                acc.y = fmaf(v[u].y, f, acc.y);
                acc.z = fmaf(v[u].z, f, acc.z);
                acc.w = fmaf(v[u].w, f, acc.w);
            }
        }
    }
    reinterpret_cast<float4*>(out)[tid] = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
}

// Cluster (AttnArgs.cluster, Tuning::attn_cluster): the nsplit pieces of a head are one thread-block
// cluster, and the merge goes through distributed shared memory instead of global memory: each piece stores
// its partial (o, m, l) into piece 0's shared memory and arrives at a cluster barrier (release); piece 0
// waits (acquire) and merges from its own shared memory. That replaces the ticket's chain (a fence, the
// atomic, a fence, the (m, l) loads and n / 8 rounds of partial loads from L2) with one barrier. A block may
// touch another block's shared memory only once every block of the cluster has started: the first barrier
// phase, arrived at the kernel's start and waited on just before the stores. Pieces past the range take part
// in both phases with nothing to give. (sm_90 and later; the PTX fallback for older GPUs never launches the
// cluster kernel: attention_cluster_fits. The barrier and map helpers are in cluster.cuh.)

// The cluster kernel's dynamic shared memory: qs, red, and rank 0's gather of the C pieces' (o, m, l).
size_t cluster_smem(int d, int C) {
    return (static_cast<size_t>(1 + kWarpsAttn + C) * d + 2 * C) * sizeof(float);
}

// A piece of at most 16 keys: this warp's 4 keys (kv) and 4 values (vv; key j to warp j % 4), clamped into
// the piece, all requested before the PDL wait and q's staging; the current position's key and value (just
// written by qkv_post, where the loads above may have seen the slot's old ones) again from L2 after it.
template <class KvT>
__device__ __forceinline__ void batch_load(const AttnArgs& a, const PieceGeometry& geo, int64_t start,
                                           int64_t end, int g, int cnt, int lane, int warp, int d, int d4,
                                           float4 (&kv)[4][kMaxDimsPerThread],
                                           float4 (&vv)[4][kMaxDimsPerThread]) {
    // this warp's keys u (4 consecutive) and values u (key j to warp j % 4), clamped into the piece
    auto key_j = [&](int u) { return min(warp * 4 + u, cnt - 1); };
    auto val_j = [&](int u) { return min(warp + u * kWarpsAttn, cnt - 1); };
    auto row = [&](const void* cache, int j) {
        return static_cast<const KvT*>(cache) + (kv_row(a, 0, start + j) * a.nKV + g) * d;
    };
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        load_lane_row(row(a.k_cache, key_j(u)), lane, d4, kv[u]);
        load_lane_row(row(a.v_cache, val_j(u)), lane, d4, vv[u]);
    }
    pdl_begin_after_loads(cnt);  // (cnt >= 1) the loads above stay above the wait
    if (end == geo.pos + 1) {
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            if (start + key_j(u) == geo.pos)
                load_lane_row<KvT, true>(row(a.k_cache, key_j(u)), lane, d4, kv[u]);
            if (start + val_j(u) == geo.pos)
                load_lane_row<KvT, true>(row(a.v_cache, val_j(u)), lane, d4, vv[u]);
        }
    }
}

// The one-batch piece after its loads: q staged, the keys' scores, their softmax (m, l), and the values
// into acc. The same operations in the same order as the tile loop.
template <class KvT>
__device__ __forceinline__ void batch_compute(const float* q, float* qs, const float4* q4, float* sc,
                                              const float4 (&kv)[4][kMaxDimsPerThread],
                                              const float4 (&vv)[4][kMaxDimsPerThread], int cnt, int tid,
                                              int lane, int warp, int d, int d4, float& m, float& l,
                                              float4 (&acc)[kMaxDimsPerThread]) {
    for (int j = tid; j < d; j += kThreads) qs[j] = q[j];
    __syncthreads();
    float sk[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        sk[u] = warp_sum(lane_dot<KvT>(kv[u], q4, lane, d4));
        if (lane == 0 && warp * 4 + u < cnt) sc[warp * 4 + u] = sk[u];
    }
    __syncthreads();
    float tmax = -FLT_MAX;
    for (int j = 0; j < cnt; ++j) tmax = fmaxf(tmax, sc[j]);
    __syncthreads();
    if (tid < cnt) sc[tid] = expf(sc[tid] - tmax);
    __syncthreads();
    float lsum = 0.0f;
    for (int j = 0; j < cnt; ++j) lsum += sc[j];
    if (warp < cnt) {
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int j = warp + u * kWarpsAttn;
            const float pu = j < cnt ? sc[j] : 0.0f;
#pragma unroll
            for (int i = 0; i < kMaxDimsPerThread; ++i) {
                acc[i].x = fmaf(pu, vv[u][i].x, acc[i].x);
                acc[i].y = fmaf(pu, vv[u][i].y, acc[i].y);
                acc[i].z = fmaf(pu, vv[u][i].z, acc[i].z);
                acc[i].w = fmaf(pu, vv[u][i].w, acc[i].w);
            }
        }
    }
    l = lsum;
    m = tmax;
}

// One tile's scores (keys ts .. ts + cnt - 1) into sc: each warp takes 4 consecutive keys at a time, their
// loads in flight together.
template <class KvT>
__device__ __forceinline__ void tile_scores(const AttnArgs& a, const float4* q4, float* sc, int64_t ts,
                                            int cnt, int g, int lane, int warp, int d, int d4) {
    for (int j0 = warp * 4; j0 < cnt; j0 += kWarpsAttn * 4) {
        float4 kv[4][kMaxDimsPerThread];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int j = min(j0 + u, cnt - 1);
            load_lane_row(static_cast<const KvT*>(a.k_cache) + (kv_row(a, 0, ts + j) * a.nKV + g) * d, lane,
                          d4, kv[u]);
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const float s = warp_sum(lane_dot<KvT>(kv[u], q4, lane, d4));
            if (lane == 0 && j0 + u < cnt) sc[j0 + u] = s;
        }
    }
}

// One tile's values into acc (already rescaled): key j to warp j % 4, 4 keys per warp in flight, the lane's
// columns (lane_col); sc holds the tile's exponentiated scores.
template <class KvT>
__device__ __forceinline__ void tile_values(const AttnArgs& a, const float* sc, int64_t ts, int cnt, int g,
                                            int lane, int warp, int d, int d4,
                                            float4 (&acc)[kMaxDimsPerThread]) {
    for (int j0 = warp; j0 < cnt; j0 += kWarpsAttn * 4) {
        float4 vv[4][kMaxDimsPerThread];
        float p[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int j = j0 + u * kWarpsAttn;
            p[u] = j < cnt ? sc[j] : 0.0f;
            load_lane_row(
                static_cast<const KvT*>(a.v_cache) + (kv_row(a, 0, ts + min(j, cnt - 1)) * a.nKV + g) * d,
                lane, d4, vv[u]);
        }
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
            for (int i = 0; i < kMaxDimsPerThread; ++i) {
                acc[i].x = fmaf(p[u], vv[u][i].x, acc[i].x);
                acc[i].y = fmaf(p[u], vv[u][i].y, acc[i].y);
                acc[i].z = fmaf(p[u], vv[u][i].z, acc[i].z);
                acc[i].w = fmaf(p[u], vv[u][i].w, acc[i].w);
            }
    }
}

// Cluster: this piece's partial (o: the warps' outputs in red, summed; m, l) into piece 0's shared memory
// (rank sp: the cluster spans grid x, = nsplit), then the arrive that makes the stores visible to piece 0.
__device__ __forceinline__ void cluster_give(const float* red, float* go, float* gml, int sp, int tid, int d,
                                             float m, float l) {
    float* go0 = cluster_map(go, 0);
    float* gml0 = cluster_map(gml, 0);
    cluster_wait_acquire();  // phase 1 (every block has started; long since)
    for (int dim = tid; dim < d; dim += kThreads) {
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarpsAttn; ++w) v += red[w * d + dim];
        go0[sp * d + dim] = v;
    }
    if (tid == 0) {
        gml0[2 * sp] = m;
        gml0[2 * sp + 1] = l;
    }
    cluster_arrive_release();  // phase 2: this piece's stores are visible to piece 0 after its wait
}

// Cluster, piece 0 (after its wait): out = sum_s o_s exp(m_s - M) / sum_s l_s exp(m_s - M), over the n
// pieces that hold keys (all l_s > 0); thread tid owns float4 column tid of the output.
__device__ __forceinline__ void cluster_combine(const AttnArgs& a, const float* go, const float* gml, int n,
                                                int h, int t, int tid, int d, int d4) {
    float M = -FLT_MAX;
    for (int s2 = 0; s2 < n; ++s2) M = fmaxf(M, gml[2 * s2]);
    if (tid >= d4) return;
    const float4* go4 = reinterpret_cast<const float4*>(go) + tid;
    float L = 0.0f;
    float4 acc4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s2 = 0; s2 < n; ++s2) {
        const float f = __expf(gml[2 * s2] - M);
        L = fmaf(gml[2 * s2 + 1], f, L);
        const float4 v = go4[s2 * d4];
        acc4.x = fmaf(v.x, f, acc4.x);
        acc4.y = fmaf(v.y, f, acc4.y);
        acc4.z = fmaf(v.z, f, acc4.z);
        acc4.w = fmaf(v.w, f, acc4.w);
    }
    const float inv = 1.0f / L;
    float* out = a.out + (static_cast<int64_t>(t) * a.nH + h) * d;
    reinterpret_cast<float4*>(out)[tid] = make_float4(acc4.x * inv, acc4.y * inv, acc4.z * inv, acc4.w * inv);
}

// One tile's online-softmax step, after its scores: the running max m becomes new_m (corr rescales what was
// summed before), the scores become weights exp(s - new_m) in place, lsum is their sum, acc is rescaled.
__device__ __forceinline__ void tile_softmax(float* sc, int cnt, int tid, float m, float& new_m, float& corr,
                                             float& lsum, float4 (&acc)[kMaxDimsPerThread]) {
    float tmax = -FLT_MAX;
    for (int j = 0; j < cnt; ++j) tmax = fmaxf(tmax, sc[j]);
    new_m = fmaxf(m, tmax);
    corr = __expf(m - new_m);
    __syncthreads();
    if (tid < cnt) sc[tid] = expf(sc[tid] - new_m);
    __syncthreads();
    lsum = 0.0f;
    for (int j = 0; j < cnt; ++j) lsum += sc[j];
#pragma unroll
    for (int i = 0; i < kMaxDimsPerThread; ++i) {
        acc[i].x *= corr;
        acc[i].y *= corr;
        acc[i].z *= corr;
        acc[i].w *= corr;
    }
}

// Without a cluster: this piece's partial (o summed from red; m, l) to global memory, then a ticket per head:
// the last piece to finish merges them all (merge_pieces_v2) and resets the ticket.
__device__ __forceinline__ void ticket_merge(const AttnArgs& a, const PieceGeometry& geo, const float* red,
                                             float* fs, float* scratch, bool& last_piece, int64_t idx, int sp,
                                             int h, int t, int tid, int d, float m, float l) {
    float* po = a.part_o + idx * d;
    for (int dim = tid; dim < d; dim += kThreads) {
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarpsAttn; ++w) v += red[w * d + dim];
        po[dim] = v;
    }
    if (tid == 0) {
        a.part_ml[2 * idx] = m;
        a.part_ml[2 * idx + 1] = l;
    }
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        const unsigned int ticket = atomicAdd(a.merge_counters + static_cast<int64_t>(t) * a.nH + h, 1u);
        last_piece = ticket == static_cast<unsigned int>(geo.active) - 1;
    }
    __syncthreads();
    if (!last_piece) return;
    __threadfence();
    merge_pieces_v2(a, idx - sp, geo.active, a.out + (static_cast<int64_t>(t) * a.nH + h) * d, fs, scratch);
    if (tid == 0) a.merge_counters[static_cast<int64_t>(t) * a.nH + h] = 0u;
}

template <bool Cluster, class KvT>
__global__ void __launch_bounds__(kThreads) attn_decode_v2_kernel(const AttnArgs a) {
    extern __shared__ float4 smem4[];
    const int d = a.d, d4 = d / 4;
    float* qs = reinterpret_cast<float*>(smem4);  // [d]
    float* red = qs + d;                          // [kWarpsAttn][d]
    float* fs = red + kWarpsAttn * d;             // [nsplit] (the ticket's merge)
    float* go = fs;                               // Cluster, piece 0: [nsplit][d] the pieces' partial outputs
    float* gml = go + (Cluster ? a.nsplit * d : 0);  // Cluster, piece 0: [nsplit][2] their (m, l)
    __shared__ float sc[kTile];
    __shared__ float scratch[32];
    __shared__ bool last_piece;
    if constexpr (Cluster) cluster_arrive_relaxed();  // phase 1: this block has started
    // The geometry (pos_base: written at the end of the previous step) and the keys and values of earlier
    // steps are read before the PDL wait (26B-A4B -1.4%, E4B -0.4%, 31B -0.1%, E2B 0.0%)
    const int sp = blockIdx.x, h = blockIdx.y, t = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const PieceGeometry geo = piece_geometry(a, t);
    if (sp >= geo.active) {
        if constexpr (Cluster) {
            cluster_wait_acquire();
            cluster_arrive_release();
        }
        return;
    }
    const int64_t start = geo.lo + static_cast<int64_t>(sp) * geo.split_len;
    const int64_t end = min(geo.pos + 1, start + geo.split_len);
    const int64_t idx = (static_cast<int64_t>(t) * a.nH + h) * a.nsplit + sp;
    const int g = h / (a.nH / a.nKV);
    const float* q = a.q + (static_cast<int64_t>(t) * a.nH + h) * d;
    float m = -FLT_MAX, l = 0.0f;
    float4 acc[kMaxDimsPerThread];
#pragma unroll
    for (int i = 0; i < kMaxDimsPerThread; ++i) acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    // A piece of at most 16 keys (the decode graph's pieces at short contexts): this warp's keys and values
    // are all requested before q is staged, in one batch (the loop below waits for q, then for the keys in
    // d / 128 rounds, then for the values). The same operations in the same order. The H200 A/B: E2B -0.8%,
    // E4B -0.7%, 26B-A4B -0.7%, 31B 0.0%.
    const bool one_batch = end - start <= kWarpsAttn * 4;
    if (one_batch) {
        const int cnt = static_cast<int>(end - start);
        float4 kv[4][kMaxDimsPerThread], vv[4][kMaxDimsPerThread];
        batch_load<KvT>(a, geo, start, end, g, cnt, lane, warp, d, d4, kv, vv);
        batch_compute<KvT>(q, qs, smem4, sc, kv, vv, cnt, tid, lane, warp, d, d4, m, l, acc);
    } else {
        pdl_begin();
        for (int j = tid; j < d; j += kThreads) qs[j] = q[j];
        __syncthreads();
    }
    for (int64_t ts = one_batch ? end : start; ts < end; ts += kTile) {
        const int cnt = static_cast<int>(min(static_cast<int64_t>(kTile), end - ts));
        tile_scores<KvT>(a, smem4, sc, ts, cnt, g, lane, warp, d, d4);
        __syncthreads();
        float new_m, corr, lsum;
        tile_softmax(sc, cnt, tid, m, new_m, corr, lsum, acc);
        tile_values<KvT>(a, sc, ts, cnt, g, lane, warp, d, d4, acc);
        l = l * corr + lsum;
        m = new_m;
        __syncthreads();
    }
    // the warps' partial outputs, summed through shared memory
    float4* red4 = reinterpret_cast<float4*>(red + warp * d);
#pragma unroll
    for (int i = 0; i < kMaxDimsPerThread; ++i) {
        const int c = lane_col<KvT>(lane, i);
        if (c < d4) red4[c] = acc[i];
    }
    __syncthreads();
    if constexpr (Cluster) {
        cluster_give(red, go, gml, sp, tid, d, m, l);
        if (sp != 0) return;
        cluster_wait_acquire();
        cluster_combine(a, go, gml, geo.active, h, t, tid, d, d4);
        return;
    }
    ticket_merge(a, geo, red, fs, scratch, last_piece, idx, sp, h, t, tid, d, m, l);
}

}  // namespace

void attention_pieces(const AttnArgs& a, int n, cudaStream_t s) {
    if (a.d % 4 != 0 || a.d > kThreads * kMaxDimsPerThread)
        throw Error("internal: attention head dim " + std::to_string(a.d) +
                    " unsupported (multiple of 4, <= 512)");
    if (a.nKV <= 0 || a.nH % a.nKV != 0) throw Error("internal: attention heads do not group evenly");
    if (a.kv != KvElem::kF32 && a.d % 8 != 0)
        throw Error("internal: attention over a bf16 or fp8 cache reads 8 values per load: head dim " +
                    std::to_string(a.d));
    if (a.tok_pos && (a.split_len <= 0 || a.merge_counters))
        throw Error("internal: batched attention takes fixed pieces (split_len > 0) and a separate merge");
    if (a.tok_pos) {
        if (a.mma && attention_mma_fits(a))
            attention_mma_pieces(a, n, s);
        else
            attention_warp_pieces(a, n, s);
        return;
    } else if (a.split_len == 0 && a.merge_counters) {
        if (a.cluster) {
            if (a.cluster != a.nsplit || a.nsplit > kMaxAttnCluster || n != 1)
                throw Error("internal: a cluster of " + std::to_string(a.cluster) + " for " +
                            std::to_string(a.nsplit) + " pieces at " + std::to_string(n) + " tokens");
            const size_t smem = cluster_smem(a.d, a.nsplit);
            if (smem > 48 * 1024) throw Error("internal: attention cluster scratch exceeds 48 KB");
            kv_dispatch(a.kv, [&](auto e) {
                launch_kernel_cluster(attn_decode_v2_kernel<true, decltype(e)>, dim3(a.nsplit, a.nH, n),
                                      dim3(kThreads), smem, s, a.cluster, a);
            });
        } else {
            const size_t smem = (static_cast<size_t>(1 + kWarpsAttn) * a.d + a.nsplit) * sizeof(float);
            if (smem > 48 * 1024) throw Error("internal: attention v2 scratch exceeds 48 KB");
            kv_dispatch(a.kv, [&](auto e) {
                launch_kernel(attn_decode_v2_kernel<false, decltype(e)>, dim3(a.nsplit, a.nH, n),
                              dim3(kThreads), smem, s, a);
            });
        }
    } else {
        throw Error(
            "internal: attention pieces are decode's (split_len 0, merge counters) or batched decode's");
    }
    CUDA_CHECK_LAUNCH();
}

bool attention_cluster_fits(int C, int nH, int d) {
    if (C < 1 || C > kMaxAttnCluster || d % 4 || d > kThreads * kMaxDimsPerThread) return false;
    int dev = 0, major = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    if (major < 9) return false;
    cudaLaunchAttribute attr[2];
    const cudaLaunchConfig_t cfg =
        launch_config(dim3(C, nH), dim3(kThreads), cluster_smem(d, C), nullptr, C, false, attr);
    bool fits = true;
    auto check = [&](auto kernel) {  // every cache type's instantiation
        if (C > 8)
            CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
        int clusters = 0;
        if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess) {
            cudaGetLastError();
            clusters = 0;
        }
        fits = fits && clusters > 0;
    };
    check(attn_decode_v2_kernel<true, float>);
    check(attn_decode_v2_kernel<true, uint16_t>);
    check(attn_decode_v2_kernel<true, uint8_t>);
    return fits;
}

void attention(const AttnArgs& a, int n, cudaStream_t s) {
    attention_pieces(a, n, s);
    if (!a.merge_counters) attention_combine(a, n, s);
}

}  // namespace markbase::cuda
