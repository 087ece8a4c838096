// Batched decode's attention pieces on the tensor cores (bf16 or e4m3 cache, head dim 64 * NQ, at most 8
// query heads per KV group): one warp per piece of a (token, KV group), all of the group's query heads at
// once, rounds of 16 keys through mma.sync m16n8k16.
//
// Why: the warp kernel (attention_warp.cu) scores and folds on the CUDA cores, each score reduced across the
// warp by shuffles; per key row read it issues ~100 instructions per head, so with 8 heads per KV group (the
// full layers of every variant, all of E2B's) it is bound by issue, not by the bytes (the 31B's 64-sequence
// step read its K/V at ~1.8 TB/s, E2B's at ~0.8). Here a round of 16 keys is ~6 instructions per key row.
//
// A round, for lane (r = lane / 4, c = lane % 4):
//   S[head][key] = Q K^T: A = the group's queries (rows r < G; rows 8..15 zero), staged once per block as
//     each lane's fragments, both bf16 halves (hi, lo) of the fp32 query so the products stay exact to fp32
//     (the cache rows are bf16 already). B = K^T: lane loads 16 contiguous bytes of key rows j0 + r and
//     j0 + 8 + r per 32 columns; the fragment's k = 2c, 2c + 1, 2c + 8, 2c + 9 of two k-steps are the row's
//     columns 8c .. 8c + 7 (the query fragments permuted alike), so no shuffle feeds the MMA.
//   The online softmax per head: lane holds head r's scores for keys 2c, 2c + 1 (+ 8), reduced over its quad.
//   O^T[dim][head] += V^T P^T: A = V^T, lane loads 16 contiguous bytes at columns 64 q + 8 r of key rows
//     2c, 2c + 1, 2c + 8, 2c + 9 and pairs them by byte permutes (the M index of tile j is column
//     64 q + 8 r + j, and + 4 for rows 8..15); B = P^T is the score fragment itself, in two bf16 halves.
// An e4m3 cache (Fp8): a lane loads 8 bytes where a bf16 row gives it 16, the same 8 columns, converted to
// f16 pairs (exact) in the bf16 fragments' places, and the MMAs take f16. The queries and the softmax weights
// are one f16 each, not two halves: f16 keeps 2^-11 of them against the 2^-4 an e4m3 key or value keeps of
// itself, and the score MMAs halve.
// The pieces merge as the warp kernel's do (attention_combine).
#include <cfloat>

#include "cuda/check.h"
#include "cuda/kernels/attention.cuh"
#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"
#include "cuda/kernels/kv_elems.cuh"
#include "cuda/kernels/launch.h"
#include "cuda/kernels/stream_mma.cuh"

namespace markbase::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxGroup = 8;  // query heads per KV group: the MMA's N

__device__ __forceinline__ uint32_t pack_bf16(float lo_elem, float hi_elem) {
    return static_cast<uint32_t>(float_to_bf16_bits(lo_elem)) |
           (static_cast<uint32_t>(float_to_bf16_bits(hi_elem)) << 16);
}
// Two fp32 values as their bf16 halves, packed: hi = bf16(v), lo = bf16(v - hi).
__device__ __forceinline__ void split_pack(float a, float b, uint32_t& hi, uint32_t& lo) {
    hi = pack_bf16(a, b);
    lo = pack_bf16(a - bf16_lo(hi), b - bf16_hi(hi));
}
__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
__device__ __forceinline__ uint32_t pack_f16(float lo_elem, float hi_elem) {
    return static_cast<uint32_t>(__half_as_ushort(__float2half_rn(lo_elem))) |
           (static_cast<uint32_t>(__half_as_ushort(__float2half_rn(hi_elem))) << 16);
}
// Two fp32 values as the MMA's operand words: bf16 halves (hi, lo) against a bf16 cache, one f16 (hi; lo 0)
// against an e4m3 cache.
template <bool Fp8>
__device__ __forceinline__ void operand_pack(float a, float b, uint32_t& hi, uint32_t& lo) {
    if constexpr (Fp8) {
        hi = pack_f16(a, b);
        lo = 0u;
    } else {
        split_pack(a, b, hi, lo);
    }
}
// 8 e4m3 values (byte i is value i) as four f16 pairs, value 2i in the low half of word i
__device__ __forceinline__ uint4 fp8x8_to_f16(uint2 w) {
    return make_uint4(fp8x2_to_f16x2(w.x & 0xffffu), fp8x2_to_f16x2(w.x >> 16), fp8x2_to_f16x2(w.y & 0xffffu),
                      fp8x2_to_f16x2(w.y >> 16));
}
// 8 consecutive cache values as four 16-bit pairs (value 2i in the low half of word i): a bf16 row's 16 bytes
// as loaded, an e4m3 row's 8 bytes as f16.
__device__ __forceinline__ uint4 load8(const uint16_t* p) {
    return __ldg(reinterpret_cast<const uint4*>(p));
}
__device__ __forceinline__ uint4 load8(const uint8_t* p) {
    return fp8x8_to_f16(__ldg(reinterpret_cast<const uint2*>(p)));
}
template <bool Fp8>
__device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                    uint32_t b0, uint32_t b1) {
    if constexpr (Fp8)
        mma_f16(c, a0, a1, a2, a3, b0, b1);
    else
        mma_bf16(c, a0, a1, a2, a3, b0, b1);
}

// Stage the query fragments of token t's group g: qf[(2 p + half) * 32 + lane] for chunk p of 32 columns
// (rows r >= G zero; Fp8: the lo half zero).
template <int NP, bool Fp8>
__device__ __forceinline__ void stage_queries(const AttnArgs& a, int t, int h0, int G, uint4* qf) {
    const float* q = a.q + (static_cast<int64_t>(t) * a.nH + h0) * (NP * 32);
    for (int j = threadIdx.x; j < NP * 32; j += kThreads) {
        const int p = j >> 5, ln = j & 31, r = ln >> 2, c = ln & 3;
        uint4 hi = make_uint4(0u, 0u, 0u, 0u), lo = hi;
        if (r < G) {
            const float4* src = reinterpret_cast<const float4*>(q + r * (NP * 32) + 32 * p + 8 * c);
            const float4 x0 = src[0], x1 = src[1];
            operand_pack<Fp8>(x0.x, x0.y, hi.x, lo.x);
            operand_pack<Fp8>(x0.z, x0.w, hi.y, lo.y);
            operand_pack<Fp8>(x1.x, x1.y, hi.z, lo.z);
            operand_pack<Fp8>(x1.z, x1.w, hi.w, lo.w);
        }
        qf[(2 * p) * 32 + ln] = hi;
        qf[(2 * p + 1) * 32 + ln] = lo;
    }
}

// S for the round's two tiles of 8 keys (s[u]: head r, keys 8u + 2c, 8u + 2c + 1 in [0], [1]; k0, k1: the
// lane's columns 8c.. of key rows r and 8 + r). Each tile sums four independent chains (the query's hi and lo
// halves, even and odd k-steps; Fp8: two, no lo half), so a round waits on NP MMAs in a row, not 4 NP.
template <int NP, bool Fp8, class KvT>
__device__ __forceinline__ void round_scores(const uint4* qf, const KvT* k0, const KvT* k1, int lane,
                                             float (&s)[2][4]) {
    float part[2][4][4];
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int k = 0; k < 4; ++k)
#pragma unroll
            for (int i = 0; i < 4; ++i) part[u][k][i] = 0.0f;
#pragma unroll
    for (int p = 0; p < NP; ++p) {
        const uint4 w[2] = {load8(k0 + 32 * p), load8(k1 + 32 * p)};
        const uint4 qh = qf[(2 * p) * 32 + lane];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            mma<Fp8>(part[u][0], qh.x, 0u, qh.y, 0u, w[u].x, w[u].y);
            mma<Fp8>(part[u][1], qh.z, 0u, qh.w, 0u, w[u].z, w[u].w);
        }
        if constexpr (!Fp8) {
            const uint4 ql = qf[(2 * p + 1) * 32 + lane];
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                mma<Fp8>(part[u][2], ql.x, 0u, ql.y, 0u, w[u].x, w[u].y);
                mma<Fp8>(part[u][3], ql.z, 0u, ql.w, 0u, w[u].z, w[u].w);
            }
        }
    }
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int i = 0; i < 4; ++i)
            s[u][i] = (part[u][0][i] + part[u][1][i]) + (part[u][2][i] + part[u][3][i]);
}

// A round's value rows as the lane reads them (v[0..3]: keys 2c, 2c + 1, 2c + 8, 2c + 9 at the lane's
// columns 8r.., chunk q 64 columns on): an e4m3 cache's loaded at once, before the round's scores, so the
// round waits on memory once, not twice (8 bytes a row and chunk: 2 NQ registers a row); a bf16 cache's
// where round_values uses them (16 bytes each, too many registers to hold beside the scores).
template <int NQ, class KvT>
struct RoundValues;
template <int NQ>
struct RoundValues<NQ, uint16_t> {
    const uint16_t* v[4];
    __device__ __forceinline__ void take(const uint16_t* const (&rows)[4]) {
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = rows[i];
    }
    __device__ __forceinline__ uint4 get(int i, int q) const {
        return load8(v[i] + 64 * q);
    }
};
template <int NQ>
struct RoundValues<NQ, uint8_t> {
    uint2 raw[4][NQ];
    __device__ __forceinline__ void take(const uint8_t* const (&rows)[4]) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int q = 0; q < NQ; ++q) raw[i][q] = __ldg(reinterpret_cast<const uint2*>(rows[i] + 64 * q));
    }
    __device__ __forceinline__ uint4 get(int i, int q) const {
        return fp8x8_to_f16(raw[i][q]);
    }
};

// acc[q][j] += V^T P^T for the round's 4 value rows, after scaling head 2c's column by ca and 2c + 1's by cb.
template <int NQ, bool Fp8, class KvT>
__device__ __forceinline__ void round_values(const RoundValues<NQ, KvT>& v, uint32_t ph0, uint32_t ph1,
                                             uint32_t pl0, uint32_t pl1, float ca, float cb,
                                             float (&acc)[NQ][4][4]) {
#pragma unroll
    for (int q = 0; q < NQ; ++q) {
        const uint4 v0 = v.get(0, q), v1 = v.get(1, q), v2 = v.get(2, q), v3 = v.get(3, q);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const unsigned sel = (j & 1) ? 0x7632u : 0x5410u;
            const uint32_t a0 = __byte_perm(word(v0, j >> 1), word(v1, j >> 1), sel);
            const uint32_t a1 = __byte_perm(word(v0, 2 + (j >> 1)), word(v1, 2 + (j >> 1)), sel);
            const uint32_t a2 = __byte_perm(word(v2, j >> 1), word(v3, j >> 1), sel);
            const uint32_t a3 = __byte_perm(word(v2, 2 + (j >> 1)), word(v3, 2 + (j >> 1)), sel);
            float(&y)[4] = acc[q][j];
            y[0] *= ca;
            y[1] *= cb;
            y[2] *= ca;
            y[3] *= cb;
            mma<Fp8>(y, a0, a1, a2, a3, ph0, ph1);
            if constexpr (!Fp8) mma<Fp8>(y, a0, a1, a2, a3, pl0, pl1);
        }
    }
}

// Head h's partial output (columns q0 + 64 q + 8 r .. + 7: tile j's rows r and r + 8) and, from the warp
// holding columns from 0, its (m, l).
template <int NQ>
__device__ __forceinline__ void store_piece(const AttnArgs& a, const float (&acc)[NQ][4][4], float m, float l,
                                            int t, int h0, int G, int sp, bool any, int lane, int d, int q0) {
    const int r = lane >> 2, c = lane & 3;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        const int h = 2 * c + e;
        if (!any || h >= G) continue;
        const int64_t idx = (static_cast<int64_t>(t) * a.nH + h0 + h) * a.nsplit + sp;
        float4* po = reinterpret_cast<float4*>(a.part_o + idx * d + q0);
#pragma unroll
        for (int q = 0; q < NQ; ++q) {
            po[16 * q + 2 * r] = make_float4(acc[q][0][e], acc[q][1][e], acc[q][2][e], acc[q][3][e]);
            po[16 * q + 2 * r + 1] =
                make_float4(acc[q][0][2 + e], acc[q][1][2 + e], acc[q][2][2 + e], acc[q][3][2 + e]);
        }
    }
    if (q0 == 0 && c == 0 && r < G) {
        const int64_t idx = (static_cast<int64_t>(t) * a.nH + h0 + r) * a.nsplit + sp;
        a.part_ml[2 * idx] = m;
        a.part_ml[2 * idx + 1] = l;
    }
}

// NQ: the head dim's chunks of 64 columns; NS: warps per piece, each holding NQ / NS chunks of the output
// (the 512-column rows: 128 accumulators per lane for all of them would spill).
template <int NQ, int NS, class KvT>
__global__ void __launch_bounds__(kThreads) attn_mma_kernel(const AttnArgs a) {
    constexpr int D = 64 * NQ, NP = 2 * NQ, NQW = NQ / NS;
    constexpr bool Fp8 = sizeof(KvT) == 1;
    extern __shared__ uint4 qf[];  // [NP][2][32]: each lane's query fragments per 32 columns, hi then lo
    pdl_begin();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int t = blockIdx.z, g = blockIdx.y, G = a.nH / a.nKV, h0 = g * G;
    stage_queries<NP, Fp8>(a, t, h0, G, qf);
    __syncthreads();
    const int sp = blockIdx.x * (kWarps / NS) + warp / NS, q0 = (warp % NS) * NQW * 64;
    if (sp >= a.nsplit) return;

    const attn_kernels::BatchPiece piece = attn_kernels::batch_piece(a, t, sp);
    const int64_t start = piece.start, end = piece.end;
    const int slot = piece.slot;
    const KvT* kc = static_cast<const KvT*>(a.k_cache) + static_cast<int64_t>(g) * D;
    const KvT* vc = static_cast<const KvT*>(a.v_cache) + static_cast<int64_t>(g) * D + q0;
    const int64_t row_stride = static_cast<int64_t>(a.nKV) * D;
    const int r = lane >> 2, c = lane & 3;
    auto row = [&](int64_t j) { return kv_row(a, slot, min(j, end - 1)) * row_stride; };

    float acc[NQW][4][4];
#pragma unroll
    for (int q = 0; q < NQW; ++q)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[q][j][i] = 0.0f;
    float m = -FLT_MAX, l = 0.0f;  // head r's, the same in each lane of its quad
    auto take_values = [&](int64_t j0, RoundValues<NQW, KvT>& v) {
        const KvT* const rows[4] = {vc + row(j0 + 2 * c) + 8 * r, vc + row(j0 + 2 * c + 1) + 8 * r,
                                    vc + row(j0 + 2 * c + 8) + 8 * r, vc + row(j0 + 2 * c + 9) + 8 * r};
        v.take(rows);
    };
    for (int64_t j0 = start; j0 < end; j0 += 16) {
        RoundValues<NQW, KvT> v;
        if constexpr (Fp8) take_values(j0, v);  // with the keys
        float s[2][4];
        round_scores<NP, Fp8>(qf, kc + row(j0 + r) + 8 * c, kc + row(j0 + 8 + r) + 8 * c, lane, s);
        // head r's scores of keys j0 + 2c, 2c + 1, 8 + 2c, 9 + 2c; those at or past `end` weigh 0
        const float sv[4] = {s[0][0], s[0][1], s[1][0], s[1][1]};
        const int kk[4] = {2 * c, 2 * c + 1, 8 + 2 * c, 9 + 2 * c};
        float mn = m;
#pragma unroll
        for (int u = 0; u < 4; ++u)
            if (j0 + kk[u] < end) mn = fmaxf(mn, sv[u]);
        mn = fmaxf(mn, __shfl_xor_sync(0xffffffffu, mn, 1));
        mn = fmaxf(mn, __shfl_xor_sync(0xffffffffu, mn, 2));
        const float corr = __expf(m - mn);
        float p[4], ps = 0.0f;
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            p[u] = j0 + kk[u] < end ? expf(sv[u] - mn) : 0.0f;
            ps += p[u];
        }
        ps += __shfl_xor_sync(0xffffffffu, ps, 1);
        ps += __shfl_xor_sync(0xffffffffu, ps, 2);
        l = fmaf(l, corr, ps);
        m = mn;
        uint32_t ph0, pl0, ph1, pl1;
        operand_pack<Fp8>(p[0], p[1], ph0, pl0);
        operand_pack<Fp8>(p[2], p[3], ph1, pl1);
        // the accumulator's columns are heads 2c and 2c + 1: their quads' corrections
        const float ca = __shfl_sync(0xffffffffu, corr, 8 * c),
                    cb = __shfl_sync(0xffffffffu, corr, 8 * c + 4);
        if constexpr (!Fp8) take_values(j0, v);
        round_values<NQW, Fp8>(v, ph0, ph1, pl0, pl1, ca, cb, acc);
    }
    store_piece<NQW>(a, acc, m, l, t, h0, G, sp, start < end, lane, D, q0);
}

template <int NQ, int NS = 1>
void launch_mma(const AttnArgs& a, int n, cudaStream_t s) {
    const size_t smem = static_cast<size_t>(NQ) * 4 * 32 * sizeof(uint4);
    constexpr int kPieces = kWarps / NS;  // per block
    const dim3 grid((a.nsplit + kPieces - 1) / kPieces, a.nKV, n);
    if (a.kv == KvElem::kFp8)
        launch_kernel(attn_mma_kernel<NQ, NS, uint8_t>, grid, dim3(kThreads), smem, s, a);
    else
        launch_kernel(attn_mma_kernel<NQ, NS, uint16_t>, grid, dim3(kThreads), smem, s, a);
}

}  // namespace

bool attention_mma_fits(const AttnArgs& a) {
    return (a.kv == KvElem::kBf16 || a.kv == KvElem::kFp8) && a.nKV > 0 && a.nH % a.nKV == 0 &&
           a.nH / a.nKV <= kMaxGroup && (a.d == 64 || a.d == 128 || a.d == 256 || a.d == 512);
}

void attention_mma_pieces(const AttnArgs& a, int n, cudaStream_t s) {
    if (!a.tok_pos || a.split_len <= 0 || a.merge_counters || !attention_mma_fits(a))
        throw Error(
            "internal: tensor-core attention takes batched decode's fixed pieces over a bf16 or fp8 cache, "
            "at most 8 query heads per KV head and a head dim of 64, 128, 256 or 512 (d = " +
            std::to_string(a.d) + ")");
    switch (a.d) {
        case 64:
            launch_mma<1>(a, n, s);
            break;
        case 128:
            launch_mma<2>(a, n, s);
            break;
        case 256:
            launch_mma<4>(a, n, s);
            break;
        default:
            launch_mma<8, 2>(a, n, s);
            break;
    }
    CUDA_CHECK_LAUNCH();
}

}  // namespace markbase::cuda
