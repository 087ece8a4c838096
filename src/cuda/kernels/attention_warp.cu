// Batched decode's attention pieces (AttnArgs.tok_pos: query t at its own position in its own sequence slot's
// cache; fixed pieces of split_len keys, merged by attention_combine): one warp per piece, R query heads of a
// KV group per warp, everything in registers.
//
// Why warps: a batched step has one query per sequence, so a piece is short (Tuning::batch_attn_keys, 32
// keys) and the work per key is a few dot products over a row that is read once. The block-per-piece kernels
// it replaces (a block of 4 warps scoring a tile into shared memory, a block-wide softmax between barriers,
// then every value row walked key by key by all 128 threads) spent the piece waiting on barriers and on one
// key's loads at a time: the 26B-A4B's 64 sequences at ~900 positions read their 26.3 GB of fp32 K/V per
// step at ~1.5 TB/s (17.3 of 37.0 ms). Here each warp keeps its own online softmax: per round it requests
// KU keys' K and V rows together (lane c owns 4-value columns c, c + 32, ...; bf16 or fp32 rows), scores them
// against the R queries (staged once per block in shared memory), reduces each score across the warp with
// shuffles, and folds the KU values into its R accumulators. No barrier after the staging; the 4 warps of a
// block are 4 independent pieces of the same (token, heads).
#include <cfloat>

#include "cuda/check.h"
#include "cuda/kernels/attention.cuh"
#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"
#include "cuda/kernels/kv_elems.cuh"
#include "cuda/kernels/launch.h"

namespace markbase::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

// NV: float4 columns per lane (head dim <= 128 NV); R: query heads per warp (R NV <= 16 keeps the
// accumulators at 64 registers); KU: keys per round, their K and V rows (8 loads per lane each) in flight
// together.
// The R x KU scores of a round: each lane's columns against the staged queries, summed across the warp.
template <int NV, int R, int KU, class Vec>
__device__ __forceinline__ void warp_scores(const float4* qs4, const Vec (&kvr)[KU][NV], int lane, int d4,
                                            float (&s)[R][KU]) {
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int u = 0; u < KU; ++u) {
            float x = 0.0f;
#pragma unroll
            for (int i = 0; i < NV; ++i) {
                const int c = lane + 32 * i;
                const float4 qv = c < d4 ? qs4[r * d4 + c] : zero;
                const float4 kv = as_float4(kvr[u][i]);
                x = fmaf(kv.x, qv.x, x);
                x = fmaf(kv.y, qv.y, x);
                x = fmaf(kv.z, qv.z, x);
                x = fmaf(kv.w, qv.w, x);
            }
            s[r][u] = x;
        }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int u = 0; u < KU; ++u) s[r][u] += __shfl_xor_sync(0xffffffffu, s[r][u], o);
}

// The online softmax over a round's KU keys (those at or past `end` weigh 0) and their values into acc.
template <int NV, int R, int KU, class Vec>
__device__ __forceinline__ void warp_fold(const float (&s)[R][KU], const Vec (&vvr)[KU][NV], int64_t j0,
                                          int64_t end, float (&m)[R], float (&l)[R], float4 (&acc)[R][NV]) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
        float mn = m[r];
#pragma unroll
        for (int u = 0; u < KU; ++u)
            if (j0 + u < end) mn = fmaxf(mn, s[r][u]);
        const float corr = __expf(m[r] - mn);
        float p[KU], ps = 0.0f;
#pragma unroll
        for (int u = 0; u < KU; ++u) {
            p[u] = j0 + u < end ? expf(s[r][u] - mn) : 0.0f;
            ps += p[u];
        }
        l[r] = fmaf(l[r], corr, ps);
        m[r] = mn;
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            float4 y = acc[r][i];
            y.x *= corr;
            y.y *= corr;
            y.z *= corr;
            y.w *= corr;
#pragma unroll
            for (int u = 0; u < KU; ++u) {
                const float4 vv = as_float4(vvr[u][i]);
                y.x = fmaf(p[u], vv.x, y.x);
                y.y = fmaf(p[u], vv.y, y.y);
                y.z = fmaf(p[u], vv.z, y.z);
                y.w = fmaf(p[u], vv.w, y.w);
            }
            acc[r][i] = y;
        }
    }
}

// Row r of the piece: part_o[(t nH + h0 + r) nsplit + sp]; an empty piece writes l = 0 (the merge skips it).
template <int NV, int R>
__device__ __forceinline__ void warp_store(const AttnArgs& a, const float (&m)[R], const float (&l)[R],
                                           const float4 (&acc)[R][NV], int t, int h0, int sp, bool any,
                                           int lane, int d) {
    const int d4 = d / 4;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int64_t idx = (static_cast<int64_t>(t) * a.nH + h0 + r) * a.nsplit + sp;
        if (any) {
            float4* po = reinterpret_cast<float4*>(a.part_o + idx * d);
#pragma unroll
            for (int i = 0; i < NV; ++i)
                if (lane + 32 * i < d4) po[lane + 32 * i] = acc[r][i];
        }
        if (lane == 0) {
            a.part_ml[2 * idx] = m[r];
            a.part_ml[2 * idx + 1] = l[r];
        }
    }
}

template <int NV, int R, class KvT>
__global__ void __launch_bounds__(kThreads) attn_warp_kernel(const AttnArgs a) {
    constexpr int KU = 8 / NV;
    extern __shared__ float4 qs4[];  // [R][d / 4]: the block's R query rows
    pdl_begin();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int t = blockIdx.z, h0 = blockIdx.y * R, g = h0 / (a.nH / a.nKV);
    const int d = a.d, d4 = d / 4;
    const float4* q4 = reinterpret_cast<const float4*>(a.q + (static_cast<int64_t>(t) * a.nH + h0) * d);
    for (int j = threadIdx.x; j < R * d4; j += kThreads) qs4[j] = q4[j];  // a token's heads are contiguous
    __syncthreads();
    const int sp = blockIdx.x * kWarps + warp;
    if (sp >= a.nsplit) return;

    const attn_kernels::BatchPiece piece = attn_kernels::batch_piece(a, t, sp);
    const int64_t start = piece.start, end = piece.end;
    const int slot = piece.slot;
    const KvT* kc = static_cast<const KvT*>(a.k_cache) + static_cast<int64_t>(g) * d;
    const KvT* vc = static_cast<const KvT*>(a.v_cache) + static_cast<int64_t>(g) * d;
    const int64_t row_stride = static_cast<int64_t>(a.nKV) * d;

    float m[R], l[R];
    float4 acc[R][NV];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        m[r] = -FLT_MAX;
        l[r] = 0.0f;
#pragma unroll
        for (int i = 0; i < NV; ++i) acc[r][i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    using Vec = typename KvVec<KvT>::type;
    const Vec zero{};
    for (int64_t j0 = start; j0 < end; j0 += KU) {
        Vec kv[KU][NV], vv[KU][NV];
#pragma unroll
        for (int u = 0; u < KU; ++u) {
            // past the end: a repeat of the last row, weight 0
            const int64_t row = kv_row(a, slot, min(j0 + u, end - 1)) * row_stride;
            const KvT *kp = kc + row, *vp = vc + row;
#pragma unroll
            for (int i = 0; i < NV; ++i) {
                const int c = lane + 32 * i;
                kv[u][i] = c < d4 ? kv_raw4(kp, c) : zero;
                vv[u][i] = c < d4 ? kv_raw4(vp, c) : zero;
            }
        }
        float s[R][KU];
        warp_scores<NV, R, KU, Vec>(qs4, kv, lane, d4, s);
        warp_fold<NV, R, KU, Vec>(s, vv, j0, end, m, l, acc);
    }
    warp_store<NV, R>(a, m, l, acc, t, h0, sp, start < end, lane, d);
}

template <int NV, int R>
void launch_warp(const AttnArgs& a, int n, cudaStream_t s) {
    const size_t smem = static_cast<size_t>(R) * a.d * sizeof(float);
    kv_dispatch(a.kv, [&](auto e) {
        launch_kernel(attn_warp_kernel<NV, R, decltype(e)>,
                      dim3((a.nsplit + kWarps - 1) / kWarps, a.nH / R, n), dim3(kThreads), smem, s, a);
    });
}

// R: the most heads of a group (G = nH / nKV) that divide it and fit R NV <= 16, at most AttnArgs.max_heads;
// automatic (max_heads 0): halved while the step has fewer than kFillWarps warps per SM, since a K/V row
// read for fewer heads is read again by the group's other warps, mostly from L2, while too few warps leave
// HBM idle (E2B's one KV head at 8 sequences: 64 warps with all 8 heads in one).
constexpr int kFillWarps = 16;

template <int NV>
void launch_heads(const AttnArgs& a, int n, cudaStream_t s) {
    constexpr int kMaxR = 16 / NV < 8 ? 16 / NV : 8;
    const int G = a.nH / a.nKV;
    int R = 1;
    while (R * 2 <= kMaxR && (a.max_heads == 0 || R * 2 <= a.max_heads) && G % (R * 2) == 0) R *= 2;
    if (a.max_heads == 0)
        while (R > 1 && int64_t{a.nsplit} * (a.nH / R) * n < int64_t{kFillWarps} * device_sms()) R /= 2;
    switch (R) {
        case 8:
            if constexpr (kMaxR >= 8) return launch_warp<NV, 8>(a, n, s);
            break;
        case 4:
            if constexpr (kMaxR >= 4) return launch_warp<NV, 4>(a, n, s);
            break;
        case 2:
            return launch_warp<NV, 2>(a, n, s);
        default:
            return launch_warp<NV, 1>(a, n, s);
    }
    throw Error("internal: no warp attention kernel for " + std::to_string(R) + " heads");
}

}  // namespace

void attention_warp_pieces(const AttnArgs& a, int n, cudaStream_t s) {
    if (!a.tok_pos || a.split_len <= 0 || a.merge_counters || a.nKV <= 0 || a.nH % a.nKV || a.d % 4 ||
        a.d > 512)
        throw Error(
            "internal: warp attention takes batched decode's fixed pieces, whole KV groups and a head "
            "dim that is a multiple of 4, at most 512 (d = " +
            std::to_string(a.d) + ")");
    const int d4 = a.d / 4;
    if (d4 <= 32)
        launch_heads<1>(a, n, s);
    else if (d4 <= 64)
        launch_heads<2>(a, n, s);
    else
        launch_heads<4>(a, n, s);
    CUDA_CHECK_LAUNCH();
}

}  // namespace markbase::cuda
