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

// A matrix of `rows` rows of K: bf16 values, or e4m3 codes with a scale per row; value(r, k) as the kernel
// reads it.
struct ExpertRowsHost {
    bool fp8 = false;
    std::vector<uint16_t> w;
    std::vector<uint8_t> q;
    std::vector<float> scale;
    int K = 0;
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
        return fp8 ? double(fp8_e4m3_to_float(q[r * K + k])) * scale[r] : from_bf16(w[r * K + k]);
    }
};

}  // namespace markbase::testing
