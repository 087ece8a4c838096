// The AVX2 + FMA backend of the matmul kernels. CMakeLists.txt compiles this TU with -mavx2 -mfma
// -mno-avx512f, so it is AVX2 code even in a -march=native build on an AVX-512 machine; matmul.cpp runs it
// only on a CPU that has AVX2 and FMA.
#include <immintrin.h>

#include <cstring>

#include "cpu/matmul_kernels.h"

#if !defined(__AVX2__) || !defined(__FMA__) || defined(__AVX512F__)
#error "matmul_avx2.cpp must be compiled with -mavx2 -mfma -mno-avx512f (CMakeLists.txt)"
#endif

namespace markbase::cpu {
namespace {

struct Avx2Ops {
    using V = __m256;
    static constexpr int W = 8;
    static constexpr int kTileRows = 3, kTileTokens = 4;  // 12 accumulators + 3 weights + 1 x of 16 registers
    static constexpr int kGemvRows = 8;
    static constexpr int kOuterRows = 6, kOuterVecs = 2;  // prefill: 12 accumulators + 2 x + 1 broadcast
    static constexpr int kGemvPrefetchBytes = 0;  // not measured on an AVX2-only core: left to the hardware
    static void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
    static V widen(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }
    static V zero() { return _mm256_setzero_ps(); }
    static V load(const float* p) { return _mm256_loadu_ps(p); }
    static V bcast(const float* p) { return _mm256_broadcast_ss(p); }
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

}  // namespace

constinit const MatmulKernels kMatmulKernelsAvx2 = make_matmul_kernels<Avx2Ops>("avx2");

}  // namespace markbase::cpu
