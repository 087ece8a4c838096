// A scalar model of the AMX tile unit (palette 1: eight tiles of 16 rows x 64 bytes; TDPBF16PS as the ISA
// reference states it) running matmul_pairs.h's tile loop, so the tests check that loop's layout, tails and
// padding on every CPU, not only where AMX exists. Never chosen for the products; slow.
#include "cpu/matmul_kernels.h"
#include "cpu/matmul_pairs.h"
#include "model/bf16.h"

namespace markbase::cpu {
namespace {

struct ModelUnit {
    static inline thread_local uint8_t tiles[8][16][64];

    static void config(const TileConfig*) {}
    template <int T>
    static void zero() {
        std::memset(tiles[T], 0, sizeof tiles[T]);
    }
    template <int T>
    static void load(const void* p, int64_t stride) {
        for (int r = 0; r < 16; ++r) std::memcpy(tiles[T][r], static_cast<const char*>(p) + r * stride, 64);
    }
    static float half(const uint8_t* row, int i) {  // the i-th bf16 of a row
        bf16 v;
        std::memcpy(&v, row + 2 * i, sizeof v);
        return bf16_to_float(v);
    }
    // C[m][n] += sum over k of A[m][2k+1] B[k][2n+1] + A[m][2k] B[k][2n], fp32
    template <int C, int A, int B>
    static void dp() {
        for (int m = 0; m < 16; ++m)
            for (int k = 0; k < 16; ++k)
                for (int n = 0; n < 16; ++n) {
                    float c;
                    std::memcpy(&c, tiles[C][m] + 4 * n, sizeof c);
                    c += half(tiles[A][m], 2 * k + 1) * half(tiles[B][k], 2 * n + 1);
                    c += half(tiles[A][m], 2 * k) * half(tiles[B][k], 2 * n);
                    std::memcpy(tiles[C][m] + 4 * n, &c, sizeof c);
                }
    }
    template <int T>
    static void store(void* p, int64_t stride) {
        for (int r = 0; r < 16; ++r) std::memcpy(static_cast<char*>(p) + r * stride, tiles[T][r], 64);
    }
    static void release() {}
};

void rows_model(const uint32_t* xp, int64_t n, int64_t in, const bf16* w, int64_t out, float* y, int64_t r0,
                int64_t r1, float* scratch) {
    rows_tiles<ModelUnit>(xp, n, in, w, out, y, r0, r1, scratch);
}

}  // namespace

constinit const PairKernels kPairKernelsAmxModel = {"amx-model",        32,          1024,   16, 32,
                                                    &pack_pairs_scalar, &rows_model, nullptr};

}  // namespace markbase::cpu
