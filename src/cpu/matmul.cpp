#include "cpu/matmul.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace markbase::cpu {
namespace {

// ---------------------------------------------------------------------------------------------------------------
// Vector backends. Every kernel below is a template over one of these, so the scalar backend runs the very
// same blocking and tail logic as the SIMD ones (and is tested on every machine). A backend offers:
//   V, W (lanes), zero, load / load_n (fp32 or bf16 source; load_n reads only n < W elements, the rest is 0),
//   fma(a, b, acc) = a * b + acc, hsum, store / store_n.
// ---------------------------------------------------------------------------------------------------------------

struct ScalarOps {
    using V = float;
    static constexpr int W = 1;
    static constexpr int kTileRows = 4, kTileTokens = 4, kGemvRows = 4;
    static V zero() { return 0.0f; }
    static V load(const float* p) { return *p; }
    static V load(const bf16* p) { return bf16_to_float(*p); }
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

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define MARKBASE_MATMUL_AVX512 1
struct SimdOps {
    using V = __m512;
    static constexpr int W = 16;
    static constexpr int kTileRows = 4, kTileTokens = 4;  // 16 accumulators + 4 weights + 1 x of 32 registers
    static constexpr int kGemvRows = 16;                  // n = 1: 16 accumulators, 1 x, weights in flight
    static __mmask16 mask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }
    // bf16 -> fp32 is a zero-extension to 32 bits and a shift into the high half. (The all-lanes maskz forms
    // compile to the same instructions; the plain ones trip GCC 12's -Wmaybe-uninitialized in its own
    // header.)
    static V widen(__m256i h) {
        return _mm512_castsi512_ps(
            _mm512_maskz_slli_epi32(0xffff, _mm512_maskz_cvtepu16_epi32(0xffff, h), 16));
    }
    static V zero() { return _mm512_setzero_ps(); }
    static V load(const float* p) { return _mm512_loadu_ps(p); }
    static V load(const bf16* p) { return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
    static V load_n(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(mask(n), p); }
    static V load_n(const bf16* p, int64_t n) { return widen(_mm256_maskz_loadu_epi16(mask(n), p)); }
    static V fma(V a, V b, V acc) { return _mm512_fmadd_ps(a, b, acc); }
    static float hsum(V v) {
        const __m512d d = _mm512_castps_pd(v);
        const __m256 s8 = _mm256_add_ps(_mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xf, d, 0)),
                                        _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xf, d, 1)));
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        s = _mm_add_ss(s, _mm_movehdup_ps(s));
        return _mm_cvtss_f32(s);
    }
    // out[j] = hsum(j-th argument), as one transposing reduction tree.
    static void hsum4(V a, V b, V c, V d, float* out) {
        // Per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3] and the same for c, d.
        const V ab =
            _mm512_add_ps(_mm512_maskz_unpacklo_ps(0xffff, a, b), _mm512_maskz_unpackhi_ps(0xffff, a, b));
        const V cd =
            _mm512_add_ps(_mm512_maskz_unpacklo_ps(0xffff, c, d), _mm512_maskz_unpackhi_ps(0xffff, c, d));
        // Per lane: [a, b, c, d] partial sums; then the four lanes are added.
        const V v = _mm512_add_ps(_mm512_maskz_shuffle_ps(0xffff, ab, cd, 0x44),
                                  _mm512_maskz_shuffle_ps(0xffff, ab, cd, 0xee));
        const __m512d dv = _mm512_castps_pd(v);
        const __m256 s8 = _mm256_add_ps(_mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xf, dv, 0)),
                                        _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xf, dv, 1)));
        _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1)));
    }
    // Keeps a loaded vector in a register: without it GCC folds the load into every FMA that uses the vector
    // (16 loads per 16 FMAs in a 4x4 tile instead of 8), and the tile becomes load-bound.
    static void pin(V& v) { asm("" : "+v"(v)); }
    static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
    static void store_n(float* p, V v, int64_t n) { _mm512_mask_storeu_ps(p, mask(n), v); }
};
#elif defined(__AVX2__) && defined(__FMA__)
#define MARKBASE_MATMUL_AVX2 1
struct SimdOps {
    using V = __m256;
    static constexpr int W = 8;
    static constexpr int kTileRows = 3, kTileTokens = 4;  // 12 accumulators + 3 weights + 1 x of 16 registers
    static constexpr int kGemvRows = 8;
    static V widen(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }
    static V zero() { return _mm256_setzero_ps(); }
    static V load(const float* p) { return _mm256_loadu_ps(p); }
    static V load(const bf16* p) { return widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
    // AVX2 has no 16-bit masked load: tails go through a zeroed stack copy (once per row, so it is cheap).
    static V load_n(const float* p, int64_t n) {
        alignas(32) float t[8] = {};
        std::memcpy(t, p, static_cast<size_t>(n) * sizeof(float));
        return _mm256_load_ps(t);
    }
    static V load_n(const bf16* p, int64_t n) {
        alignas(16) bf16 t[8] = {};
        std::memcpy(t, p, static_cast<size_t>(n) * sizeof(bf16));
        return widen(_mm_load_si128(reinterpret_cast<const __m128i*>(t)));
    }
    static V fma(V a, V b, V acc) { return _mm256_fmadd_ps(a, b, acc); }
    static float hsum(V v) {
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        s = _mm_add_ss(s, _mm_movehdup_ps(s));
        return _mm_cvtss_f32(s);
    }
    static void hsum4(V a, V b, V c, V d, float* out) {
        const V h = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));  // per lane: [a, b, c, d]
        _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
    }
    static void pin(V& v) { asm("" : "+x"(v)); }
    static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
    static void store_n(float* p, V v, int64_t n) {
        alignas(32) float t[8];
        _mm256_store_ps(t, v);
        std::memcpy(p, t, static_cast<size_t>(n) * sizeof(float));
    }
};
#else
using SimdOps = ScalarOps;
#endif

// ---------------------------------------------------------------------------------------------------------------
// The micro-kernel: an R x T tile of y (R weight rows, T tokens), dot products of length k along the
// contiguous input dimension. R weight vectors and one x vector live in registers at a time; R*T accumulators
// (16 at 4x4, with 4 + 1 loads per 16 FMAs) hide the FMA latency. y[t*ldy + r] is written, or added to when
// accumulate.
// ---------------------------------------------------------------------------------------------------------------

template <class O, int R, int T, class WT>
inline void tile(const WT* w, int64_t ldw, const float* x, int64_t ldx, int64_t k, float* y, int64_t ldy,
                 bool accumulate) {
    using V = typename O::V;
    V acc[R][T];
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t) acc[r][t] = O::zero();
    int64_t i = 0;
    for (; i + O::W <= k; i += O::W) {
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
    for (int t = 0; t < T; ++t) {
        float s[R];
        int r = 0;
        for (; r + 4 <= R; r += 4) O::hsum4(acc[r][t], acc[r + 1][t], acc[r + 2][t], acc[r + 3][t], s + r);
        for (; r < R; ++r) s[r] = O::hsum(acc[r][t]);
        float* d = y + t * ldy;
        for (r = 0; r < R; ++r) d[r] = accumulate ? d[r] + s[r] : s[r];
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

// Decode and short batches take the direct path: each tile of weight rows is read straight from bf16 and
// swept by every token, whose x stays in L2. Up to 4 tokens that reads every weight once from memory; up to
// ~32 tokens (while all of x fits in a core's L2) re-reading a tile from L1 beats widening it into a panel
// (measured).
constexpr int64_t kDirectMaxTokens = 4;
constexpr int64_t kDirectMaxXBytes = 256 << 10;
// Prefill blocking: kBlockK inputs x kBlockRows (8 tiles, 24 or 32) weight rows are converted to fp32 (<= 64
// KB, stays in L2) and reused by kBlockTokens tokens, whose x panel (kBlockTokens x kBlockK fp32 = 128 KB)
// also stays in L2.
constexpr int64_t kBlockK = 512;
constexpr int64_t kBlockTilesOfRows = 8;
constexpr int64_t kBlockTokens = 64;
// Below this many multiply-adds the work runs on the calling thread: waking the pool would cost more.
// Below ~256K multiply-adds (tens of microseconds on one core) waking a second thread costs more than it
// saves.
constexpr int64_t kMinParallelMacs = 1 << 18;
// Runs of rows per thread (see matmul_impl). Each prefill run re-reads its tokens' x, so not too many.
constexpr int64_t kRunsPerThread = 4;

// Decode: rows [r0, r1), every token at once in tiles of 4 rows x up to 4 tokens, weights read in place.
template <class O, class WT>
void rows_direct(const float* x, int64_t n, int64_t in, const WT* w, int64_t out, float* y, int64_t r0,
                 int64_t r1) {
    if (n == 1) {
        // GEMV: x is twice the bytes of a bf16 row and the weight stream evicts it from L1, so each x vector
        // is used by many rows at once (measured on Zen 4: 4 rows 18 GB/s, 8 rows 21, 16 rows 24 of a 28 GB/s
        // single-core read ceiling).
        for (; r0 + O::kGemvRows <= r1; r0 += O::kGemvRows) {
            tile<O, O::kGemvRows, 1>(w + r0 * in, in, x, in, in, y + r0, out, false);
        }
    }
    for (int64_t r = r0; r < r1; r += O::kTileRows) {
        const int rows = static_cast<int>(std::min<int64_t>(O::kTileRows, r1 - r));
        for (int64_t t = 0; t < n; t += O::kTileTokens) {
            const int tokens = static_cast<int>(std::min<int64_t>(O::kTileTokens, n - t));
            tile_rt<O>(rows, tokens, w + r * in, in, x + t * in, in, in, y + t * out + r, out, false);
        }
    }
}

// Converts w[rows][k0 .. k0 + k) to fp32 in dst[rows][ld]. A float weight needs no copy (see rows_blocked).
template <class O>
void widen_block(const bf16* w, int64_t in, int64_t rows, int64_t k0, int64_t k, float* dst, int64_t ld) {
    for (int64_t r = 0; r < rows; ++r) {
        const bf16* s = w + r * in + k0;
        float* d = dst + r * ld;
        int64_t i = 0;
        for (; i + O::W <= k; i += O::W) O::store(d + i, O::load(s + i));
        if (i < k) O::store_n(d + i, O::load_n(s + i, k - i), k - i);
    }
}

// Prefill: rows [r0, r1), tokens in blocks; for each input block and row block the weights are widened once
// and swept by every token of the token block.
template <class O, class WT>
void rows_blocked(const float* x, int64_t n, int64_t in, const WT* w, int64_t out, float* y, int64_t r0,
                  int64_t r1) {
    constexpr int64_t kBlockRows = kBlockTilesOfRows * O::kTileRows;
    thread_local std::vector<float> panel;
    if constexpr (!std::is_same_v<WT, float>) panel.resize(static_cast<size_t>(kBlockRows * kBlockK));
    for (int64_t t0 = 0; t0 < n; t0 += kBlockTokens) {
        const int64_t nt = std::min(kBlockTokens, n - t0);
        for (int64_t k0 = 0; k0 < in; k0 += kBlockK) {
            const int64_t k = std::min(kBlockK, in - k0);
            const bool accumulate = k0 > 0;
            for (int64_t rb = r0; rb < r1; rb += kBlockRows) {
                const int64_t nr = std::min(kBlockRows, r1 - rb);
                const float* wp;
                int64_t ldw;
                if constexpr (std::is_same_v<WT, float>) {
                    wp = w + rb * in + k0;
                    ldw = in;
                } else {
                    widen_block<O>(w + rb * in, in, nr, k0, k, panel.data(), kBlockK);
                    wp = panel.data();
                    ldw = kBlockK;
                }
                for (int64_t r = 0; r < nr; r += O::kTileRows) {
                    const int rows = static_cast<int>(std::min<int64_t>(O::kTileRows, nr - r));
                    for (int64_t t = 0; t < nt; t += O::kTileTokens) {
                        const int tokens = static_cast<int>(std::min<int64_t>(O::kTileTokens, nt - t));
                        tile_rt<O>(rows, tokens, wp + r * ldw, ldw, x + (t0 + t) * in + k0, in, k,
                                   y + (t0 + t) * out + rb + r, out, accumulate);
                    }
                }
            }
        }
    }
}

template <class O, class WT>
void matmul_impl(ThreadPool& pool, const float* x, int64_t n, int64_t in, const WT* w, int64_t out,
                 float* y) {
    if (n <= 0 || out <= 0) return;
    if (in <= 0) {
        std::fill(y, y + n * out, 0.0f);
        return;
    }
    // Work is handed out in contiguous runs of whole row tiles, so each run streams one contiguous slice of
    // the weight. There are a few runs per thread, taken from a shared counter: a thread slowed down by
    // another process (or a slower core) takes fewer runs instead of holding everyone up at the end.
    const int64_t groups = (out + O::kTileRows - 1) / O::kTileRows;
    auto run = [&](int64_t g0, int64_t g1) {
        const int64_t r0 = g0 * O::kTileRows, r1 = std::min(out, g1 * O::kTileRows);
        if (n <= kDirectMaxTokens || n * in * int64_t{sizeof(float)} <= kDirectMaxXBytes) {
            rows_direct<O>(x, n, in, w, out, y, r0, r1);
        } else {
            rows_blocked<O>(x, n, in, w, out, y, r0, r1);
        }
    };
    const int threads = pool.size();
    if (threads == 1 || n * in * out < kMinParallelMacs) {
        run(0, groups);
        return;
    }
    const int64_t runs = std::min<int64_t>(groups, int64_t{threads} * kRunsPerThread);
    const int64_t per_run = (groups + runs - 1) / runs;
    std::atomic<int64_t> next{0};
    pool.parallel_for(threads, [&](int64_t, int64_t) {
        for (;;) {
            const int64_t g = next.fetch_add(per_run, std::memory_order_relaxed);
            if (g >= groups) break;
            run(g, std::min(groups, g + per_run));
        }
    });
}

template <class O>
float dot_impl(const float* a, const float* b, int64_t n) {
    using V = typename O::V;
    V s0 = O::zero(), s1 = O::zero(), s2 = O::zero(), s3 = O::zero();
    int64_t i = 0;
    for (; i + 4 * O::W <= n; i += 4 * O::W) {
        s0 = O::fma(O::load(a + i), O::load(b + i), s0);
        s1 = O::fma(O::load(a + i + O::W), O::load(b + i + O::W), s1);
        s2 = O::fma(O::load(a + i + 2 * O::W), O::load(b + i + 2 * O::W), s2);
        s3 = O::fma(O::load(a + i + 3 * O::W), O::load(b + i + 3 * O::W), s3);
    }
    for (; i + O::W <= n; i += O::W) s0 = O::fma(O::load(a + i), O::load(b + i), s0);
    if (i < n) s1 = O::fma(O::load_n(a + i, n - i), O::load_n(b + i, n - i), s1);
    return O::hsum(s0) + O::hsum(s1) + O::hsum(s2) + O::hsum(s3);
}

}  // namespace

void matmul_bf16(ThreadPool& pool, const float* x, int64_t n, int64_t in, const bf16* w, int64_t out,
                 float* y) {
    matmul_impl<SimdOps>(pool, x, n, in, w, out, y);
}

void matmul_f32(ThreadPool& pool, const float* x, int64_t n, int64_t in, const float* w, int64_t out,
                float* y) {
    matmul_impl<SimdOps>(pool, x, n, in, w, out, y);
}

float dot_f32(const float* a, const float* b, int64_t n) {
    return dot_impl<SimdOps>(a, b, n);
}

void matmul_bf16_scalar(ThreadPool& pool, const float* x, int64_t n, int64_t in, const bf16* w, int64_t out,
                        float* y) {
    matmul_impl<ScalarOps>(pool, x, n, in, w, out, y);
}

void matmul_f32_scalar(ThreadPool& pool, const float* x, int64_t n, int64_t in, const float* w, int64_t out,
                       float* y) {
    matmul_impl<ScalarOps>(pool, x, n, in, w, out, y);
}

float dot_f32_scalar(const float* a, const float* b, int64_t n) {
    return dot_impl<ScalarOps>(a, b, n);
}

const char* matmul_simd_path() {
#if defined(MARKBASE_MATMUL_AVX512)
    return "avx512";
#elif defined(MARKBASE_MATMUL_AVX2)
    return "avx2";
#else
    return "scalar";
#endif
}

}  // namespace markbase::cpu
