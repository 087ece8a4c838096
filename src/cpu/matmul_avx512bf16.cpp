// The AVX-512-BF16 prompt products (matmul.h, PromptProducts::kBf16): x rounded to bf16 once, the weights'
// bf16 read in place, two products a lane per vdpbf16ps. CMakeLists.txt compiles this TU with -mavx512bf16
// (and F, BW, VL); matmul.cpp runs it only on a CPU that has them.
//
// Layout: x^T in pairs, xp[tile][in / 2][64 tokens] of 32-bit words, word (i, t) = (bf16(x[t][2i]) low,
// bf16(x[t][2i + 1]) high): exactly the pair a lane of vdpbf16ps multiplies with the weight row's word i,
// which is broadcast straight from the checkpoint's row (its two bf16 in the same order). A tile is 6 weight
// rows x 64 tokens (24 accumulators, 4 x vectors, 1 broadcast of 32 registers). Inputs go in blocks of
// kBlockK (the fp32 path's block, matmul_kernels.h), swept by kBlockTiles tiles of tokens whose xp block (128
// KB a tile) stays in L2; a row group's block of weights (12 KB) stays in L1 across the tiles.
#include <immintrin.h>

#include <cstring>

#include "cpu/matmul_kernels.h"
#include "cpu/matmul_pairs.h"

#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__) || !defined(__AVX512BF16__)
#error \
    "matmul_avx512bf16.cpp must be compiled with -mavx512f -mavx512bw -mavx512vl -mavx512bf16 (CMakeLists.txt)"
#endif

namespace markbase::cpu {
namespace {

constexpr int kRows = 6, kVecs = 4;
constexpr int64_t kTokens = kPairTokens;  // kVecs vectors of 16
constexpr int64_t kBlockPairs = kBlockK / 2;

// acc[r][v] += pairs of w row r . xp pairs, over `pairs` words; writes the tile as tile_out[r][64].
void dp_tile(const char* const* wrow, const uint32_t* xp, int64_t pairs, float* tile_out) {
    __m512 acc[kRows][kVecs];
    for (auto& r : acc)
        for (auto& a : r) a = _mm512_setzero_ps();
    for (int64_t i = 0; i < pairs; ++i) {
        __m512bh xv[kVecs];
        for (int v = 0; v < kVecs; ++v)
            xv[v] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(xp + i * kTokens + v * 16));
        for (int r = 0; r < kRows; ++r) {
            int32_t word;
            std::memcpy(&word, wrow[r] + 4 * i, sizeof word);
            const __m512bh wb = reinterpret_cast<__m512bh>(_mm512_set1_epi32(word));
            for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], wb, xv[v]);
        }
    }
    for (int r = 0; r < kRows; ++r)
        for (int v = 0; v < kVecs; ++v) _mm512_storeu_ps(tile_out + (r * kVecs + v) * 16, acc[r][v]);
}

// Rows [r0, r1) of y from xp (as rows_blocked in matmul_kernels.h, with pairs for inputs). A row's sum runs
// block by block in input order: it does not depend on the thread split.
void rows_pairs(const uint32_t* xp, int64_t n, int64_t in, const bf16* w, int64_t out, float* y, int64_t r0,
                int64_t r1, float* tile_out) {
    const int64_t pairs = in / 2;
    for (int64_t b0 = 0; b0 < n; b0 += kBlockTiles * kTokens) {
        const int64_t b1 = min_i64(n, b0 + kBlockTiles * kTokens);
        for (int64_t k0 = 0; k0 < pairs; k0 += kBlockPairs) {
            const int64_t k = min_i64(kBlockPairs, pairs - k0);
            for (int64_t rg = r0; rg < r1; rg += kRows) {
                const int64_t nr = min_i64(kRows, r1 - rg);
                const char* wrow[kRows];  // rows past nr repeat the last one; their sums are not stored
                for (int r = 0; r < kRows; ++r)
                    wrow[r] = reinterpret_cast<const char*>(w + (rg + min_i64(r, nr - 1)) * in + 2 * k0);
                for (int64_t t0 = b0; t0 < b1; t0 += kTokens) {
                    const int64_t nt = min_i64(kTokens, n - t0);
                    dp_tile(wrow, xp + (t0 / kTokens * pairs + k0) * kTokens, k, tile_out);
                    for (int64_t t = 0; t < nt; ++t) {
                        float* yt = y + (t0 + t) * out + rg;
                        for (int64_t r = 0; r < nr; ++r)
                            yt[r] = k0 > 0 ? yt[r] + tile_out[r * kTokens + t] : tile_out[r * kTokens + t];
                    }
                }
            }
        }
    }
}

// 16 chains of independent vdpbf16ps: 4 flops a lane each.
double dp_peak_loop(int64_t rounds) {
    constexpr int kChains = 16;
    __m512 acc[kChains];
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
    const __m512bh b = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3f803f80));  // (1, 1)
    for (int64_t i = 0; i < rounds; ++i) {
#pragma GCC unroll 16
        for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], b, b);
    }
    // (a store and scalar sums: GCC 12's _mm512_reduce_add_ps trips its own -Wuninitialized)
    alignas(64) float lanes[16];
    float sink = 0.0f;
    for (int c = 0; c < kChains; ++c) {
        _mm512_store_ps(lanes, acc[c]);
        for (float f : lanes) sink += f;
    }
    asm volatile("" : : "r"(sink));
    return 4.0 * 16 * kChains * static_cast<double>(rounds);
}

}  // namespace

constinit const PairKernels kPairKernelsAvx512Bf16 = {"avx512bf16", kRows,       kRows* kTokens, 0, 2,
                                                      &pack_pairs,  &rows_pairs, &dp_peak_loop};

}  // namespace markbase::cpu
