// What the MoE kernel tests (test_moe_stream.cpp, test_moe_gemm.cpp) share: the GeGLU in fp64, IEEE f16
// decoding, and random expert rows (bf16 values, or e4m3 codes with a scale per row) with the value a kernel
// reads at each place.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "model/fp8.h"
#include "support/device_arrays.h"

namespace markbase::testing {

inline double gelu_tanh(double x) {
    return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

inline double from_f16(uint16_t b) {  // IEEE binary16
    const int e = (b >> 10) & 31, m = b & 1023;
    const double v = e == 0 ? std::ldexp(m, -24) : e == 31 ? NAN : std::ldexp(1024 + m, e - 25);
    return (b & 0x8000) ? -v : v;
}

// A matrix of `rows` rows of K: bf16 values, e4m3 codes with a scale per row, or (int4()) nibbles with a
// scale and zero point per group of 128 along K; value(r, k) as the kernel reads it.
struct ExpertRowsHost {
    bool fp8 = false;
    bool is_int4 = false;
    std::vector<uint16_t> w;
    std::vector<uint8_t> q;
    std::vector<float> scale;
    std::vector<uint8_t> zero;  // int4 with zero points (else the symmetric 8)
    int K = 0;
    ExpertRowsHost() = default;
    // int4: nibbles 0..15 (k even in the low one), scales in [0.002, 0.01), zero points 0..15 where
    // `zeros`, else none
    static ExpertRowsHost int4(std::mt19937& rng, size_t rows, int k, bool zeros) {
        ExpertRowsHost m;
        m.K = k;
        m.is_int4 = true;
        const size_t G = (static_cast<size_t>(k) + 127) / 128;
        std::uniform_int_distribution<int> nib(0, 15);
        std::uniform_real_distribution<float> sc(0.002f, 0.01f);
        m.q.assign(rows * k / 2, 0);
        for (uint8_t& v : m.q) v = static_cast<uint8_t>(nib(rng) | (nib(rng) << 4));
        m.scale.resize(rows * G);
        for (float& v : m.scale) v = sc(rng);
        if (zeros) {
            m.zero.resize(rows * G);
            for (uint8_t& z : m.zero) z = static_cast<uint8_t>(nib(rng));
        }
        return m;
    }
    ExpertRowsHost(std::mt19937& rng, bool is_fp8, size_t rows, int k) : fp8(is_fp8), K(k) {
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        if (!fp8) {
            w.resize(rows * K);
            for (uint16_t& v : w) v = to_bf16(0.1f * u(rng));
            return;
        }
        q.resize(rows * K);
        scale.resize(rows);
        for (uint8_t& v : q) v = float_to_fp8_e4m3(448.0f * u(rng) * u(rng));  // small codes too
        for (float& v : scale) v = (0.5f + 0.5f * (u(rng) + 1.0f)) * (0.1f / 448.0f);
    }
    double value(size_t r, size_t k) const {
        if (is_int4) {
            const size_t G = (static_cast<size_t>(K) + 127) / 128, g = r * G + k / 128;
            const int n = (q[(r * K + k) / 2] >> (4 * (k & 1))) & 15, z = zero.empty() ? 8 : zero[g];
            return double(n - z) * double(scale[g]);
        }
        return fp8 ? double(fp8_e4m3_to_float(q[r * K + k])) * scale[r] : from_bf16(w[r * K + k]);
    }
};

}  // namespace markbase::testing
