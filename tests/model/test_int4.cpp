// int4 on the host (model/int4.h) against compressed-tensors' rules, checked here by hand: the packing order
// (weights along a row, zero points along the output dimension, +8 offset), the bf16 arithmetic of the
// quantiser (a case where rounding the quotient to bf16 decides the code), half-to-even ties, the clamp at
// -8 and 7, asymmetric zero points, an all-zero group, a short last group, NaN, and dequantisation that
// rounds the exact product once.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "model/int4.h"

namespace markbase {
namespace {

std::vector<bf16> group_of(std::vector<float> head, float fill = 0.0f, int64_t K = kInt4Group) {
    std::vector<bf16> w(static_cast<size_t>(K), float_to_bf16(fill));
    for (size_t i = 0; i < head.size(); ++i) w[i] = float_to_bf16(head[i]);
    return w;
}

struct Row {
    std::vector<uint8_t> q;
    std::vector<float> scale;
    std::vector<uint8_t> zero;
};

Row quantize(const std::vector<bf16>& w, bool symmetric) {
    const int64_t K = static_cast<int64_t>(w.size());
    Row r{std::vector<uint8_t>(static_cast<size_t>((K + 1) / 2), 0xaa),
          std::vector<float>(static_cast<size_t>(int4_groups(K))),
          std::vector<uint8_t>(static_cast<size_t>(int4_groups(K)), 0xee)};
    quantize_row_int4(w.data(), K, r.q.data(), r.scale.data(), symmetric ? nullptr : r.zero.data());
    return r;
}

TEST(Int4, CodesPackTwoABytePairsEvenInTheLowNibbleAsCompressedTensorsInt32Words) {
    std::vector<uint8_t> q(8, 0);
    for (int k = 0; k < 16; ++k) int4_set(q.data(), k, static_cast<uint8_t>(k));
    EXPECT_EQ(q, (std::vector<uint8_t>{0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc, 0xfe}));
    for (int k = 0; k < 16; ++k) EXPECT_EQ(int4_at(q.data(), k), k);
    // pack_to_int32: word j = sum of code (8j + i) << 4i; its little-endian bytes are q
    for (int j = 0; j < 2; ++j) {
        uint32_t word = 0;
        for (uint32_t i = 0; i < 8; ++i) word |= static_cast<uint32_t>(8 * j + i) << (4 * i);
        for (int b = 0; b < 4; ++b) EXPECT_EQ(q[4 * j + b], (word >> (8 * b)) & 0xff) << j << " " << b;
    }
    int4_set(q.data(), 3, 0);  // one code changes, its neighbour stays
    EXPECT_EQ(q[1], 0x02);
}

TEST(Int4, ZeroPointsPackAlongTheOutputDimension) {
    const int64_t rows = 20, G = 3;  // 20 rows: the last word holds 4 rows and 4 padding codes
    std::vector<uint32_t> words(static_cast<size_t>(3 * G), 0);
    auto zero = [](int64_t r, int64_t g) { return static_cast<uint32_t>((r * 7 + g * 5) % 16); };
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t g = 0; g < G; ++g) words[(r / 8) * G + g] |= zero(r, g) << (4 * (r % 8));
    std::vector<uint8_t> bytes(words.size() * 4);
    for (size_t i = 0; i < words.size(); ++i)
        for (int b = 0; b < 4; ++b) bytes[4 * i + b] = static_cast<uint8_t>(words[i] >> (8 * b));
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t g = 0; g < G; ++g)
            EXPECT_EQ(int4_packed_zero_at(bytes.data() + 0, G, r, g), zero(r, g)) << r << " " << g;
}

TEST(Int4, SymmetricScaleIsMaxOverSevenAndAHalfAndTiesRoundToEven) {
    // max |w| 7.5: scale 1, so the codes are the rounded weights + 8
    const Row r =
        quantize(group_of({7.5f, -7.5f, 2.5f, 3.5f, -2.5f, 0.5f, -0.5f, 1.5f, 6.75f, -1.25f}), true);
    EXPECT_EQ(r.scale[0], 1.0f);
    const std::vector<int> want{15, 0, 10, 12, 6, 8, 8, 10, 15, 7};  // 7.5 clamps to 7; -7.5 ties to -8
    for (size_t k = 0; k < want.size(); ++k) EXPECT_EQ(int4_at(r.q.data(), k), want[k]) << "weight " << k;
    for (int64_t k = 10; k < kInt4Group; ++k) EXPECT_EQ(int4_at(r.q.data(), k), 8) << "zeros are code 8";
}

TEST(Int4, TheScaleAndTheQuotientAreRoundedToBf16AsTorchComputesThem) {
    // max |w| 3.140625: scale bf16(0.41875) = 0.41796875; 1.8828125 / scale = 4.50467 in fp32, 4.5 in bf16,
    // which ties to 4 (code 12); fp32 arithmetic would round to 5 (code 13)
    const Row r = quantize(group_of({3.140625f, 1.8828125f}), true);
    EXPECT_EQ(r.scale[0], 0.41796875f);
    EXPECT_EQ(int4_at(r.q.data(), 0), 15);
    EXPECT_EQ(int4_at(r.q.data(), 1), 12);
    EXPECT_EQ(std::nearbyint(1.8828125f / 0.41796875f), 5.0f) << "the case the bf16 rounding decides";
}

TEST(Int4, AsymmetricZeroPointShiftsTheRangeToMinAndMax) {
    // min -1, max 14: scale 15 / 15 = 1, zero point round(-8 - (-1)) = -7 (stored 1); w / scale + z
    const Row r = quantize(group_of({-1.0f, 14.0f, 0.0f, 6.5f, 7.5f, 3.0f}), false);
    EXPECT_EQ(r.scale[0], 1.0f);
    EXPECT_EQ(r.zero[0], 1);
    const std::vector<int> want{0, 15, 1, 8, 8, 4};  // 6.5 - 7 = -0.5 ties to 0; 7.5 - 7 = 0.5 ties to 0
    for (size_t k = 0; k < want.size(); ++k) EXPECT_EQ(int4_at(r.q.data(), k), want[k]) << "weight " << k;
    std::vector<bf16> deq(kInt4Group);
    dequantize_row_int4(r.q.data(), r.scale.data(), r.zero.data(), kInt4Group, deq.data());
    const std::vector<float> back{-1.0f, 14.0f, 0.0f, 7.0f, 7.0f, 3.0f};
    for (size_t k = 0; k < back.size(); ++k) EXPECT_EQ(bf16_to_float(deq[k]), back[k]) << k;

    // all positive: min widens to 0, so zero point -8 (stored 0) and 0 stays exact
    const Row p = quantize(group_of({1.5f, 3.0f}), false);
    EXPECT_EQ(p.zero[0], 0);
    EXPECT_EQ(p.scale[0], 0.2001953125f) << "bf16(3 / 15)";
    EXPECT_EQ(int4_at(p.q.data(), 2), 0);
}

TEST(Int4, AnAllZeroGroupGetsEpsilonAsItsScaleAndDequantisesToZero) {
    for (bool symmetric : {true, false}) {
        std::vector<bf16> w = group_of({}, 0.0f, 2 * kInt4Group);
        w[200] = float_to_bf16(-0.75f);  // the second group is not zero
        const Row r = quantize(w, symmetric);
        EXPECT_EQ(r.scale[0], FLT_EPSILON) << "calculate_qparams clamps to fp32 epsilon";
        if (!symmetric) {
            EXPECT_EQ(r.zero[0], 0);  // -8 - 0 / eps
        }
        std::vector<bf16> deq(w.size(), 0x3f80);
        dequantize_row_int4(r.q.data(), r.scale.data(), symmetric ? nullptr : r.zero.data(), 256, deq.data());
        for (int64_t k = 0; k < kInt4Group; ++k) EXPECT_EQ(deq[k], 0) << k;
        EXPECT_NEAR(bf16_to_float(deq[200]), -0.75f, 0.06f);
    }
}

TEST(Int4, AShortLastGroupHasItsOwnScale) {
    std::vector<bf16> w = group_of({7.5f}, 0.25f, 160);
    w[150] = float_to_bf16(-15.0f);
    const Row r = quantize(w, true);
    ASSERT_EQ(r.scale.size(), 2u);
    EXPECT_EQ(r.scale[0], 1.0f);
    EXPECT_EQ(r.scale[1], 2.0f);
    std::vector<bf16> deq(160);
    dequantize_row_int4(r.q.data(), r.scale.data(), nullptr, 160, deq.data());
    EXPECT_EQ(bf16_to_float(deq[150]), -16.0f);  // -7.5 ties to -8
    EXPECT_EQ(bf16_to_float(deq[159]), 0.0f);    // 0.125 rounds to 0
    EXPECT_EQ(bf16_to_float(deq[100]), 0.0f);    // 0.25 rounds to 0
}

TEST(Int4, NonFiniteWeightsMakeTheGroupNan) {
    std::vector<bf16> w = group_of({1.0f}, 0.0f, 256);
    w[130] = 0x7fc0;  // NaN in the second group
    const Row r = quantize(w, true);
    EXPECT_EQ(r.scale[0], round_to_bf16(1.0f / 7.5f));
    EXPECT_TRUE(std::isnan(r.scale[1]));
    std::vector<bf16> deq(256);
    dequantize_row_int4(r.q.data(), r.scale.data(), nullptr, 256, deq.data());
    for (int64_t k = 128; k < 256; ++k) EXPECT_EQ(deq[k] & 0x7f80, 0x7f80) << k;
}

TEST(Int4, DequantisationRoundsTheExactProductOnce) {
    // code 15 - zero 8 = 7 times this fp32 scale is 0.1061... exactly; rounded to fp32 first it sits on a
    // bf16 tie and would round to 0.1064453125, rounded once it is 0.10595703125
    const float scale = std::ldexp(16290377.0f, -30);
    std::vector<uint8_t> q{0x0f};
    bf16 w[1];
    dequantize_row_int4(q.data(), &scale, nullptr, 1, w);
    EXPECT_EQ(bf16_to_float(w[0]), 0.10595703125f);
    EXPECT_EQ(bf16_to_float(float_to_bf16(7.0f * scale)), 0.1064453125f) << "the double rounding avoided";

    // and against the nearest bf16, found by search, for random products
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> mag(-20.0f, 4.0f);
    for (int i = 0; i < 20000; ++i) {
        const float s = std::exp2(mag(rng));
        const int d = static_cast<int>(rng() % 30) - 15;
        if (d == 0) continue;  // exactly 0
        const double exact = static_cast<double>(d) * s;
        const bf16 got = double_to_bf16(exact);
        const double g = bf16_to_float(got);
        for (bf16 n : {static_cast<bf16>(got - 1), static_cast<bf16>(got + 1)}) {
            const double other = bf16_to_float(n);
            ASSERT_LE(std::fabs(g - exact), std::fabs(other - exact)) << d << " x " << s;
            if (std::fabs(g - exact) == std::fabs(other - exact)) {
                ASSERT_EQ(got & 1, 0) << "ties to even";
            }
        }
    }
}

TEST(Int4, RowErrorIsAtMostHalfAStepExceptTheClampedTop) {
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const int64_t K = 4 * kInt4Group;
    for (bool symmetric : {true, false}) {
        for (float spread : {1e-4f, 0.02f, 3.0f}) {
            std::vector<bf16> w(K);
            for (auto& v : w) v = float_to_bf16(normal(rng) * spread);
            const Row r = quantize(w, symmetric);
            std::vector<bf16> deq(K);
            dequantize_row_int4(r.q.data(), r.scale.data(), symmetric ? nullptr : r.zero.data(), K,
                                deq.data());
            for (int64_t k = 0; k < K; ++k) {
                const double s = r.scale[k / kInt4Group];
                // half a step (at the top, where 7.5 steps clamp to 7, or the asymmetric range's ends, a bf16
                // rounding of the scale more), the quotient's bf16 rounding (2^-8 of 8 steps) and the
                // output's bf16 rounding
                const double bound = 0.6 * s + 8.0 / 256 * s + std::fabs(bf16_to_float(w[k])) / 128;
                EXPECT_LE(std::fabs(bf16_to_float(deq[k]) - bf16_to_float(w[k])), bound)
                    << (symmetric ? "symmetric" : "asymmetric") << " spread " << spread << " k " << k;
            }
        }
    }
}

}  // namespace
}  // namespace markbase
