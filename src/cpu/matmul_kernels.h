// The CPU matmul kernels, written once as templates over a vector backend and compiled once per instruction
// set: the scalar backend in matmul.cpp, AVX2 in matmul_avx2.cpp and AVX-512 in matmul_avx512.cpp, each TU
// with its own -m flags (CMakeLists.txt). Each TU exports a MatmulKernels table; matmul.cpp picks one at run
// time (the best one this CPU runs) and splits the work over the thread pool.
//
// Everything here but the table type has internal linkage (an anonymous namespace). The same template
// instantiated in TUs compiled for different instruction sets would otherwise be one symbol, and the linker
// would keep one of the copies (perhaps AVX-512 code) for every path. For the same reason the kernels
// instantiate no out-of-line standard library template (no containers, not even std::min): the scratch panel
// of rows_blocked is passed in by matmul.cpp.
#pragma once

#include <cstdint>
#include <type_traits>

#include "model/bf16.h"

namespace markbase::cpu {

// Rows [r0, r1) of y = x w^T (see matmul.h for the layouts). The direct kernels take x [n][in]; the blocked
// ones take it transposed tile by tile of outer_tokens tokens, x^T [tile][in][outer_tokens], the last tile's
// padding zero (matmul.cpp transposes it once, for every thread). panel: fp32 scratch of
// MatmulKernels::panel_floats for the blocked kernels, unused (may be null) by the direct ones.
template <class WT>
using RowsKernel = void (*)(const float* x, int64_t n, int64_t in, const WT* w, int64_t out, float* y,
                            int64_t r0, int64_t r1, float* panel);

struct MatmulKernels {
    const char* name;      // "scalar", "avx2" or "avx512": a literal of the TU that compiled the kernels
    int64_t tile_rows;     // rows of a direct tile: the threads are given whole tiles
    int64_t outer_rows;    // rows of a blocked (outer-product) tile: the threads are given whole ones
    int64_t outer_tokens;  // tokens of a blocked tile: x^T's rows are zero-padded to a multiple of it
    int64_t panel_floats;  // the per-thread scratch the blocked kernels need
    RowsKernel<bf16> direct_bf16, blocked_bf16;
    RowsKernel<float> direct_f32, blocked_f32;
    void (*attn_scores)(const float* q, int64_t ldq, int m, const float* const* k, int nk, int64_t d,
                        float* s, int64_t lds);
    void (*attn_values)(const float* p, int64_t ldp, int m, const float* const* v, int nk, int64_t d,
                        float* out, int64_t ldo);
    double (*fma_peak)(int64_t rounds);  // the multiply-add ceiling's loop: flops done in `rounds` rounds
};

// Defined in matmul_avx2.cpp and matmul_avx512.cpp, which are built on x86-64 only (MARKBASE_MATMUL_X86).
extern const MatmulKernels kMatmulKernelsAvx2;
extern const MatmulKernels kMatmulKernelsAvx512;

// The bf16 prompt products (matmul.h, PromptProducts::kBf16) on a bf16 unit (vdpbf16ps, AMX): x rounded
// to bf16 and packed as pairs, xp[tile][in / 2][tokens] of 32-bit words (bf16(x[t][2i]) low, bf16(x[t][2i +
// 1]) high), the padding tokens zero; rows as the blocked kernels split them (whole groups of `rows`).
// Tiles are 64 tokens (matmul_pairs.h kPairTokens).
struct PairKernels {
    const char* name;
    int64_t rows;               // rows of a tile: the threads are given whole ones
    int64_t scratch_floats;     // the per-thread scratch rows_pairs needs: this many floats
    int64_t scratch_per_input;  // and this many more per input
    int64_t in_multiple;        // the inputs it takes are a multiple of this (others run the exact products)
    // Tokens [0, n) of x [n][in] (in even), pairs [p0, p1) of each, into xp.
    void (*pack)(const float* x, int64_t n, int64_t in, int64_t p0, int64_t p1, uint32_t* xp);
    void (*rows_pairs)(const uint32_t* xp, int64_t n, int64_t in, const bf16* w, int64_t out, float* y,
                       int64_t r0, int64_t r1, float* scratch);
    double (*peak)(int64_t rounds);  // the unit's ceiling loop: flops done in `rounds` rounds (null: none)
};

// x86-64 only: vdpbf16ps (matmul_avx512bf16.cpp), the AMX tile unit (matmul_amx.cpp), and a scalar model
// of the AMX unit running the same tile loop (matmul_amx_model.cpp; the tests' view of that loop on every
// CPU).
extern const PairKernels kPairKernelsAvx512Bf16;
extern const PairKernels kPairKernelsAmx;
extern const PairKernels kPairKernelsAmxModel;

namespace {

// Prefill blocking (rows_blocked): kBlockK inputs of kOuterRows weight rows are widened to fp32 (24 KB at 6
// rows, L1) and swept by kBlockTiles tiles of outer_tokens tokens, whose x^T block (kBlockK x 128 fp32 = 512
// KB at AVX-512's 64-token tiles) stays in L2. Measured on E2B's shapes, one thread of a Zen 5 VM: one tile
// per block and 1024 inputs 136-141 GFLOP/s at 64..512 tokens; four tiles and 512 inputs 128-134 at 64,
// 151-159 at 256 and 512; two tiles and 1024 inputs 143-145 and 155-157.
constexpr int64_t kBlockK = 1024;
constexpr int64_t kBlockTiles = 2;

inline int64_t min_i64(int64_t a, int64_t b) {
    return a < b ? a : b;
}

// -----------------------------------------------------------------------------------------------------------
// Vector backends. Every kernel below is a template over one of these, so the scalar backend runs the very
// same blocking and tail logic as the SIMD ones. A backend offers:
//   V, W (lanes), zero, load / load_n (fp32 or bf16 source; load_n reads only n < W elements, the rest is 0),
//   fma(a, b, acc) = a * b + acc, hsum, hsum4 (out[j] the sum of the j-th vector's lanes, by one addition
//   tree for every j), pin, store / store_n, prefetch; its tile shapes; and kGemvPrefetchBytes, how far ahead
//   a one-token tile prefetches each weight row (0: not at all). A prefetch never changes a result.
// -----------------------------------------------------------------------------------------------------------

struct ScalarOps {
    using V = float;
    static constexpr int W = 1;
    static constexpr int kTileRows = 4, kTileTokens = 4, kGemvRows = 4;
    static constexpr int kOuterRows = 4, kOuterVecs = 4;
    static constexpr int kGemvPrefetchBytes = 0;
    static void prefetch(const void*) {}
    static V zero() { return 0.0f; }
    static V load(const float* p) { return *p; }
    static V load(const bf16* p) { return bf16_to_float(*p); }
    static V bcast(const float* p) { return *p; }
    static V load_n(const float* p, int64_t n) { return n > 0 ? *p : 0.0f; }
    static V load_n(const bf16* p, int64_t n) { return n > 0 ? bf16_to_float(*p) : 0.0f; }
    static V fma(V a, V b, V acc) { return a * b + acc; }
    static float hsum(V v) { return v; }
    static void hsum4(V a, V b, V c, V d, float* out) {
        out[0] = a;
        out[1] = b;
        out[2] = c;
        out[3] = d;
    }
    static void pin(V&) {}
    static void store(float* p, V v) { *p = v; }
    static void store_n(float* p, V v, int64_t n) {
        if (n > 0) *p = v;
    }
};

// -----------------------------------------------------------------------------------------------------------
// The micro-kernel: an R x T tile of y (R weight rows, T tokens), dot products of length k along the
// contiguous input dimension. R weight vectors and one x vector live in registers at a time; R*T accumulators
// (16 at 4x4, with 4 + 1 loads per 16 FMAs) hide the FMA latency. y[t*ldy + r] is written, or added to when
// accumulate.
// -----------------------------------------------------------------------------------------------------------

template <class O, int R, int T, class WT>
inline void tile(const WT* w, int64_t ldw, const float* x, int64_t ldx, int64_t k, float* y, int64_t ldy,
                 bool accumulate) {
    using V = typename O::V;
    V acc[R][T];
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t) acc[r][t] = O::zero();
    int64_t i = 0;
    for (; i + O::W <= k; i += O::W) {
        if constexpr (T == 1 && O::kGemvPrefetchBytes > 0) {
            // GEMV streams R rows side by side, more streams than the hardware prefetchers keep far enough
            // ahead on some cores: one software prefetch per row per cache line, kGemvPrefetchBytes ahead.
            constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(WT));
            if (i % kLine == 0) {
                for (int r = 0; r < R; ++r) O::prefetch(w + r * ldw + i + O::kGemvPrefetchBytes / sizeof(WT));
            }
        }
        V wv[R];
        for (int r = 0; r < R; ++r) {
            wv[r] = O::load(w + r * ldw + i);
            if constexpr (T > 1) O::pin(wv[r]);  // reused by T tokens (with T = 1 it only adds spills)
        }
        for (int t = 0; t < T; ++t) {
            V xv = O::load(x + t * ldx + i);
            O::pin(xv);
            for (int r = 0; r < R; ++r) acc[r][t] = O::fma(wv[r], xv, acc[r][t]);
        }
    }
    if (i < k) {
        const int64_t rest = k - i;
        V wv[R];
        for (int r = 0; r < R; ++r) wv[r] = O::load_n(w + r * ldw + i, rest);
        for (int t = 0; t < T; ++t) {
            const V xv = O::load_n(x + t * ldx + i, rest);
            for (int r = 0; r < R; ++r) acc[r][t] = O::fma(wv[r], xv, acc[r][t]);
        }
    }
    // Every output is reduced by hsum4, a partial group of rows repeating its last accumulator (hsum's tree
    // differs from hsum4's). An output's arithmetic is then the same whatever its tile's shape, so a row of y
    // does not depend on how many tokens share the call (matmul_bf16_rowwise, the batched decode, needs it).
    constexpr int kLast = R - 1;
    for (int t = 0; t < T; ++t) {
        float s[(R + 3) / 4 * 4];
        for (int r = 0; r < R; r += 4) {
            O::hsum4(acc[r][t], acc[r + 1 < R ? r + 1 : kLast][t], acc[r + 2 < R ? r + 2 : kLast][t],
                     acc[r + 3 < R ? r + 3 : kLast][t], s + r);
        }
        float* d = y + t * ldy;
        for (int r = 0; r < R; ++r) d[r] = accumulate ? d[r] + s[r] : s[r];
    }
}

// Runtime (rows, tokens) in 1..4 x 1..4 -> the matching compile-time tile.
template <class O, int R, class WT>
inline void tile_t(int tokens, const WT* w, int64_t ldw, const float* x, int64_t ldx, int64_t k, float* y,
                   int64_t ldy, bool acc) {
    switch (tokens) {
        case 4:
            tile<O, R, 4>(w, ldw, x, ldx, k, y, ldy, acc);
            break;
        case 3:
            tile<O, R, 3>(w, ldw, x, ldx, k, y, ldy, acc);
            break;
        case 2:
            tile<O, R, 2>(w, ldw, x, ldx, k, y, ldy, acc);
            break;
        default:
            tile<O, R, 1>(w, ldw, x, ldx, k, y, ldy, acc);
            break;
    }
}

template <class O, class WT>
inline void tile_rt(int rows, int tokens, const WT* w, int64_t ldw, const float* x, int64_t ldx, int64_t k,
                    float* y, int64_t ldy, bool acc) {
    switch (rows) {
        case 4:
            tile_t<O, 4>(tokens, w, ldw, x, ldx, k, y, ldy, acc);
            break;
        case 3:
            tile_t<O, 3>(tokens, w, ldw, x, ldx, k, y, ldy, acc);
            break;
        case 2:
            tile_t<O, 2>(tokens, w, ldw, x, ldx, k, y, ldy, acc);
            break;
        default:
            tile_t<O, 1>(tokens, w, ldw, x, ldx, k, y, ldy, acc);
            break;
    }
}

// Decode and short batches (matmul.cpp chooses): rows [r0, r1), every token at once in tiles of kTileRows
// rows x up to kTileTokens tokens, weights read in place.
template <class O, class WT>
void rows_direct(const float* x, int64_t n, int64_t in, const WT* w, int64_t out, float* y, int64_t r0,
                 int64_t r1, float* /*panel*/) {
    if (n == 1) {
        // GEMV: x is twice the bytes of a bf16 row and the weight stream evicts it from L1, so each x vector
        // is used by many rows at once (measured on Zen 4: 4 rows 18 GB/s, 8 rows 21, 16 rows 24 of a 28 GB/s
        // single-core read ceiling).
        for (; r0 + O::kGemvRows <= r1; r0 += O::kGemvRows) {
            tile<O, O::kGemvRows, 1>(w + r0 * in, in, x, in, in, y + r0, out, false);
        }
    }
    for (int64_t r = r0; r < r1; r += O::kTileRows) {
        const int rows = static_cast<int>(min_i64(O::kTileRows, r1 - r));
        for (int64_t t = 0; t < n; t += O::kTileTokens) {
            const int tokens = static_cast<int>(min_i64(O::kTileTokens, n - t));
            tile_rt<O>(rows, tokens, w + r * in, in, x + t * in, in, in, y + t * out + r, out, false);
        }
    }
}

// Converts w[rows][k0 .. k0 + k) to fp32 in dst[kOuterRows][ld], rows past `rows` zero.
template <class O, class WT>
void widen_block(const WT* w, int64_t in, int64_t rows, int64_t k0, int64_t k, float* dst, int64_t ld) {
    for (int64_t r = 0; r < O::kOuterRows; ++r) {
        float* d = dst + r * ld;
        int64_t i = 0;
        if (r >= rows) {
            for (; i + O::W <= k; i += O::W) O::store(d + i, O::zero());
            if (i < k) O::store_n(d + i, O::zero(), k - i);
            continue;
        }
        const WT* src = w + r * in + k0;
        for (; i + O::W <= k; i += O::W) O::store(d + i, O::load(src + i));
        if (i < k) O::store_n(d + i, O::load_n(src + i, k - i), k - i);
    }
}

// The outer-product micro-kernel: acc[r][v] (kOuterRows rows x kOuterVecs vectors of W tokens) += w[r][i] x
// x^T[i][v*W ..] over k inputs, the weight broadcast and the tokens in the lanes. No horizontal sum: each
// lane is one output, summed in input order. Writes the tile to tile_out[r][kOuterVecs * W].
template <class O>
inline void outer_tile(const float* wp, int64_t ldw, const float* xt, int64_t ldx, int64_t k,
                       float* tile_out) {
    using V = typename O::V;
    constexpr int R = O::kOuterRows, NV = O::kOuterVecs;
    V acc[R][NV];
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < NV; ++v) acc[r][v] = O::zero();
    for (int64_t i = 0; i < k; ++i) {
        V xv[NV];
        for (int v = 0; v < NV; ++v) xv[v] = O::load(xt + i * ldx + v * O::W);
        for (int r = 0; r < R; ++r) {
            const V wb = O::bcast(wp + r * ldw + i);
            for (int v = 0; v < NV; ++v) acc[r][v] = O::fma(wb, xv[v], acc[r][v]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < NV; ++v) O::store(tile_out + (r * NV + v) * O::W, acc[r][v]);
}

// Prefill: rows [r0, r1) of y from x^T (see RowsKernel), kBlockTiles tiles of outer_tokens tokens at a time;
// for each block of kBlockK inputs, each group of kOuterRows rows is widened once into panel and swept by the
// tiles.
// A row's sum runs in input order, block by block: it does not depend on the thread split.
template <class O, class WT>
void rows_blocked(const float* xt, int64_t n, int64_t in, const WT* w, int64_t out, float* y, int64_t r0,
                  int64_t r1, float* panel) {
    constexpr int64_t TT = int64_t{O::kOuterVecs} * O::W, R = O::kOuterRows;
    float* wp = panel;                      // [R][kBlockK]
    float* tile_out = panel + R * kBlockK;  // [R][TT]
    for (int64_t b0 = 0; b0 < n; b0 += kBlockTiles * TT) {
        const int64_t b1 = min_i64(n, b0 + kBlockTiles * TT);
        for (int64_t k0 = 0; k0 < in; k0 += kBlockK) {
            const int64_t k = min_i64(kBlockK, in - k0);
            for (int64_t rg = r0; rg < r1; rg += R) {
                const int64_t nr = min_i64(R, r1 - rg);
                widen_block<O>(w + rg * in, in, nr, k0, k, wp, kBlockK);
                for (int64_t t0 = b0; t0 < b1; t0 += TT) {
                    const int64_t nt = min_i64(TT, n - t0);
                    outer_tile<O>(wp, kBlockK, xt + (t0 / TT * in + k0) * TT, TT, k, tile_out);
                    for (int64_t t = 0; t < nt; ++t) {
                        float* yt = y + (t0 + t) * out + rg;
                        for (int64_t r = 0; r < nr; ++r)
                            yt[r] = k0 > 0 ? yt[r] + tile_out[r * TT + t] : tile_out[r * TT + t];
                    }
                }
            }
        }
    }
}

// Attention's two products over a block of queries (cpu/attention.cpp), written so that each result is the
// same whatever the block's shape: a query's row does not depend on which other queries or keys share it.
// Scores: s[i][j] = q_i . k_j for i < m, j < nk, by tiles of kTileRows queries (or one) x kTileTokens keys;
// each pair one accumulator over d in lane chunks, reduced by hsum4 (a tile's missing keys repeat its last
// one and are not stored).
template <class O, int R>
void attn_scores_tile(const float* q, int64_t ldq, const float* const* k, int nk, int64_t d, float* s,
                      int64_t lds) {
    using V = typename O::V;
    constexpr int T = O::kTileTokens;
    static_assert(T == 4, "the scores' tile reduces its keys by one hsum4");
    for (int j0 = 0; j0 < nk; j0 += T) {
        const float* kr[T];
        for (int b = 0; b < T; ++b) kr[b] = k[j0 + b < nk ? j0 + b : nk - 1];
        V acc[R][T];
        for (int a = 0; a < R; ++a)
            for (int b = 0; b < T; ++b) acc[a][b] = O::zero();
        for (int64_t c = 0; c < d; c += O::W) {
            const int64_t rest = d - c;
            V qv[R];
            for (int a = 0; a < R; ++a) {
                qv[a] = rest >= O::W ? O::load(q + a * ldq + c) : O::load_n(q + a * ldq + c, rest);
                O::pin(qv[a]);
            }
            for (int b = 0; b < T; ++b) {
                const V kv = rest >= O::W ? O::load(kr[b] + c) : O::load_n(kr[b] + c, rest);
                for (int a = 0; a < R; ++a) acc[a][b] = O::fma(qv[a], kv, acc[a][b]);
            }
        }
        for (int a = 0; a < R; ++a) {
            float out[T];
            O::hsum4(acc[a][0], acc[a][1], acc[a][2], acc[a][3], out);
            for (int b = 0; b < T && j0 + b < nk; ++b) s[a * lds + j0 + b] = out[b];
        }
    }
}

// Whole tiles of kTileRows queries, then the rest one query at a time (the same arithmetic a pair).
template <class O>
void attn_scores_impl(const float* q, int64_t ldq, int m, const float* const* k, int nk, int64_t d, float* s,
                      int64_t lds) {
    constexpr int R = O::kTileRows;
    int i = 0;
    for (; i + R <= m; i += R) attn_scores_tile<O, R>(q + i * ldq, ldq, k, nk, d, s + i * lds, lds);
    for (; i < m; ++i) attn_scores_tile<O, 1>(q + i * ldq, ldq, k, nk, d, s + i * lds, lds);
}

// Values: out[i][u] = sum_j p[i][j] v_j[u] for i < m, u < d, by tiles of kTileRows queries (or one) x
// kTileTokens vectors of u; each element one multiply-add per key, j ascending from zero, so a zero weight
// leaves it exactly as it was (for a finite value row).
template <class O, int R>
void attn_values_tile(const float* p, int64_t ldp, const float* const* v, int nk, int64_t d, float* out,
                      int64_t ldo) {
    using V = typename O::V;
    constexpr int NV = O::kTileTokens;
    for (int64_t u0 = 0; u0 < d; u0 += NV * O::W) {
        V acc[R][NV];
        for (int a = 0; a < R; ++a)
            for (int c = 0; c < NV; ++c) acc[a][c] = O::zero();
        for (int j = 0; j < nk; ++j) {
            V pw[R];
            for (int a = 0; a < R; ++a) pw[a] = O::bcast(p + a * ldp + j);
            for (int c = 0; c < NV; ++c) {
                const int64_t u = u0 + c * O::W;
                if (u >= d) break;
                const V vv = u + O::W <= d ? O::load(v[j] + u) : O::load_n(v[j] + u, d - u);
                for (int a = 0; a < R; ++a) acc[a][c] = O::fma(pw[a], vv, acc[a][c]);
            }
        }
        for (int a = 0; a < R; ++a)
            for (int c = 0; c < NV; ++c) {
                const int64_t u = u0 + c * O::W;
                if (u >= d) break;
                float* o = out + a * ldo + u;
                if (u + O::W <= d)
                    O::store(o, acc[a][c]);
                else
                    O::store_n(o, acc[a][c], d - u);
            }
    }
}

template <class O>
void attn_values_impl(const float* p, int64_t ldp, int m, const float* const* v, int nk, int64_t d,
                      float* out, int64_t ldo) {
    constexpr int R = O::kTileRows;
    int i = 0;
    for (; i + R <= m; i += R) attn_values_tile<O, R>(p + i * ldp, ldp, v, nk, d, out + i * ldo, ldo);
    for (; i < m; ++i) attn_values_tile<O, 1>(p + i * ldp, ldp, v, nk, d, out + i * ldo, ldo);
}

// The instruction set's multiply-add ceiling on one core: kChains independent accumulators (more than FMA
// latency x FMA units on any x86 core) updated `rounds` times; returns the flops done. The result is kept
// alive through an asm barrier, so the loop cannot be removed.
template <class O>
double fma_peak_loop(int64_t rounds) {
    constexpr int kChains = 16;
    // Distinct lanes, hidden from the optimiser: with all lanes equal GCC computes one lane in scalar code.
    alignas(64) float seed[16];
    for (int i = 0; i < 16; ++i) seed[i] = 0.9999f - 1e-6f * static_cast<float>(i);
    asm volatile("" : : "r"(seed) : "memory");
    using V = typename O::V;
    const V b = O::load(seed);
    V acc[kChains];
    for (int c = 0; c < kChains; ++c) acc[c] = O::load(seed);
    for (int64_t r = 0; r < rounds; ++r) {
#pragma GCC unroll 16
        for (int c = 0; c < kChains; ++c) acc[c] = O::fma(acc[c], b, b);
    }
    float sink = 0.0f;
    for (int c = 0; c < kChains; ++c) sink += O::hsum(acc[c]);
    asm volatile("" : : "r"(sink));
    return 2.0 * O::W * kChains * static_cast<double>(rounds);
}

// The table of one backend's kernels; name is the caller's literal, so it lives in the caller's TU.
template <class O>
constexpr MatmulKernels make_matmul_kernels(const char* name) {
    return {name,
            O::kTileRows,
            O::kOuterRows,
            int64_t{O::kOuterVecs} * O::W,
            O::kOuterRows * (kBlockK + int64_t{O::kOuterVecs} * O::W),
            &rows_direct<O, bf16>,
            &rows_blocked<O, bf16>,
            &rows_direct<O, float>,
            &rows_blocked<O, float>,
            &attn_scores_impl<O>,
            &attn_values_impl<O>,
            &fma_peak_loop<O>};
}

}  // namespace
}  // namespace markbase::cpu
