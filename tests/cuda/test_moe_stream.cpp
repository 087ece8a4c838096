// moe_stream (cuda/kernels/moe_stream.cu), a batched step's experts with no host in the loop: the gate/up
// pass's GeGLU halves and the down pass's slots against fp64 host products of the same inputs and weights,
// over routings that leave experts empty, give one expert more entries than a block's token tiles hold
// (further passes over its rows), and take each token-tile count (1, 2, 4 tiles of 8 entries); with bf16
// rows (inputs as bf16 halves), with FP8 rows and their scales, and with int4 rows (group scales; zero
// points stored for gate/up, symmetric for down; K not a multiple of 128, so a row's last chunk is ragged)
// (quantised rows: inputs made by f16_rows from fp32, one f16 of x / 16, h written so too).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "support/device_arrays.h"
#include "support/expert_rows.h"
#include "support/require_cuda.h"

#ifdef MARKBASE_HAS_CUDA
#include <cuda_runtime.h>

#include "cuda/kernels/kernels.h"
#endif
#include "model/fp8.h"

namespace markbase {
namespace {

#ifdef MARKBASE_HAS_CUDA
using testing::from_bf16;
using testing::from_f16;
using testing::gelu_tanh;
using testing::to_bf16;
using testing::to_device;
using testing::to_host;

// bf16 halves of random values in [-1, 1): [rows][width] hi, then lo
std::vector<uint16_t> random_halves(std::mt19937& rng, size_t count) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<uint16_t> hl(2 * count);
    for (size_t i = 0; i < count; ++i) {
        const float x = u(rng);
        hl[i] = to_bf16(x);
        hl[count + i] = to_bf16(x - from_bf16(hl[i]));
    }
    return hl;
}
// The value of input i: bf16 hi + lo (hi's count values, then lo's), or 16 f16 (one array)
double half_value(const std::vector<uint16_t>& hl, size_t count, size_t i, bool f16 = false) {
    if (f16) return 16.0 * from_f16(hl[i]);
    return double(from_bf16(hl[i])) + double(from_bf16(hl[count + i]));
}

using Rows = testing::ExpertRowsHost;

struct Errors {
    double h = 0.0, slots = 0.0;  // the largest errors relative to the sum of |terms|
};

// n tokens of K slots over E experts, routed by `expert_of(t, k)`; both passes against fp64.
template <class Route>
Errors run_case(WeightFormat f, int n, int K, int E, int H, int Ie, Route expert_of, uint32_t seed) {
    const bool fp8 = f == WeightFormat::kFp8, int4 = f == WeightFormat::kInt4, quant = fp8 || int4;
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    // moe_bucket's grouping: group e = expert e, its entries t * K + k in entry order
    std::vector<int> off(static_cast<size_t>(E) + 1, 0), entries;
    for (int e = 0; e < E; ++e) {
        for (int i = 0; i < n * K; ++i)
            if (expert_of(i / K, i % K) == e) entries.push_back(i);
        off[static_cast<size_t>(e) + 1] = static_cast<int>(entries.size());
    }
    const size_t nx = static_cast<size_t>(n) * H, nh = static_cast<size_t>(n) * K * Ie;
    const Rows gu = int4 ? Rows::int4(rng, static_cast<size_t>(E) * 2 * Ie, H, true)
                         : Rows(rng, fp8, static_cast<size_t>(E) * 2 * Ie, H);
    const Rows down = int4 ? Rows::int4(rng, static_cast<size_t>(E) * H, Ie, false)
                           : Rows(rng, fp8, static_cast<size_t>(E) * H, Ie);
    // the inputs as halves; quantised rows: f16_rows of fp32 values (a second copy unused)
    std::vector<uint16_t> x;
    if (quant) {
        std::vector<float> xf(nx);
        for (float& v : xf) v = u(rng);
        float* d_xf = to_device(xf);
        uint16_t* d_f16 = nullptr;
        EXPECT_EQ(cudaMalloc(&d_f16, 2 * nx * sizeof(uint16_t)), cudaSuccess);
        // NaN in what f16_rows leaves unwritten (the second copy the test keeps)
        EXPECT_EQ(cudaMemset(d_f16, 0xff, 2 * nx * sizeof(uint16_t)), cudaSuccess);
        cuda::f16_rows(d_xf, H, H, n, false, nullptr, 1e-6f, d_f16, nullptr);
        x = to_host(d_f16, 2 * nx);
        cudaFree(d_xf);
        cudaFree(d_f16);
        // one f16 of x / 16 keeps 2^-11 of each value (round to nearest), at least f16's subnormal half-step
        double worst = 0.0;
        for (size_t i = 0; i < nx; ++i)
            worst = std::max(worst, std::fabs(half_value(x, nx, i, true) - xf[i]) /
                                        (std::ldexp(std::fabs(xf[i]), -11) + std::ldexp(16.0, -25)));
        EXPECT_LE(worst, 1.0) << "f16_rows' values";
    } else {
        x = random_halves(rng, nx);
    }
    uint16_t* d_x = to_device(x);
    cuda::ExpertRows d_gu, d_down;
    std::vector<void*> owned;
    for (auto [rows, dst] : {std::pair{&gu, &d_gu}, std::pair{&down, &d_down}}) {
        if (quant) {
            QuantMatrix& m = fp8 ? dst->fp8 : dst->int4;
            m.q = to_device(rows->q);
            m.scale = to_device(rows->scale);
            m.zero = rows->zero.empty() ? nullptr : to_device(rows->zero);
            owned.push_back(const_cast<uint8_t*>(m.q));
            owned.push_back(const_cast<float*>(m.scale));
            if (m.zero) owned.push_back(const_cast<uint8_t*>(m.zero));
        } else {
            dst->w = to_device(rows->w);
            owned.push_back(const_cast<uint16_t*>(dst->w));
        }
    }
    int *d_off = to_device(off), *d_ent = to_device(entries);
    uint16_t* d_h = nullptr;
    float* d_slots = nullptr;
    EXPECT_EQ(cudaMalloc(&d_h, 2 * nh * sizeof(uint16_t)), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&d_slots, static_cast<size_t>(n) * K * H * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemset(d_h, 0xff, 2 * nh * sizeof(uint16_t)), cudaSuccess);  // NaN: every output written
    EXPECT_EQ(cudaMemset(d_slots, 0xff, static_cast<size_t>(n) * K * H * sizeof(float)), cudaSuccess);
    cuda::moe_stream_gate_up(d_x, d_x + nx, H, K, d_gu, Ie, d_off, d_ent, E, n, d_h, d_h + nh, quant,
                             nullptr);
    cuda::moe_stream_down(d_h, d_h + nh, Ie, d_down, H, K, d_off, d_ent, E, n, d_slots, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint16_t> h = to_host(d_h, 2 * nh);
    const std::vector<float> slots = to_host(d_slots, static_cast<size_t>(n) * K * H);
    Errors err;
    for (int i = 0; i < n * K; ++i) {
        const int e = expert_of(i / K, i % K);
        for (int j = 0; j < Ie; ++j) {  // GeGLU of the gate and up products
            double g = 0, up = 0, mag_g = 0, mag_u = 0;
            for (int k = 0; k < H; ++k) {
                const double xv = half_value(x, nx, static_cast<size_t>(i / K) * H + k, quant);
                const size_t row = static_cast<size_t>(e) * 2 * Ie + j;
                const double wg = gu.value(row, k), wu = gu.value(row + Ie, k);
                g += xv * wg;
                up += xv * wu;
                mag_g += std::fabs(xv * wg);
                mag_u += std::fabs(xv * wu);
            }
            const double want = gelu_tanh(g) * up;
            const double got = half_value(h, nh, static_cast<size_t>(i) * Ie + j, quant);
            // |gelu(g) up| <= |g| |up|: the error relative to the product of the two sums of |terms|
            // (the kernel's h is rounded as its next pass reads it: bf16 halves ~2^-16, one f16 2^-11)
            const double scale = mag_g * mag_u + 1e-12;
            err.h = std::max(err.h, std::isfinite(got) ? std::fabs(got - want) / scale : 1e30);
        }
        for (int r = 0; r < H; ++r) {  // the down product of the h the kernel wrote
            double want = 0, mag = 0;
            for (int k = 0; k < Ie; ++k) {
                const double p = half_value(h, nh, static_cast<size_t>(i) * Ie + k, quant) *
                                 down.value(static_cast<size_t>(e) * H + r, k);
                want += p;
                mag += std::fabs(p);
            }
            const float got = slots[static_cast<size_t>(i) * H + r];
            err.slots =
                std::max(err.slots, std::isfinite(got) ? std::fabs(got - want) / (mag + 1e-12) : 1e30);
        }
    }
    for (void* p : owned) cudaFree(p);
    for (void* p : {static_cast<void*>(d_x), static_cast<void*>(d_off), static_cast<void*>(d_ent),
                    static_cast<void*>(d_h), static_cast<void*>(d_slots)})
        cudaFree(p);
    return err;
}
#endif

#ifdef MARKBASE_HAS_CUDA
// Both passes over the routings above for one format. H: bf16 3 chunks of 32 (an uneven round of 2 chunks a
// warp), FP8 3 chunks of 64, int4 2.5 chunks of 128 (320: a ragged last chunk of 2 lanes); Ie 64, int4 96
// (one ragged chunk of 3 lanes); row blocks of 32. The bound is the products' own rounding: ~2^-16 of a
// term with bf16 halves, f16's 2^-11 of h once it is written (quantised rows: the inputs are exact here,
// the values f16_rows made).
void check_format(WeightFormat fmt) {
    const bool fp8 = fmt == WeightFormat::kFp8, int4 = fmt == WeightFormat::kInt4;
    const int E = 16, K = 4, H = int4 ? 320 : fp8 ? 192 : 96, Ie = int4 ? 96 : 64;
    const char* f = fp8 ? "FP8" : int4 ? "int4" : "bf16";
    const double bound = fp8 || int4 ? 5e-4 : 1e-5;  // h; the down pass reads h as written: 1e-5 for all
    // uniform routing at 1, 6, 20, 40 tokens: the token tiles go 1, 1, 2, 4 (moe_stream's rule); FP8 rows
    // take the (2, 2) blocks at 1 and 6 tokens and the many-entry shapes at 20 and 40 (a mean of 5 and 10
    // entries an expert: MoeStream.Fp8ShapesFollowTheLabsRule)
    for (int n : {1, 6, 20, 40}) {
        const Errors e = run_case(
            fmt, n, K, E, H, Ie, [&](int t, int k) { return (t * 7 + k * 5 + (t * k) % 3) % E; },
            static_cast<uint32_t>(n));
        EXPECT_LT(e.h, bound) << f << ", " << n << " tokens: GeGLU";
        EXPECT_LT(e.slots, 1e-5) << f << ", " << n << " tokens: down";
    }
    // one busy expert, the others empty but one: 6 tokens with three slots each on expert 3 (18 entries at
    // one tile: passes of 8, 8, 2); 100 tokens with their first slot on expert 3 (4 tiles: 32, 32, 32, 4)
    for (int n : {6, 100}) {
        const Errors e = run_case(
            fmt, n, K, E, H, Ie,
            [&](int t, int k) { return n == 6 ? (k < 3 ? 3 : 9) : (k == 0 ? 3 : 9 + (t + k) % 3); },
            static_cast<uint32_t>(n + 1));
        EXPECT_LT(e.h, bound) << f << ", " << n << " tokens, one busy expert: GeGLU";
        EXPECT_LT(e.slots, 1e-5) << f << ", " << n << " tokens, one busy expert: down";
    }
}
#endif

// The block shapes moe_stream_shape picks (moe_stream_lab's winners, docs/performance.md): (2, 2) for bf16
// rows and for FP8 rows under a mean of 4 entries an expert; from there FP8's 64-row down blocks (4, 1),
// where H holds them, and gate/up rounds of three chunks (2, 3). check_format's FP8 counts reach both sides
// of it.
TEST(MoeStream, Fp8ShapesFollowTheLabsRule) {
#ifdef MARKBASE_HAS_CUDA
    auto is = [](cuda::MoeStreamShape s, int mt, int g) { return s.mt == mt && s.g == g; };
    EXPECT_TRUE(is(cuda::moe_stream_shape(true, false, 128, 8, 128, 2816), 2, 2));  // bf16: always
    EXPECT_TRUE(is(cuda::moe_stream_shape(false, false, 128, 8, 128, 704), 2, 2));
    EXPECT_TRUE(is(cuda::moe_stream_shape(true, true, 63, 8, 128, 2816), 2, 2));  // mean 3.9
    EXPECT_TRUE(is(cuda::moe_stream_shape(true, true, 64, 8, 128, 2816), 4, 1));  // mean 4
    EXPECT_TRUE(is(cuda::moe_stream_shape(false, true, 64, 8, 128, 704), 2, 3));
    EXPECT_TRUE(is(cuda::moe_stream_shape(true, true, 96, 8, 128, 2848), 2, 2));  // H % 64 != 0
    EXPECT_TRUE(is(cuda::moe_stream_shape(true, true, 6, 4, 16, 192), 2, 2));     // check_format's
    EXPECT_TRUE(is(cuda::moe_stream_shape(true, true, 20, 4, 16, 192), 4, 1));
    EXPECT_TRUE(is(cuda::moe_stream_shape(false, true, 40, 4, 16, 64), 2, 3));
#else
    GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(MoeStream, GeGluAndDownMatchTheFp64Products) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    check_format(WeightFormat::kBf16);
#endif
}

TEST(MoeStream, Fp8RowsMatchTheFp64ProductsOfTheirScaledCodes) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    check_format(WeightFormat::kFp8);
#endif
}

TEST(MoeStream, Int4RowsMatchTheFp64ProductsOfTheirGroups) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    check_format(WeightFormat::kInt4);
#endif
}

}  // namespace
}  // namespace markbase
