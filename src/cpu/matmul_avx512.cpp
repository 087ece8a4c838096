// The AVX-512 (F, BW, VL) backend of the matmul kernels. CMakeLists.txt compiles this TU with -mavx512f
// -mavx512bw -mavx512vl -mavx2 -mfma whatever the build's -march; matmul.cpp runs it only on a CPU that has
// them.
#include <immintrin.h>

#include "cpu/matmul_kernels.h"

#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__) || !defined(__AVX2__) || \
    !defined(__FMA__)
#error "matmul_avx512.cpp must be compiled with -mavx512f -mavx512bw -mavx512vl -mavx2 -mfma (CMakeLists.txt)"
#endif

namespace markbase::cpu {
namespace {

struct Avx512Ops {
    using V = __m512;
    static constexpr int W = 16;
    static constexpr int kTileRows = 4, kTileTokens = 4;  // 16 accumulators + 4 weights + 1 x of 32 registers
    static constexpr int kGemvRows = 16;                  // n = 1: 16 accumulators, 1 x, weights in flight
    static constexpr int kOuterRows = 6, kOuterVecs = 4;  // prefill: 24 accumulators + 4 x + 1 broadcast
    // 16 rows x 512 B ahead = 128 lines requested ahead per core. On a 2-core Xeon VM (avx512_bf16) it read
    // E2B's in = 1536 matrices ~20% faster than the hardware prefetchers alone and 4-8% faster than 1 KB
    // ahead (2 KB gained nothing); down_proj's long rows gained less (bench/kernels/cpu_gemv_lab.cpp: v10
    // against v9, v4, v11; bench/results/cpu-gemv-lab.txt).
    static constexpr int kGemvPrefetchBytes = 512;
    static void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
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
    static V bcast(const float* p) { return _mm512_set1_ps(*p); }
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

}  // namespace

constinit const MatmulKernels kMatmulKernelsAvx512 = make_matmul_kernels<Avx512Ops>("avx512");

}  // namespace markbase::cpu
