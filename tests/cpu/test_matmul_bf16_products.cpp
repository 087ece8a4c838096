// The bf16 prompt products (cpu/matmul.h PromptProducts::kBf16) on every unit this CPU has (vdpbf16ps, AMX)
// and on the scalar model of the AMX unit (its tile loop, everywhere): x rounded to bf16 once, so
// each product is exact on the rounded x and only the fp32 sums round. Held to a double-precision reference
// over the rounded x at 1e-5 of sum |x w| (the exact products' bound), which the unrounded x would miss by
// ~100x: a kernel that skipped the rounding, mixed up a pair's halves or a token's column fails it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cpu/matmul.h"
#include "model/bf16.h"
#include "model/error.h"
#include "support/random_values.h"

namespace markbase::cpu {
namespace {

using testing::random_bf16;
using testing::random_floats;

// The largest |y - reference| / sum |x w| over every output, the reference in double over x rounded to bf16
// (round_x) or as given.
double worst_error(const std::vector<float>& x, int64_t n, int64_t in, const std::vector<bf16>& w,
                   int64_t out, const std::vector<float>& y, bool round_x) {
    double worst = 0;
    for (int64_t t = 0; t < n; ++t)
        for (int64_t o = 0; o < out; ++o) {
            double ref = 0, mag = 0;
            for (int64_t i = 0; i < in; ++i) {
                const float xi = x[t * in + i];
                const double p =
                    double(round_x ? bf16_to_float(float_to_bf16(xi)) : xi) * bf16_to_float(w[o * in + i]);
                ref += p;
                mag += std::fabs(p);
            }
            const float got = y[t * out + o];
            worst = std::max(worst, std::isfinite(got) ? std::fabs(got - ref) / mag : INFINITY);
        }
    return worst;
}

constexpr const char* kNoBf16 = "this CPU has no AVX-512-BF16: the bf16 prompt products run the exact ones";

// Every unit the bf16 products can run on here (the scalar model of the AMX unit everywhere).
class PairProducts : public ::testing::TestWithParam<PairPath> {};

INSTANTIATE_TEST_SUITE_P(Units, PairProducts, ::testing::ValuesIn(supported_pair_paths()),
                         [](const ::testing::TestParamInfo<PairPath>& i) {
                             std::string name = pair_path_name(i.param);
                             for (char& ch : name)
                                 if (ch == '-') ch = '_';
                             return name;
                         });

// Shapes crossing the 64-token tiles and their 32-token halves, the 1,024-input blocks, the groups of 6 or
// 32 rows (a tail of 8 rows past a whole group, groups of fewer rows than one tile), with tails; at any n.
TEST_P(PairProducts, ExactOnTheRoundedInputs) {
    ThreadPool pool(3);
    const int64_t cases[][3] = {{130, 2112, 67}, {70, 1056, 97}, {48, 1536, 13}, {200, 2048, 7},
                                {65, 1088, 40},  {5, 64, 3},     {33, 96, 33}};
    uint32_t seed = 300;
    for (const auto& c : cases) {
        const int64_t n = c[0], in = c[1], out = c[2];
        const auto x = random_floats(static_cast<size_t>(n * in), seed++);
        const auto w = random_bf16(static_cast<size_t>(out * in), seed++);
        std::vector<float> y(static_cast<size_t>(n * out), NAN);
        matmul_bf16_pairs_on(GetParam(), pool, x.data(), n, in, w.data(), out, y.data());
        EXPECT_LE(worst_error(x, n, in, w, out, y, true), 1e-5)
            << "n=" << n << " in=" << in << " out=" << out;
        // and the rounding is really there: against the unrounded x the error is x's rounding (~2^-9 of a
        // product, more than 1e-4 of the sum's magnitude here)
        EXPECT_GT(worst_error(x, n, in, w, out, y, false), 1e-4) << "n=" << n << " in=" << in;
    }
}

TEST_P(PairProducts, ResultDoesNotDependOnThreadCount) {
    const int64_t n = 100, in = 2304, out = 257;
    const auto x = random_floats(static_cast<size_t>(n * in), 11);
    const auto w = random_bf16(static_cast<size_t>(out * in), 12);
    std::vector<float> first;
    for (int threads : {1, 2, 5}) {
        ThreadPool pool(threads);
        std::vector<float> y(static_cast<size_t>(n * out), NAN);
        matmul_bf16_pairs_on(GetParam(), pool, x.data(), n, in, w.data(), out, y.data());
        if (first.empty())
            first = y;
        else
            EXPECT_EQ(y, first) << threads << " threads";
    }
}

// A NaN or an infinity in one token's x makes that token's outputs non-finite and leaves the others alone.
TEST_P(PairProducts, NonFiniteInputsStayInTheirRow) {
    ThreadPool pool(2);
    const int64_t n = 96, in = 1024, out = 20;
    auto x = random_floats(static_cast<size_t>(n * in), 21);
    const auto w = random_bf16(static_cast<size_t>(out * in), 22);
    x[5 * in + 17] = NAN;
    x[70 * in + 1000] = INFINITY;
    std::vector<float> y(static_cast<size_t>(n * out), 0.0f);
    matmul_bf16_pairs_on(GetParam(), pool, x.data(), n, in, w.data(), out, y.data());
    for (int64_t t = 0; t < n; ++t)
        for (int64_t o = 0; o < out; ++o)
            EXPECT_EQ(std::isfinite(y[t * out + o]), t != 5 && t != 70) << "t=" << t << " o=" << o;
}

// The AMX tile loop takes whole tiles of 32 inputs; vdpbf16ps's pairs also take a tail of fewer than 16.
TEST_P(PairProducts, InputsTheUnitCannotTakeAreAClearError) {
    ThreadPool pool(1);
    const int64_t n = 70, out = 5;
    for (int64_t in : {1058, 1057}) {
        const auto x = random_floats(static_cast<size_t>(n * in), 31);
        const auto w = random_bf16(static_cast<size_t>(out * in), 32);
        std::vector<float> y(static_cast<size_t>(n * out), NAN);
        const bool takes = in % 2 == 0 && GetParam() == PairPath::kDot;
        if (takes) {
            matmul_bf16_pairs_on(GetParam(), pool, x.data(), n, in, w.data(), out, y.data());
            EXPECT_LE(worst_error(x, n, in, w, out, y, true), 1e-5) << "in=" << in;
        } else {
            try {
                matmul_bf16_pairs_on(GetParam(), pool, x.data(), n, in, w.data(), out, y.data());
                ADD_FAILURE() << "in=" << in << " accepted";
            } catch (const Error& e) {
                EXPECT_NE(std::string(e.what()).find(std::to_string(in)), std::string::npos) << e.what();
            }
        }
    }
}

// The products' entry point takes the unit this CPU has, past the direct regime.
TEST(MatmulBf16Products, TheEntryPointRunsThem) {
    if (!bf16_products_supported()) GTEST_SKIP() << kNoBf16;
    ThreadPool pool(2);
    const int64_t n = 130, in = 2112, out = 67;
    const auto x = random_floats(static_cast<size_t>(n * in), 41);
    const auto w = random_bf16(static_cast<size_t>(out * in), 42);
    std::vector<float> y(static_cast<size_t>(n * out), NAN);
    matmul_bf16(pool, x.data(), n, in, w.data(), out, y.data(), PromptProducts::kBf16);
    EXPECT_LE(worst_error(x, n, in, w, out, y, true), 1e-5);
    EXPECT_GT(worst_error(x, n, in, w, out, y, false), 1e-4);
}

// Odd inputs cannot be paired: those products stay exact. Short batches (the direct regime) too.
TEST(MatmulBf16Products, OddInputsAndShortBatchesStayExact) {
    ThreadPool pool(2);
    const int64_t cases[][3] = {{130, 1537, 67}, {4, 2048, 9}, {40, 1024, 5}};
    uint32_t seed = 400;
    for (const auto& c : cases) {
        const int64_t n = c[0], in = c[1], out = c[2];
        const auto x = random_floats(static_cast<size_t>(n * in), seed++);
        const auto w = random_bf16(static_cast<size_t>(out * in), seed++);
        std::vector<float> y(static_cast<size_t>(n * out), NAN), exact(y.size(), NAN);
        matmul_bf16(pool, x.data(), n, in, w.data(), out, y.data(), PromptProducts::kBf16);
        matmul_bf16(pool, x.data(), n, in, w.data(), out, exact.data(), PromptProducts::kExact);
        EXPECT_EQ(y, exact) << "n=" << n << " in=" << in;
    }
}

// The selected unit's ceiling loop counts its own flops (AMX: four 16 x 16 x 32 tile products a round;
// vdpbf16ps: 16 chains x 16 lanes x 2 multiply-adds), and is absent where there is none.
TEST(MatmulBf16Products, PeakLoopCountsItsFlops) {
    if (!bf16_products_supported()) {
        EXPECT_EQ(bf16_peak_rounds(10), 0.0);
        EXPECT_FALSE(bf16_products_faster());
        GTEST_SKIP() << kNoBf16;
    }
    const auto paths = supported_pair_paths();
    const bool amx = std::find(paths.begin(), paths.end(), PairPath::kAmx) != paths.end();
    EXPECT_EQ(bf16_peak_rounds(10), amx ? 10.0 * 4 * 2 * 16 * 16 * 32 : 10.0 * 16 * 16 * 4);
}

}  // namespace
}  // namespace markbase::cpu
