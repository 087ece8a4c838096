// The bf16 prompt products' shared pieces (matmul.h PromptProducts::kBf16, matmul_kernels.h PairKernels):
// packing x in pairs, and the tile loop of a bf16 matrix unit written once over a Unit that is either the
// hardware's (AMX, matmul_amx.cpp) or a scalar model of it (matmul_amx_model.cpp, which the tests run on
// every CPU, so the loop's layout and tails are tested where there is no AMX). Everything has internal
// linkage, as in matmul_kernels.h: each TU compiles its own copy for its instruction set.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#include "cpu/matmul_kernels.h"
#include "model/bf16.h"

namespace markbase::cpu {
namespace {

constexpr int64_t kPairTokens = 64;  // tokens of a packed tile: xp rows are 64 words (256 bytes)

// Tokens [0, n) of x [n][in] (in even), pairs [p0, p1), into xp (PairKernels' layout), one float at a time.
inline void pack_pairs_scalar(const float* x, int64_t n, int64_t in, int64_t p0, int64_t p1, uint32_t* xp) {
    const int64_t pairs = in / 2, tiles = (n + kPairTokens - 1) / kPairTokens;
    for (int64_t t = 0; t < tiles * kPairTokens; ++t) {
        uint32_t* dt = xp + (t / kPairTokens) * pairs * kPairTokens + t % kPairTokens;
        for (int64_t p = p0; p < p1; ++p) {
            const uint32_t lo = t < n ? float_to_bf16(x[t * in + 2 * p]) : 0u;
            const uint32_t hi = t < n ? float_to_bf16(x[t * in + 2 * p + 1]) : 0u;
            dt[p * kPairTokens] = lo | (hi << 16);
        }
    }
}

#if defined(__AVX512BF16__)
// Tokens [0, n) of x [n][in] (in even) into xp's words for pairs [p0, p1): each row rounded to bf16 (nearest
// even, vcvtne2ps2bf16) 32 inputs at a time, its words scattered to their token's column. The padding
// tokens of the last tile are zero.
inline void pack_pairs(const float* x, int64_t n, int64_t in, int64_t p0, int64_t p1, uint32_t* xp) {
    const int64_t pairs = in / 2, tiles = (n + kPairTokens - 1) / kPairTokens;
    alignas(64) uint32_t words[16];
    for (int64_t tile = 0; tile < tiles; ++tile) {
        uint32_t* dt = xp + tile * pairs * kPairTokens;
        for (int64_t tt = 0; tt < kPairTokens; ++tt) {
            const int64_t t = tile * kPairTokens + tt;
            if (t >= n) {
                for (int64_t p = p0; p < p1; ++p) dt[p * kPairTokens + tt] = 0;
                continue;
            }
            const float* xr = x + t * in;
            for (int64_t p = p0; p < p1; p += 16) {
                const int64_t m = p1 - p < 16 ? p1 - p : 16;  // pairs in this chunk
                const __mmask16 lo = static_cast<__mmask16>(m >= 8 ? 0xffff : (1u << (2 * m)) - 1u);
                const __mmask16 hi = static_cast<__mmask16>(m <= 8 ? 0 : (1u << (2 * (m - 8))) - 1u);
                const __m512 a = _mm512_maskz_loadu_ps(lo, xr + 2 * p);
                const __m512 b = _mm512_maskz_loadu_ps(hi, xr + 2 * p + 16);
                _mm512_store_si512(words, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a)));
                for (int64_t j = 0; j < m; ++j) dt[(p + j) * kPairTokens + tt] = words[j];
            }
        }
    }
}

#endif

// The tile unit's configuration (palette 1): every tile 16 rows of 64 bytes.
struct alignas(64) TileConfig {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
    uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

// Rows [r0, r1) of y from xp with a bf16 matrix unit: y^T's tile C[m][t] (16 weight rows x 16 tokens, fp32)
// += A (16 weight rows x 32 inputs, read in place from w, a row's stride its width) . B (16 pairs x 16
// tokens of xp, a pair's stride 256 bytes). Tiles 0-3 hold a 32 x 32 block of C (the whole input is summed
// in them), 4-5 the two A tiles, 6-7 the two B tiles. Groups of rows past r1 read the weights' last rows from
// scratch, zero-padded to 32 (scratch: 1,024 floats for C, then 32 rows of `in` bf16). in must be a multiple
// of 32 (the caller checks).
template <class Unit>
void rows_tiles(const uint32_t* xp, int64_t n, int64_t in, const bf16* w, int64_t out, float* y, int64_t r0,
                int64_t r1, float* scratch) {
    static const TileConfig cfg;
    Unit::config(&cfg);
    const int64_t pairs = in / 2, ldw = in * 2;
    float* c = scratch;  // [4][16][16]
    char* pad = reinterpret_cast<char*>(scratch + 1024);
    for (int64_t rg = r0; rg < r1; rg += 32) {
        const int64_t nr = min_i64(32, r1 - rg);
        const char* wb = reinterpret_cast<const char*>(w + rg * in);
        if (nr < 32) {
            std::memcpy(pad, wb, static_cast<size_t>(nr * ldw));
            std::memset(pad + nr * ldw, 0, static_cast<size_t>((32 - nr) * ldw));
            wb = pad;
        }
        for (int64_t t0 = 0; t0 < n; t0 += 32) {
            const uint32_t* xb = xp + (t0 / kPairTokens) * pairs * kPairTokens + t0 % kPairTokens;
            Unit::template zero<0>();
            Unit::template zero<1>();
            Unit::template zero<2>();
            Unit::template zero<3>();
            for (int64_t k = 0; k < pairs; k += 16) {
                Unit::template load<4>(wb + 4 * k, ldw);
                Unit::template load<5>(wb + 16 * ldw + 4 * k, ldw);
                Unit::template load<6>(xb + k * kPairTokens, 4 * kPairTokens);
                Unit::template load<7>(xb + k * kPairTokens + 16, 4 * kPairTokens);
                Unit::template dp<0, 4, 6>();
                Unit::template dp<1, 4, 7>();
                Unit::template dp<2, 5, 6>();
                Unit::template dp<3, 5, 7>();
            }
            Unit::template store<0>(c, 64);
            Unit::template store<1>(c + 256, 64);
            Unit::template store<2>(c + 512, 64);
            Unit::template store<3>(c + 768, 64);
            // C tile 2i + j: rows 16i.., tokens 16j..
            for (int i = 0; i < 2; ++i)
                for (int j = 0; j < 2; ++j)
                    for (int64_t m = 0; m < 16 && 16 * i + m < nr; ++m)
                        for (int64_t u = 0; u < 16 && t0 + 16 * j + u < n; ++u)
                            y[(t0 + 16 * j + u) * out + rg + 16 * i + m] = c[(2 * i + j) * 256 + m * 16 + u];
        }
    }
    Unit::release();
}

}  // namespace
}  // namespace markbase::cpu
