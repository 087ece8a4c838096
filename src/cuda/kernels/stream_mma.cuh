// The weight-streaming MMA loop that stream_gemm.cu (the projections of a few tokens) and moe_stream.cu (a
// batched step's experts, bf16 or FP8 rows) share: 4 warps split a block's K range; each round a warp loads G
// chunks of 32 k of MT tiles of 16 weight rows (16 contiguous bytes per lane: quad q of row g holds k = q*8
// .. q*8+7) and hands them to mma.sync m16n8k16 against NT tiles of 8 tokens, both bf16 halves (hi, lo) of
// each fp32 input. The k order inside a chunk is permuted identically for the weights and the tokens (the
// fragment's k = 2q, 2q+1, 2q+8, 2q+9 are physical q*8 + 4j + 0..3), so the 16-byte loads feed the fragments
// with no shuffle. One bf16 operand (gemm_inputs=bf16): chunk_mma_one. FP8 rows: chunk_mma_fp8. int4 rows:
// chunk_mma_int4.
#pragma once

#include <cstdint>

#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/quant_operands.cuh"

namespace markbase::cuda::stream_mma {

constexpr int kWarps = 4;

// What the tokens are: both bf16 halves of the fp32 input (hi, lo), the one bf16 rounding of it (hi), or one
// f16 operand against FP8 or int4 rows.
enum class Tokens { kHalves, kBf16, kFp8, kInt4 };

// int4 rows: where the lane's rows keep their groups' scales and zero points, a group of 128 k a chunk.
using quant::Int4Rows;

// The tokens: the previous kernel's output, read after the PDL wait with plain loads.
__device__ __forceinline__ uint4 ld_x(const uint4* p, bool ok) {
    return ok ? *p : make_uint4(0u, 0u, 0u, 0u);
}

// One chunk of 32 k: the weights w[mt][h] (rows g + 8h of tile mt) against the NT token tiles.
template <int MT, int NT>
__device__ __forceinline__ void chunk_mma(float (&acc)[MT][NT][4], const uint4 (&w)[MT][2],
                                          const uint4* const (&xh)[NT], const uint4* const (&xl)[NT],
                                          const bool (&ok)[NT], int c) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const uint4 h = ld_x(xh[nt] + c * 4, ok[nt]), l = ld_x(xl[nt] + c * 4, ok[nt]);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            mma_bf16(acc[mt][nt], w[mt][0].x, w[mt][1].x, w[mt][0].y, w[mt][1].y, h.x, h.y);
            mma_bf16(acc[mt][nt], w[mt][0].x, w[mt][1].x, w[mt][0].y, w[mt][1].y, l.x, l.y);
            mma_bf16(acc[mt][nt], w[mt][0].z, w[mt][1].z, w[mt][0].w, w[mt][1].w, h.z, h.w);
            mma_bf16(acc[mt][nt], w[mt][0].z, w[mt][1].z, w[mt][0].w, w[mt][1].w, l.z, l.w);
        }
    }
}

// The same chunk against one bf16 operand: half the MMAs.
template <int MT, int NT>
__device__ __forceinline__ void chunk_mma_one(float (&acc)[MT][NT][4], const uint4 (&w)[MT][2],
                                              const uint4* const (&x)[NT], const bool (&ok)[NT], int c) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const uint4 h = ld_x(x[nt] + c * 4, ok[nt]);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            mma_bf16(acc[mt][nt], w[mt][0].x, w[mt][1].x, w[mt][0].y, w[mt][1].y, h.x, h.y);
            mma_bf16(acc[mt][nt], w[mt][0].z, w[mt][1].z, w[mt][0].w, w[mt][1].w, h.z, h.w);
        }
    }
}

// FP8 rows (e4m3): a lane's 16 bytes are k = q*16 .. q*16 + 15 of its row, so a chunk is 64 k. Word j of
// them (k q*16 + 4j .. + 3) is MMA j's A: its low byte pair (k 4j, 4j + 1 -> the fragment's k 2q, 2q + 1)
// and its high pair (the fragment's 2q + 8, 2q + 9), converted to f16 once per chunk and used by every
// token tile. The tokens are f16(x / 16) (store_f16_sixteenth), one operand, not two halves: a lane's 16
// values are two 16-byte loads, words 2j and 2j + 1 the B of MMA j. The sums are 1/16 of the products,
// unscaled by the rows' scales.
template <int MT, int NT>
__device__ __forceinline__ void chunk_mma_fp8(float (&acc)[MT][NT][4], const uint4 (&w)[MT][2],
                                              const uint4* const (&x)[NT], const bool (&ok)[NT], int c) {
    uint32_t a[MT][4][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        const uint32_t r0[4] = {w[mt][0].x, w[mt][0].y, w[mt][0].z, w[mt][0].w};
        const uint32_t r1[4] = {w[mt][1].x, w[mt][1].y, w[mt][1].z, w[mt][1].w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            a[mt][j][0] = fp8x2_to_f16x2(r0[j] & 0xffffu);
            a[mt][j][1] = fp8x2_to_f16x2(r1[j] & 0xffffu);
            a[mt][j][2] = fp8x2_to_f16x2(r0[j] >> 16);
            a[mt][j][3] = fp8x2_to_f16x2(r1[j] >> 16);
        }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const uint4 x0 = ld_x(x[nt] + c * 8, ok[nt]), x1 = ld_x(x[nt] + c * 8 + 1, ok[nt]);
        const uint32_t b[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const uint32_t(&f)[4] = a[mt][j];
                mma_f16(acc[mt][nt], f[0], f[1], f[2], f[3], b[2 * j], b[2 * j + 1]);
            }
    }
}

// int4 rows (nibbles, k even in the low one): a lane's 16 bytes are k = q*32 .. q*32 + 31 of its row, so a
// chunk is 128 k, one group: the sums of a chunk start from zero and enter acc times the rows' group scales.
// Word i of the lane's bytes (k q*32 + 8i .. + 7) is two MMAs: int4_word_to_f16 gives its nibbles less the
// zero point as the f16 pairs (0, 4), (1, 5), (2, 6), (3, 7); pairs (0, 4) and (1, 5) are MMA 2i's A (k 2q,
// 2q + 1 and 2q + 8, 2q + 9 of the fragment), (2, 6) and (3, 7) MMA 2i + 1's. The tokens are f16(x / 16) in
// natural order, a 16-byte load a word (8 values), paired to match by byte permutes. The last chunk of a K
// that is not a multiple of 128 holds fewer lanes (lane_ok: their weights and tokens zero).
template <int MT, int NT>
__device__ __forceinline__ void chunk_mma_int4(float (&acc)[MT][NT][4], const uint4 (&w)[MT][2],
                                               const uint4* const (&x)[NT], const bool (&ok)[NT], int c,
                                               bool lane_ok, const Int4Rows<MT>& rows) {
    float sc[MT][2];
    uint32_t zz[MT][2], zh[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            sc[mt][h] = __ldg(rows.scale[mt][h] + c);
            const uint32_t z = rows.zero[mt][h] ? __ldg(rows.zero[mt][h] + c) : 8u;
            zz[mt][h] = quant::int4_zz(z);
            zh[mt][h] = quant::int4_zh(z);
        }
    float d[MT][NT][4] = {};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        uint32_t a[MT][2][4];  // [mt][h]: the word's four f16 pairs of row g + 8 h
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const uint4& v = w[mt][h];
                const uint32_t word = i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
                quant::int4_word_to_f16(word, zz[mt][h], zh[mt][h], a[mt][h]);
            }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const uint4 xv = ld_x(x[nt] + c * 16 + i, ok[nt] && lane_ok);
            const uint32_t b04 = __byte_perm(xv.x, xv.z, 0x5410), b15 = __byte_perm(xv.x, xv.z, 0x7632);
            const uint32_t b26 = __byte_perm(xv.y, xv.w, 0x5410), b37 = __byte_perm(xv.y, xv.w, 0x7632);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                mma_f16(d[mt][nt], a[mt][0][0], a[mt][1][0], a[mt][0][1], a[mt][1][1], b04, b15);
                mma_f16(d[mt][nt], a[mt][0][2], a[mt][1][2], a[mt][0][3], a[mt][1][3], b26, b37);
            }
        }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            acc[mt][nt][0] = fmaf(d[mt][nt][0], sc[mt][0], acc[mt][nt][0]);
            acc[mt][nt][1] = fmaf(d[mt][nt][1], sc[mt][0], acc[mt][nt][1]);
            acc[mt][nt][2] = fmaf(d[mt][nt][2], sc[mt][1], acc[mt][nt][2]);
            acc[mt][nt][3] = fmaf(d[mt][nt][3], sc[mt][1], acc[mt][nt][3]);
        }
}

// A warp's round: chunks c0 .. c0 + G - 1 of rows g and g + 8 of each tile (zeros past c_end, and past
// units, the 16-byte units a row holds, where the last chunk is ragged: int4 rows of K % 128 != 0).
template <int G, int MT>
__device__ __forceinline__ void load_round(uint4 (&w)[G][MT][2], const uint4* const (&wr)[MT][2], int c0,
                                           int c_end, int units = 0) {
    const int q = threadIdx.x & 3;
#pragma unroll
    for (int u = 0; u < G; ++u)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const bool in = c0 + u < c_end && (units == 0 || (c0 + u) * 4 + q < units);
                w[u][mt][h] = in ? ld_stream(wr[mt][h] + (c0 + u) * 4) : make_uint4(0, 0, 0, 0);
            }
}

// Output element i of a block's [MT][NT][4][32] fragments (after the sums): its row within the block's rows
// and its token.
__device__ __forceinline__ void fragment_at(int i, int NT, int& row, int& tok) {
    const int lane = i & 31, e = (i >> 5) & 3, nt = (i >> 7) % NT, mt = (i >> 7) / NT;
    row = mt * 16 + (lane >> 2) + (e >= 2 ? 8 : 0);
    tok = nt * 8 + 2 * (lane & 3) + (e & 1);
}

// A warp's whole K range [c0, c_end) in rounds of G chunks (c0 advancing by Step: kWarps G where a block's
// warps split the K range, G where each warp takes all of it), into acc (zeroed here), software-pipelined:
// the next round's weights are in flight while this round's MMAs run. pdl_after: nonzero, the PDL wait comes
// after the first round's loads (weights do not depend on the previous kernel, so they stream during its
// tail: pdl_begin_after_loads); 0, the caller has waited. T: the tokens (chunk_mma, chunk_mma_one,
// chunk_mma_fp8 against e4m3 rows in chunks of 64 k, or chunk_mma_int4 against int4 rows in chunks of 128 k,
// with `int4`'s scales and zero points and `units`, the 16-byte units of a row); xl is read only for kHalves.
template <int G, int MT, int NT, Tokens T = Tokens::kHalves, int Step = kWarps* G>
__device__ __forceinline__ void stream_rounds(float (&acc)[MT][NT][4], const uint4* const (&wr)[MT][2],
                                              const uint4* const (&xh)[NT], const uint4* const (&xl)[NT],
                                              const bool (&ok)[NT], int c0, int c_end, int pdl_after,
                                              const Int4Rows<MT>& int4 = {}, int units = 0) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
            acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;
    constexpr int step = Step;
    uint4 w[G][MT][2];
    load_round<G, MT>(w, wr, c0, c_end, units);
    pdl_begin_after_loads(pdl_after);
    for (; c0 < c_end; c0 += step) {
        uint4 nw[G][MT][2];
        load_round<G, MT>(nw, wr, c0 + step, c_end, units);
#pragma unroll
        for (int u = 0; u < G; ++u)
            if (c0 + u < c_end) {
                if constexpr (T == Tokens::kInt4)
                    chunk_mma_int4<MT, NT>(acc, w[u], xh, ok, c0 + u,
                                           units == 0 || (c0 + u) * 4 + (threadIdx.x & 3) < units, int4);
                else if constexpr (T == Tokens::kFp8)
                    chunk_mma_fp8<MT, NT>(acc, w[u], xh, ok, c0 + u);
                else if constexpr (T == Tokens::kBf16)
                    chunk_mma_one<MT, NT>(acc, w[u], xh, ok, c0 + u);
                else
                    chunk_mma<MT, NT>(acc, w[u], xh, xl, ok, c0 + u);
            }
#pragma unroll
        for (int u = 0; u < G; ++u)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) w[u][mt][0] = nw[u][mt][0], w[u][mt][1] = nw[u][mt][1];
    }
}

// The block's warps' accumulators summed in shared memory, in warp order: red[0 .. MT NT 128) holds the
// sums on return (red: kWarps x that many floats). The caller syncs before reading another thread's sums.
template <int MT, int NT>
__device__ __forceinline__ void sum_warps(const float (&acc)[MT][NT][4], float* red) {
    constexpr int E = MT * NT * 4 * 32;  // a warp's accumulators
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float* mine = red + warp * E;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) mine[((mt * NT + nt) * 4 + e) * 32 + lane] = acc[mt][nt][e];
    __syncthreads();
    for (int i = threadIdx.x; i < E; i += blockDim.x) {
        float v = red[i];
#pragma unroll
        for (int w = 1; w < kWarps; ++w) v += red[w * E + i];
        red[i] = v;
    }
}

}  // namespace markbase::cuda::stream_mma
