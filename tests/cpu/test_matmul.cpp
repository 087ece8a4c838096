#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

#include "cpu/matmul.h"
#include "cpu/memory_bandwidth.h"

namespace markbase::cpu {
namespace {

// Random inputs, never zeros: uniform in +-[0.05, 1) with a random sign.
std::vector<float> random_floats(size_t count, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> mag(0.05f, 1.0f);
    std::vector<float> v(count);
    for (auto& f : v) f = (rng() & 1u) ? mag(rng) : -mag(rng);
    return v;
}

std::vector<bf16> random_bf16(size_t count, uint32_t seed) {
    std::vector<float> f = random_floats(count, seed);
    std::vector<bf16> v(count);
    for (size_t i = 0; i < count; ++i) v[i] = float_to_bf16(f[i]);
    return v;
}

float to_float(float v) {
    return v;
}
float to_float(bf16 v) {
    return bf16_to_float(v);
}

// Compares y against a double-precision reference; the tolerance scales with sum_i |x||w| of each output, the
// size of the rounding errors an fp32 accumulation can make.
template <class WT>
void expect_matches_reference(const std::vector<float>& x, int64_t n, int64_t in, const std::vector<WT>& w,
                              int64_t out, const std::vector<float>& y, const char* what) {
    ASSERT_EQ(y.size(), static_cast<size_t>(n * out));
    for (int64_t t = 0; t < n; ++t) {
        for (int64_t o = 0; o < out; ++o) {
            double ref = 0, mag = 0;
            for (int64_t i = 0; i < in; ++i) {
                const double p = static_cast<double>(x[t * in + i]) * to_float(w[o * in + i]);
                ref += p;
                mag += std::fabs(p);
            }
            const float got = y[t * out + o];
            ASSERT_TRUE(std::isfinite(got)) << what << " t=" << t << " o=" << o;
            const double tol = 1e-5 * mag + 1e-30;
            ASSERT_NEAR(got, ref, tol)
                << what << " n=" << n << " in=" << in << " out=" << out << " t=" << t << " o=" << o;
        }
    }
}

TEST(Matmul, ReportsSimdPath) {
    const std::string path = matmul_simd_path();
    EXPECT_TRUE(path == "avx512" || path == "avx2" || path == "scalar") << path;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
    EXPECT_EQ(path, "avx512");
#elif defined(__AVX2__) && defined(__FMA__)
    EXPECT_EQ(path, "avx2");
#endif
}

TEST(Matmul, Bf16MatchesDoubleReferenceOnOddShapes) {
    ThreadPool pool(3);
    uint32_t seed = 1;
    for (int64_t in : {1, 3, 17, 1000, 2816}) {
        for (int64_t out : {1, 7, 129}) {
            for (int64_t n : {1, 2, 5, 33}) {
                const auto x = random_floats(static_cast<size_t>(n * in), seed++);
                const auto w = random_bf16(static_cast<size_t>(out * in), seed++);
                std::vector<float> y(static_cast<size_t>(n * out), NAN), ys(y.size(), NAN);
                matmul_bf16(pool, x.data(), n, in, w.data(), out, y.data());
                expect_matches_reference(x, n, in, w, out, y, matmul_simd_path());
                matmul_bf16_scalar(pool, x.data(), n, in, w.data(), out, ys.data());
                expect_matches_reference(x, n, in, w, out, ys, "scalar");
            }
        }
    }
}

// Crosses every blocking boundary of the prefill path: several token blocks, input blocks and row blocks,
// with tails in each, and a weight too small to go parallel.
TEST(Matmul, Bf16PrefillBlockBoundaries) {
    ThreadPool pool(2);
    const int64_t cases[][3] = {{130, 1537, 67}, {70, 512, 32}, {64, 513, 33},
                                {6, 5, 3},       {4, 16, 4},    {3, 2048, 9}};
    uint32_t seed = 100;
    for (const auto& c : cases) {
        const int64_t n = c[0], in = c[1], out = c[2];
        const auto x = random_floats(static_cast<size_t>(n * in), seed++);
        const auto w = random_bf16(static_cast<size_t>(out * in), seed++);
        std::vector<float> y(static_cast<size_t>(n * out), NAN), ys(y.size(), NAN);
        matmul_bf16(pool, x.data(), n, in, w.data(), out, y.data());
        expect_matches_reference(x, n, in, w, out, y, matmul_simd_path());
        matmul_bf16_scalar(pool, x.data(), n, in, w.data(), out, ys.data());
        expect_matches_reference(x, n, in, w, out, ys, "scalar");
    }
}

// The widest input of any Gemma 4 projection (31B's MLP down_proj): fp32 accumulation holds 1e-5.
TEST(Matmul, Bf16LongInput) {
    ThreadPool pool(2);
    const int64_t in = 21504, out = 9;
    for (int64_t n : {1, 6}) {
        const auto x = random_floats(static_cast<size_t>(n * in), 7);
        const auto w = random_bf16(static_cast<size_t>(out * in), 8);
        std::vector<float> y(static_cast<size_t>(n * out), NAN), ys(y.size(), NAN);
        matmul_bf16(pool, x.data(), n, in, w.data(), out, y.data());
        expect_matches_reference(x, n, in, w, out, y, matmul_simd_path());
        matmul_bf16_scalar(pool, x.data(), n, in, w.data(), out, ys.data());
        expect_matches_reference(x, n, in, w, out, ys, "scalar");
    }
}

TEST(Matmul, ResultDoesNotDependOnThreadCount) {
    const int64_t n = 5, in = 300, out = 257;
    const auto x = random_floats(static_cast<size_t>(n * in), 11);
    const auto w = random_bf16(static_cast<size_t>(out * in), 12);
    std::vector<float> first;
    for (int threads : {1, 2, 3, 8}) {
        ThreadPool pool(threads);
        std::vector<float> y(static_cast<size_t>(n * out), NAN);
        matmul_bf16(pool, x.data(), n, in, w.data(), out, y.data());
        if (first.empty()) {
            first = y;
        } else {
            EXPECT_EQ(y, first) << threads << " threads";
        }
    }
}

TEST(Matmul, F32WeightMatchesDoubleReference) {
    ThreadPool pool(2);
    uint32_t seed = 500;
    for (int64_t in : {1, 17, 1000}) {
        for (int64_t out : {1, 7, 129}) {
            for (int64_t n : {1, 5, 33}) {
                const auto x = random_floats(static_cast<size_t>(n * in), seed++);
                const auto w = random_floats(static_cast<size_t>(out * in), seed++);
                std::vector<float> y(static_cast<size_t>(n * out), NAN), ys(y.size(), NAN);
                matmul_f32(pool, x.data(), n, in, w.data(), out, y.data());
                expect_matches_reference(x, n, in, w, out, y, matmul_simd_path());
                matmul_f32_scalar(pool, x.data(), n, in, w.data(), out, ys.data());
                expect_matches_reference(x, n, in, w, out, ys, "scalar");
            }
        }
    }
}

TEST(Matmul, DotF32) {
    for (int64_t n : {1, 3, 15, 16, 17, 64, 65, 1000, 21504}) {
        const auto a = random_floats(static_cast<size_t>(n), 21);
        const auto b = random_floats(static_cast<size_t>(n), 22);
        double ref = 0, mag = 0;
        for (int64_t i = 0; i < n; ++i) {
            ref += static_cast<double>(a[i]) * b[i];
            mag += std::fabs(static_cast<double>(a[i]) * b[i]);
        }
        EXPECT_NEAR(dot_f32(a.data(), b.data(), n), ref, 1e-5 * mag) << n;
        EXPECT_NEAR(dot_f32_scalar(a.data(), b.data(), n), ref, 1e-5 * mag) << n;
    }
    EXPECT_EQ(dot_f32(nullptr, nullptr, 0), 0.0f);
}

TEST(Matmul, PropagatesNonFiniteInputs) {
    ThreadPool pool(2);
    const int64_t n = 2, in = 40, out = 8;
    auto x = random_floats(static_cast<size_t>(n * in), 31);
    const auto w = random_bf16(static_cast<size_t>(out * in), 32);
    x[in + 39] = INFINITY;  // token 1, the masked tail of the input
    std::vector<float> y(static_cast<size_t>(n * out));
    matmul_bf16(pool, x.data(), n, in, w.data(), out, y.data());
    for (int64_t o = 0; o < out; ++o) {
        EXPECT_TRUE(std::isfinite(y[o]));
        EXPECT_TRUE(std::isinf(y[out + o]));
    }
}

// Not a test: `markbase_tests --gtest_also_run_disabled_tests --gtest_filter='*MatmulBench*'` prints the
// numbers (MARKBASE_BENCH_THREADS=k for a pool of k threads; all hardware threads by default).
TEST(Matmul, DISABLED_MatmulBench) {
    const char* env = std::getenv("MARKBASE_BENCH_THREADS");
    ThreadPool pool(env ? std::atoi(env) : 0);
    run_matmul_bench(pool);
}

TEST(Matmul, ReadBandwidthIsPositive) {
    ThreadPool pool(2);
    const BandwidthResult r = measure_read_bandwidth(pool, size_t{16} << 20);
    EXPECT_GT(r.read_gbs, 0.1);
    EXPECT_EQ(r.threads, 2);
    EXPECT_EQ(r.bytes, double(size_t{16} << 20));
}

}  // namespace
}  // namespace markbase::cpu
