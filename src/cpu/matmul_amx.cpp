// The bf16 prompt products on the AMX tile unit (matmul.h PromptProducts::kBf16, matmul_pairs.h rows_tiles):
// x packed in pairs as for vdpbf16ps, each tile instruction 16 weight rows x 16 tokens x 32 inputs.
// CMakeLists.txt compiles this TU with -mamx-tile -mamx-bf16 (and AVX-512-BF16 for the packing); matmul.cpp
// runs it only where the CPU has them and the kernel has granted the process the tile data state.
#include <immintrin.h>

#include "cpu/matmul_kernels.h"
#include "cpu/matmul_pairs.h"

// (GCC spells the AMX macros __AMX_TILE__ / __AMX_BF16__, clang __AMXTILE__ / __AMXBF16__)
#if !(defined(__AMX_TILE__) || defined(__AMXTILE__)) || !(defined(__AMX_BF16__) || defined(__AMXBF16__)) || \
    !defined(__AVX512BF16__)
#error "matmul_amx.cpp must be compiled with -mamx-tile -mamx-bf16 -mavx512bf16 (CMakeLists.txt)"
#endif

namespace markbase::cpu {
namespace {

// GCC's tile intrinsics paste their tile numbers into the instruction's text, so each must be a literal:
// the unit's templates pick the literal for the tiles rows_tiles names.
struct AmxUnit {
    static void config(const TileConfig* c) { _tile_loadconfig(c); }
    template <int T>
    static void zero() {
        static_assert(T >= 0 && T <= 3);
        if constexpr (T == 0) _tile_zero(0);
        if constexpr (T == 1) _tile_zero(1);
        if constexpr (T == 2) _tile_zero(2);
        if constexpr (T == 3) _tile_zero(3);
    }
    template <int T>
    static void load(const void* p, int64_t stride) {
        static_assert(T >= 4 && T <= 7);
        if constexpr (T == 4) _tile_loadd(4, p, stride);
        if constexpr (T == 5) _tile_loadd(5, p, stride);
        if constexpr (T == 6) _tile_loadd(6, p, stride);
        if constexpr (T == 7) _tile_loadd(7, p, stride);
    }
    template <int C, int A, int B>
    static void dp() {
        static_assert(C == 2 * (A - 4) + (B - 6) && A >= 4 && A <= 5 && B >= 6 && B <= 7);
        if constexpr (C == 0) _tile_dpbf16ps(0, 4, 6);
        if constexpr (C == 1) _tile_dpbf16ps(1, 4, 7);
        if constexpr (C == 2) _tile_dpbf16ps(2, 5, 6);
        if constexpr (C == 3) _tile_dpbf16ps(3, 5, 7);
    }
    template <int T>
    static void store(void* p, int64_t stride) {
        static_assert(T >= 0 && T <= 3);
        if constexpr (T == 0) _tile_stored(0, p, stride);
        if constexpr (T == 1) _tile_stored(1, p, stride);
        if constexpr (T == 2) _tile_stored(2, p, stride);
        if constexpr (T == 3) _tile_stored(3, p, stride);
    }
    static void release() { _tile_release(); }
};

void rows_amx(const uint32_t* xp, int64_t n, int64_t in, const bf16* w, int64_t out, float* y, int64_t r0,
              int64_t r1, float* scratch) {
    rows_tiles<AmxUnit>(xp, n, in, w, out, y, r0, r1, scratch);
}

// Four independent accumulations of one tile instruction each a round (16 x 16 x 32 multiply-adds).
double amx_peak_loop(int64_t rounds) {
    static const TileConfig cfg;
    alignas(64) static const uint8_t zeros[16 * 64] = {};
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, zeros, 64);
    _tile_loadd(5, zeros, 64);
    for (int64_t i = 0; i < rounds; ++i) {
        _tile_dpbf16ps(0, 4, 5);
        _tile_dpbf16ps(1, 4, 5);
        _tile_dpbf16ps(2, 4, 5);
        _tile_dpbf16ps(3, 4, 5);
    }
    _tile_release();
    return 4.0 * 2 * 16 * 16 * 32 * static_cast<double>(rounds);
}

}  // namespace

constinit const PairKernels kPairKernelsAmx = {"amx", 32,          1024,      16,
                                               32,    &pack_pairs, &rows_amx, &amx_peak_loop};

}  // namespace markbase::cpu
