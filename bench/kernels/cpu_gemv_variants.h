// The numbered variants of the CPU lab's decode GEMV (cpu_gemv_lab.cpp): y[o] = sum_i w[o][i] * x[i], w bf16
// [out][in] row-major (HF layout), x and y fp32, n = 1 token.
//
// The AVX-512 kernels carry their own target attribute, so this header compiles in a build whose -march lacks
// AVX-512; the lab runs them only where __builtin_cpu_supports says the CPU has the extensions.
//
// The "drop-in" kernels reproduce the product's arithmetic exactly (src/cpu/matmul_kernels.h, tile<O, R, 1>
// on the AVX-512 backend): per output, 16 fp32 lanes, lane j accumulating w[i + j] * x[i + j] by FMA for i =
// 0, 16, 32, ... in order (a masked tail last), then the hsum4 reduction tree. They differ only in how the
// bf16 is widened, how far ahead memory is prefetched and how many rows share one x vector; the gate holds
// them bit-identical to the product.
#pragma once

#include <cstdint>

#include "model/bf16.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define LAB_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"), always_inline)) inline
#define LAB_AVX512_BF16 \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma"), always_inline)) inline

namespace lab {

using markbase::bf16;

// The product's hsum4 (src/cpu/matmul_avx512.cpp), so that every output reduces by the same tree.
LAB_AVX512 void hsum4(__m512 a, __m512 b, __m512 c, __m512 d, float* out) {
    const __m512 ab =
        _mm512_add_ps(_mm512_maskz_unpacklo_ps(0xffff, a, b), _mm512_maskz_unpackhi_ps(0xffff, a, b));
    const __m512 cd =
        _mm512_add_ps(_mm512_maskz_unpacklo_ps(0xffff, c, d), _mm512_maskz_unpackhi_ps(0xffff, c, d));
    const __m512 v = _mm512_add_ps(_mm512_maskz_shuffle_ps(0xffff, ab, cd, 0x44),
                                   _mm512_maskz_shuffle_ps(0xffff, ab, cd, 0xee));
    const __m512d dv = _mm512_castps_pd(v);
    const __m256 s8 = _mm256_add_ps(_mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xf, dv, 0)),
                                    _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xf, dv, 1)));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1)));
}

// R accumulators -> y[0 .. R), a partial group of four repeating its last accumulator (as the product does).
template <int R>
LAB_AVX512 void reduce_rows(const __m512* acc, float* y) {
    float s[(R + 3) / 4 * 4];
    for (int r = 0; r < R; r += 4) {
        const int l = R - 1;
        hsum4(acc[r], acc[r + 1 < R ? r + 1 : l], acc[r + 2 < R ? r + 2 : l], acc[r + 3 < R ? r + 3 : l],
              s + r);
    }
    for (int r = 0; r < R; ++r) y[r] = s[r];
}

// bf16 -> fp32 as the product does it: zero-extend 16 halves to 32 bits (p5), shift into the high half (p0).
LAB_AVX512 __m512 widen_zx(const bf16* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, _mm512_maskz_cvtepu16_epi32(0xffff, h), 16));
}

// Widens 32 bf16 (one cache line) into two fp32 vectors with one vpermw each: element j goes to the high
// half of lane j and the zeroing mask clears the low halves. One p5 uop per 16 weights instead of two uops
// (p5 + p0), leaving port 0 to the FMAs.
LAB_AVX512 void widen_perm(const bf16* p, __m512i idx_lo, __m512i idx_hi, __m512& lo, __m512& hi) {
    const __m512i v = _mm512_loadu_si512(p);
    lo = _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(0xAAAAAAAAu, idx_lo, v));
    hi = _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(0xAAAAAAAAu, idx_hi, v));
}

// Word 2j + 1 of the index takes word base + j of the source.
LAB_AVX512 __m512i perm_index(int base) {
    alignas(64) uint16_t idx[32] = {};
    for (int j = 0; j < 16; ++j) idx[2 * j + 1] = static_cast<uint16_t>(base + j);
    return _mm512_load_si512(idx);
}

// The masked tail of every drop-in kernel: the last in % 16 inputs, zeros beyond.
template <int R>
LAB_AVX512 void tail(const bf16* w, int64_t in, const float* x, int64_t i, __m512* acc) {
    const int64_t rest = in - i;
    const __mmask16 m = static_cast<__mmask16>((1u << rest) - 1u);
    const __m512 xv = _mm512_maskz_loadu_ps(m, x + i);
    for (int r = 0; r < R; ++r) {
        const __m256i h = _mm256_maskz_loadu_epi16(m, w + r * in + i);
        const __m512 wv =
            _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, _mm512_maskz_cvtepu16_epi32(0xffff, h), 16));
        acc[r] = _mm512_fmadd_ps(wv, xv, acc[r]);
    }
}

// R rows of y from R rows of w. kPerm: widen by vpermw (else as the product). kPrefetch: prefetch each row
// this many bytes ahead (0: none, the hardware prefetcher alone).
template <int R, bool kPerm, int kPrefetch>
LAB_AVX512 void gemv_tile(const bf16* w, int64_t in, const float* x, float* y) {
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    const __m512i idx_lo = perm_index(0), idx_hi = perm_index(16);
    int64_t i = 0;
    for (; i + 32 <= in; i += 32) {
        const __m512 x0 = _mm512_loadu_ps(x + i), x1 = _mm512_loadu_ps(x + i + 16);
        for (int r = 0; r < R; ++r) {
            const bf16* p = w + r * in + i;
            if constexpr (kPrefetch > 0)
                _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetch, _MM_HINT_T0);
            __m512 lo, hi;
            if constexpr (kPerm) {
                widen_perm(p, idx_lo, idx_hi, lo, hi);
            } else {
                lo = widen_zx(p);
                hi = widen_zx(p + 16);
            }
            acc[r] = _mm512_fmadd_ps(lo, x0, acc[r]);
            acc[r] = _mm512_fmadd_ps(hi, x1, acc[r]);
        }
    }
    if (i + 16 <= in) {
        const __m512 x0 = _mm512_loadu_ps(x + i);
        for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(widen_zx(w + r * in + i), x0, acc[r]);
        i += 16;
    }
    if (i < in) tail<R>(w, in, x, i, acc);
    reduce_rows<R>(acc, y);
}

// Rows [r0, r1): tiles of R rows, the remainder in tiles of 4 and then single rows.
template <int R, bool kPerm, int kPrefetch>
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))) void gemv_rows(const float* x, int64_t in,
                                                                             const bf16* w, float* y,
                                                                             int64_t r0, int64_t r1) {
    for (; r0 + R <= r1; r0 += R) gemv_tile<R, kPerm, kPrefetch>(w + r0 * in, in, x, y + r0);
    for (; r0 + 4 <= r1; r0 += 4) gemv_tile<4, kPerm, kPrefetch>(w + r0 * in, in, x, y + r0);
    for (; r0 < r1; ++r0) gemv_tile<1, kPerm, kPrefetch>(w + r0 * in, in, x, y + r0);
}

// Not a drop-in (x is rounded to bf16, which changes every result): the AVX-512-BF16 dot product, two bf16
// pairs per lane per instruction. It shows what the instruction would buy; the product keeps fp32
// activations. x2 holds x rounded to bf16 (in elements, zero-padded to a multiple of 32).
template <int R>
LAB_AVX512_BF16 void dpbf16_tile(const bf16* w, int64_t in, const bf16* x2, float* y) {
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i < in; i += 32) {
        const int64_t rest = in - i;
        const __mmask32 m = rest >= 32 ? 0xffffffffu : static_cast<__mmask32>((1u << rest) - 1u);
        const __m512bh xv = (__m512bh)_mm512_loadu_si512(x2 + i);
        for (int r = 0; r < R; ++r) {
            const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(m, w + r * in + i);
            acc[r] = _mm512_dpbf16_ps(acc[r], wv, xv);
        }
    }
    reduce_rows<R>(acc, y);
}

template <int R>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma"))) void dpbf16_rows(
    const bf16* x2, int64_t in, const bf16* w, float* y, int64_t r0, int64_t r1) {
    for (; r0 + R <= r1; r0 += R) dpbf16_tile<R>(w + r0 * in, in, x2, y + r0);
    for (; r0 < r1; ++r0) dpbf16_tile<1>(w + r0 * in, in, x2, y + r0);
}

}  // namespace lab

#endif  // __x86_64__
