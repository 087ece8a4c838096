#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "cpu/matmul.h"
#include "cpu/memory_bandwidth.h"
#include "model/error.h"
#include "support/random_values.h"

namespace markbase::cpu {

// gtest prints a SimdPath parameter by name (found by ADL, hence outside the anonymous namespace).
static void PrintTo(SimdPath path, std::ostream* os) {
    *os << simd_path_name(path);
}

namespace {

using testing::random_bf16;
using testing::random_floats;

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

bool contains(const std::vector<SimdPath>& paths, SimdPath p) {
    return std::find(paths.begin(), paths.end(), p) != paths.end();
}

// What this CPU runs, asked independently of matmul.cpp.
#if defined(__x86_64__)
bool cpu_has_avx2() {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
bool cpu_has_avx512() {
    return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
}
#endif

TEST(Matmul, ReportsSimdPath) {
    SimdPath expected = SimdPath::Scalar;
#if defined(__x86_64__)
    if (cpu_has_avx512()) {
        expected = SimdPath::Avx512;
    } else if (cpu_has_avx2()) {
        expected = SimdPath::Avx2;
    }
#endif
    EXPECT_EQ(best_simd_path(), expected) << simd_path_name(best_simd_path());
    EXPECT_STREQ(matmul_simd_path(), simd_path_name(expected));
    EXPECT_EQ(supported_simd_paths().back(), best_simd_path());
}

// A build that leaves out a path this machine runs (a CMake condition gone wrong) fails here.
TEST(Matmul, SupportsEveryPathTheCpuRuns) {
    const std::vector<SimdPath> paths = supported_simd_paths();
    ASSERT_FALSE(paths.empty());
    EXPECT_EQ(paths.front(), SimdPath::Scalar);
#if defined(__x86_64__)
    EXPECT_EQ(contains(paths, SimdPath::Avx2), cpu_has_avx2());
    EXPECT_EQ(contains(paths, SimdPath::Avx512), cpu_has_avx512());
#else
    EXPECT_EQ(paths.size(), 1u);
#endif
}

TEST(Matmul, UnsupportedPathThrows) {
    ThreadPool pool(1);
    const std::vector<SimdPath> paths = supported_simd_paths();
    const float x[2] = {1.0f, 2.0f};
    const bf16 wb[2] = {float_to_bf16(1.0f), float_to_bf16(1.0f)};
    float y[1] = {0.0f};
    for (SimdPath p : {SimdPath::Scalar, SimdPath::Avx2, SimdPath::Avx512, static_cast<SimdPath>(7)}) {
        if (contains(paths, p)) continue;
        EXPECT_THROW(matmul_bf16_on(p, pool, x, 1, 2, wb, 1, y), Error) << simd_path_name(p);
        EXPECT_THROW(matmul_f32_on(p, pool, x, 1, 2, x, 1, y), Error) << simd_path_name(p);
        const float* rows[1] = {x};
        EXPECT_THROW(attn_scores_on(p, x, 2, 1, rows, 1, 2, y, 1), Error) << simd_path_name(p);
        EXPECT_THROW(attn_values_on(p, x, 2, 1, rows, 1, 1, y, 1), Error) << simd_path_name(p);
        EXPECT_THROW(matmul_kernels_name(p), Error) << simd_path_name(p);
    }
}

// matmul_bf16, matmul_f32 and attn_scores run the best path: the same bits as asking for it.
TEST(Matmul, DefaultEntryPointsRunTheBestPath) {
    ThreadPool pool(2);
    const SimdPath best = best_simd_path();
    const int64_t n = 3, in = 37, out = 21;
    const auto x = random_floats(static_cast<size_t>(n * in), 41);
    const auto wb = random_bf16(static_cast<size_t>(out * in), 42);
    const auto wf = random_floats(static_cast<size_t>(out * in), 43);
    std::vector<float> y(static_cast<size_t>(n * out)), yp(y.size());
    matmul_bf16(pool, x.data(), n, in, wb.data(), out, y.data());
    matmul_bf16_on(best, pool, x.data(), n, in, wb.data(), out, yp.data());
    EXPECT_EQ(y, yp);
    matmul_f32(pool, x.data(), n, in, wf.data(), out, y.data());
    matmul_f32_on(best, pool, x.data(), n, in, wf.data(), out, yp.data());
    EXPECT_EQ(y, yp);
    const float* rows[2] = {wf.data(), wf.data() + in};
    std::vector<float> a(6), b(6);
    attn_scores(x.data(), in, 3, rows, 2, in, a.data(), 2);
    attn_scores_on(best, x.data(), in, 3, rows, 2, in, b.data(), 2);
    EXPECT_EQ(a, b);
}

// Every test below runs on every path in supported_simd_paths(): Matmul/MatmulOnPath.<test>/<path>.
class MatmulOnPath : public ::testing::TestWithParam<SimdPath> {};

std::string path_param_name(const ::testing::TestParamInfo<SimdPath>& param) {
    return simd_path_name(param.param);
}

INSTANTIATE_TEST_SUITE_P(Matmul, MatmulOnPath, ::testing::ValuesIn(supported_simd_paths()), path_param_name);

// The kernels the dispatch hands out for a path were compiled as that path: their name is a literal of the TU
// that compiled them (matmul_avx2.cpp, matmul_avx512.cpp, matmul.cpp for scalar).
TEST_P(MatmulOnPath, KernelsAreThePathTheySay) {
    EXPECT_STREQ(matmul_kernels_name(GetParam()), simd_path_name(GetParam()));
}

// in: below one vector, tails of 1..15 against 8 and 16 lanes, exact multiples; out: not multiples of the
// tile rows (3 or 4) nor of the GEMV rows (8 or 16); n: GEMV, direct tiles with token tails, blocked.
TEST_P(MatmulOnPath, Bf16MatchesDoubleReferenceOnOddShapes) {
    ThreadPool pool(3);
    uint32_t seed = 1;
    for (int64_t in : {1, 3, 17, 23, 40, 1000, 2816}) {
        for (int64_t out : {1, 7, 35, 129}) {
            for (int64_t n : {1, 2, 3, 4, 5, 33, 70}) {
                const auto x = random_floats(static_cast<size_t>(n * in), seed++);
                const auto w = random_bf16(static_cast<size_t>(out * in), seed++);
                std::vector<float> y(static_cast<size_t>(n * out), NAN);
                matmul_bf16_on(GetParam(), pool, x.data(), n, in, w.data(), out, y.data());
                expect_matches_reference(x, n, in, w, out, y, simd_path_name(GetParam()));
            }
        }
    }
}

// Crosses every blocking boundary of the prefill path: several token tiles, input blocks and row groups,
// with tails in each, and a weight too small to go parallel.
TEST_P(MatmulOnPath, Bf16PrefillBlockBoundaries) {
    ThreadPool pool(2);
    const int64_t cases[][3] = {{130, 1537, 67}, {70, 512, 32}, {64, 513, 33}, {6, 5, 3},
                                {4, 16, 4},      {3, 2048, 9},  {70, 1031, 97}};
    uint32_t seed = 100;
    for (const auto& c : cases) {
        const int64_t n = c[0], in = c[1], out = c[2];
        const auto x = random_floats(static_cast<size_t>(n * in), seed++);
        const auto w = random_bf16(static_cast<size_t>(out * in), seed++);
        std::vector<float> y(static_cast<size_t>(n * out), NAN);
        matmul_bf16_on(GetParam(), pool, x.data(), n, in, w.data(), out, y.data());
        expect_matches_reference(x, n, in, w, out, y, simd_path_name(GetParam()));
    }
}

// The widest input of any Gemma 4 projection (31B's MLP down_proj): fp32 accumulation holds 1e-5.
TEST_P(MatmulOnPath, Bf16LongInput) {
    ThreadPool pool(2);
    const int64_t in = 21504, out = 9;
    for (int64_t n : {1, 6}) {
        const auto x = random_floats(static_cast<size_t>(n * in), 7);
        const auto w = random_bf16(static_cast<size_t>(out * in), 8);
        std::vector<float> y(static_cast<size_t>(n * out), NAN);
        matmul_bf16_on(GetParam(), pool, x.data(), n, in, w.data(), out, y.data());
        expect_matches_reference(x, n, in, w, out, y, simd_path_name(GetParam()));
    }
}

// matmul_bf16_rowwise: each row of y has the bits of that row computed alone (n = 1, a lone sequence's
// decode) at every n, direct or past the blocked kernel's threshold, and whatever tile a row falls in (out
// not a multiple of the tile or GEMV rows).
TEST_P(MatmulOnPath, RowwiseRowsAreEachRowAlone) {
    ThreadPool pool(2);
    uint32_t seed = 900;
    for (int64_t in : {17, 256, 2816}) {
        for (int64_t out : {1, 7, 35, 129, 256}) {
            for (int64_t n : {1, 2, 3, 5, 8, 33}) {
                const auto x = random_floats(static_cast<size_t>(n * in), seed++);
                const auto w = random_bf16(static_cast<size_t>(out * in), seed++);
                std::vector<float> y(static_cast<size_t>(n * out), NAN), alone(static_cast<size_t>(out), NAN);
                matmul_bf16_rowwise_on(GetParam(), pool, x.data(), n, in, w.data(), out, y.data());
                for (int64_t t = 0; t < n; ++t) {
                    matmul_bf16_on(GetParam(), pool, x.data() + t * in, 1, in, w.data(), out, alone.data());
                    ASSERT_EQ(std::memcmp(alone.data(), y.data() + t * out, sizeof(float) * out), 0)
                        << "n=" << n << " in=" << in << " out=" << out << " row " << t;
                }
            }
        }
    }
}

TEST_P(MatmulOnPath, ResultDoesNotDependOnThreadCount) {
    const int64_t n = 5, in = 300, out = 257;
    const auto x = random_floats(static_cast<size_t>(n * in), 11);
    const auto w = random_bf16(static_cast<size_t>(out * in), 12);
    std::vector<float> first;
    for (int threads : {1, 2, 3, 8}) {
        ThreadPool pool(threads);
        std::vector<float> y(static_cast<size_t>(n * out), NAN);
        matmul_bf16_on(GetParam(), pool, x.data(), n, in, w.data(), out, y.data());
        if (first.empty()) {
            first = y;
        } else {
            EXPECT_EQ(y, first) << threads << " threads";
        }
    }
}

TEST_P(MatmulOnPath, F32WeightMatchesDoubleReference) {
    ThreadPool pool(2);
    uint32_t seed = 500;
    for (int64_t in : {1, 17, 23, 1000}) {
        for (int64_t out : {1, 7, 35, 129}) {
            for (int64_t n : {1, 2, 3, 4, 5, 33, 70}) {
                const auto x = random_floats(static_cast<size_t>(n * in), seed++);
                const auto w = random_floats(static_cast<size_t>(out * in), seed++);
                std::vector<float> y(static_cast<size_t>(n * out), NAN);
                matmul_f32_on(GetParam(), pool, x.data(), n, in, w.data(), out, y.data());
                expect_matches_reference(x, n, in, w, out, y, simd_path_name(GetParam()));
            }
        }
    }
}

// Attention's products over a block of queries: each within fp32 rounding of the double-precision value, and
// each query's row identical whatever the block's shape (m queries, nk keys: the prompt attention's blocks
// rely on it), the d tail (d = 37) included; nothing past m rows or d columns written.
TEST_P(MatmulOnPath, AttnScoresAndValues) {
    for (int64_t d : {int64_t{37}, int64_t{256}}) {
        const int m = 7, nk = 11;
        const auto q = random_floats(static_cast<size_t>(m * d), 25);
        const auto kv = random_floats(static_cast<size_t>(nk * d), 26);
        const auto p = random_floats(static_cast<size_t>(m * nk), 27);
        std::vector<const float*> rows(nk);
        for (int j = 0; j < nk; ++j) rows[j] = kv.data() + j * d;
        std::vector<float> s(static_cast<size_t>(m * nk + 1), -1.0f),
            o(static_cast<size_t>(m * d + 1), -1.0f);
        attn_scores_on(GetParam(), q.data(), d, m, rows.data(), nk, d, s.data(), nk);
        attn_values_on(GetParam(), p.data(), nk, m, rows.data(), nk, d, o.data(), d);
        EXPECT_EQ(s.back(), -1.0f) << "scores written past m x nk";
        EXPECT_EQ(o.back(), -1.0f) << "values written past m x d";
        for (int i = 0; i < m; ++i) {
            for (int j = 0; j < nk; ++j) {
                double ref = 0, mag = 0;
                for (int64_t c = 0; c < d; ++c) {
                    ref += static_cast<double>(q[i * d + c]) * kv[j * d + c];
                    mag += std::fabs(static_cast<double>(q[i * d + c]) * kv[j * d + c]);
                }
                EXPECT_NEAR(s[i * nk + j], ref, 1e-5 * mag) << "d " << d << ", score " << i << ", " << j;
                float one = 0.0f;  // the same pair alone
                attn_scores_on(GetParam(), q.data() + i * d, d, 1, rows.data() + j, 1, d, &one, 1);
                ASSERT_EQ(one, s[i * nk + j]) << "d " << d << ", score " << i << ", " << j << " alone";
            }
            for (int64_t u = 0; u < d; ++u) {
                double ref = 0, mag = 0;
                for (int j = 0; j < nk; ++j) {
                    ref += static_cast<double>(p[i * nk + j]) * kv[j * d + u];
                    mag += std::fabs(static_cast<double>(p[i * nk + j]) * kv[j * d + u]);
                }
                EXPECT_NEAR(o[i * d + u], ref, 1e-5 * mag) << "d " << d << ", value " << i << ", " << u;
            }
            std::vector<float> alone(
                static_cast<size_t>(d));  // the query's row alone, with zero weights past
            std::vector<float> pw(p.begin() + i * nk, p.begin() + (i + 1) * nk);  // its 6 keys
            for (int j = 6; j < nk; ++j) pw[j] = 0.0f;
            attn_values_on(GetParam(), pw.data(), nk, 1, rows.data(), nk, d, alone.data(), d);
            std::vector<float> six(static_cast<size_t>(d));
            attn_values_on(GetParam(), pw.data(), 6, 1, rows.data(), 6, d, six.data(), d);
            ASSERT_EQ(alone, six) << "d " << d << ", row " << i << ": zero weights changed it";
            std::vector<float> whole(o.begin() + i * d, o.begin() + (i + 1) * d);
            attn_values_on(GetParam(), p.data() + i * nk, nk, 1, rows.data(), nk, d, alone.data(), d);
            ASSERT_EQ(alone, whole) << "d " << d << ", row " << i << " alone";
        }
    }
}

TEST_P(MatmulOnPath, PropagatesNonFiniteInputs) {
    ThreadPool pool(2);
    const int64_t n = 2, in = 40, out = 8;
    auto x = random_floats(static_cast<size_t>(n * in), 31);
    const auto w = random_bf16(static_cast<size_t>(out * in), 32);
    x[in + 39] = INFINITY;  // token 1, the masked tail of the input on 16 lanes
    std::vector<float> y(static_cast<size_t>(n * out));
    matmul_bf16_on(GetParam(), pool, x.data(), n, in, w.data(), out, y.data());
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
