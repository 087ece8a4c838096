// float8 e4m3fn on the host (model/fp8.h) against the format's definition, computed here independently: every
// code's value, the round trip of every finite code, round-to-nearest-even between neighbouring codes,
// saturation at +-448, and the per-row quantisation's error bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "model/fp8.h"

namespace markbase {
namespace {

// e4m3fn by its definition: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is subnormal
// (m/8 * 2^-6); S.1111.111 is NaN; there are no infinities.
double spec_value(int c) {
    const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return NAN;
    const double mag = e == 0 ? m / 8.0 * std::pow(2.0, -6) : (1.0 + m / 8.0) * std::pow(2.0, e - 7);
    return s ? -mag : mag;
}

TEST(Fp8, EveryCodeDecodesToTheSpecValue) {
    for (int c = 0; c < 256; ++c) {
        const double want = spec_value(c);
        const float got = fp8_e4m3_to_float(static_cast<uint8_t>(c));
        if (std::isnan(want)) {
            EXPECT_TRUE(std::isnan(got)) << "code " << c;
        } else {
            EXPECT_EQ(static_cast<double>(got), want) << "code " << c;
            EXPECT_EQ(std::signbit(got), c >= 128) << "code " << c;
        }
    }
    EXPECT_EQ(fp8_e4m3_to_float(0x7e), 448.0f);
    EXPECT_EQ(fp8_e4m3_to_float(0xfe), -448.0f);
    EXPECT_EQ(fp8_e4m3_to_float(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
    EXPECT_EQ(fp8_e4m3_to_float(0x07), 7 * std::ldexp(1.0f, -9));
    EXPECT_EQ(fp8_e4m3_to_float(0x08), std::ldexp(1.0f, -6));  // smallest normal
    EXPECT_EQ(fp8_e4m3_to_float(0x38), 1.0f);
    EXPECT_EQ(fp8_e4m3_to_float(0xb8), -1.0f);
    EXPECT_EQ(fp8_e4m3_to_float(0x39), 1.125f);
    EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0x7f)));
    EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0xff)));
}

TEST(Fp8, EncodingADecodedCodeGivesTheCodeBack) {
    for (int c = 0; c < 256; ++c) {
        if (c == 0x7f || c == 0xff) continue;
        EXPECT_EQ(float_to_fp8_e4m3(fp8_e4m3_to_float(static_cast<uint8_t>(c))), c) << "code " << c;
    }
    EXPECT_EQ(float_to_fp8_e4m3(NAN), 0x7f);
}

TEST(Fp8, MidpointsRoundToTheEvenCodeAndEverythingElseToTheNearest) {
    for (int sign : {0, 0x80}) {
        for (int c = 0; c < 0x7e; ++c) {  // neighbours c, c + 1, both finite
            const double lo = spec_value(sign | c), hi = spec_value(sign | (c + 1));
            const float mid = static_cast<float>((lo + hi) / 2);  // exact: a few bits more than e4m3
            ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
            const int even = (c & 1) ? c + 1 : c;
            EXPECT_EQ(float_to_fp8_e4m3(mid), sign | even) << "tie between codes " << c << " and " << c + 1;
            const float toward_lo = std::nextafter(mid, static_cast<float>(lo));
            const float toward_hi = std::nextafter(mid, static_cast<float>(hi));
            EXPECT_EQ(float_to_fp8_e4m3(toward_lo), sign | c) << "just past the tie, toward code " << c;
            EXPECT_EQ(float_to_fp8_e4m3(toward_hi), sign | (c + 1)) << "just past the tie, toward " << c + 1;
        }
    }
}

TEST(Fp8, RandomValuesEncodeToTheNearestCode) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> exp_dist(-12.0f, 9.5f);
    for (int i = 0; i < 20000; ++i) {
        const float x = std::exp2(exp_dist(rng)) * ((rng() & 1) ? -1.0f : 1.0f);
        const uint8_t got = float_to_fp8_e4m3(x);
        const double err = std::fabs(spec_value(got) - x);
        for (int c = 0; c < 256; ++c) {
            if (c == 0x7f || c == 0xff) continue;
            ASSERT_LE(err, std::fabs(spec_value(c) - x))
                << x << " -> code " << int(got) << ", code " << c << " is nearer";
        }
    }
}

TEST(Fp8, SaturatesAtPlusMinus448) {
    for (float x : {448.0f, 449.0f, 463.99f, 464.0f, 480.0f, 1e6f, 3.4e38f, INFINITY})
        EXPECT_EQ(float_to_fp8_e4m3(x), 0x7e) << x;
    for (float x : {-448.0f, -464.0f, -1e6f, -INFINITY}) EXPECT_EQ(float_to_fp8_e4m3(x), 0xfe) << x;
    EXPECT_EQ(float_to_fp8_e4m3(0.0f), 0x00);
    EXPECT_EQ(float_to_fp8_e4m3(-0.0f), 0x80);
    EXPECT_EQ(float_to_fp8_e4m3(std::ldexp(1.0f, -10)), 0x00);  // half the smallest subnormal: tie to 0
    EXPECT_EQ(float_to_fp8_e4m3(std::ldexp(1.5f, -10)), 0x01);  // past it
}

// The spacing of e4m3 values around |y|: 2^(e - 3) in the binade [2^e, 2^(e+1)), 2^-9 below 2^-6.
double step_at(double y) {
    const double a = std::fabs(y);
    if (a < std::ldexp(1.0, -6)) return std::ldexp(1.0, -9);
    int e = 0;
    std::frexp(a, &e);
    return std::ldexp(1.0, e - 1 - 3);
}

TEST(Fp8, RowQuantisationErrorIsAtMostHalfAStepOfTheRowsScale) {
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const int64_t K = 1000;
    for (float spread : {1e-6f, 0.02f, 1.0f, 300.0f}) {
        std::vector<bf16> w(K);
        for (auto& v : w) v = float_to_bf16(normal(rng) * spread);
        w[17] = float_to_bf16(8 * spread);  // an outlier sets the scale
        std::vector<uint8_t> q(K);
        std::vector<bf16> deq(K);
        const float scale = quantize_row_fp8(w.data(), K, q.data());
        EXPECT_EQ(scale, bf16_to_float(w[17]) / 448.0f);
        EXPECT_EQ(q[17], 0x7e) << "the largest weight maps to 448";
        dequantize_row_fp8(q.data(), scale, K, deq.data());
        double worst = 0;
        for (int64_t k = 0; k < K; ++k) {
            const double x = bf16_to_float(w[k]);
            const double got = fp8_e4m3_to_float(q[k]) * static_cast<double>(scale);
            const double bound =
                0.5 * step_at(x / scale) * scale * (1 + 1e-6);  // w/scale rounds once in fp32
            EXPECT_LE(std::fabs(x - got), bound) << "spread " << spread << ", k " << k;
            worst = std::max(worst, std::fabs(x - got));
            EXPECT_EQ(deq[k], float_to_bf16(fp8_e4m3_to_float(q[k]) * scale)) << k;
        }
        EXPECT_LE(worst, 16.0 * scale) << "half the widest step (32, between 256 and 448)";
    }
    std::vector<bf16> zeros(8, 0);
    std::vector<uint8_t> q(8, 0xaa);
    EXPECT_EQ(quantize_row_fp8(zeros.data(), 8, q.data()), 1.0f);
    for (uint8_t v : q) EXPECT_EQ(v, 0);
}

}  // namespace
}  // namespace markbase
