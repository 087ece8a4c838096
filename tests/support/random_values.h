// Random matmul operands for the CPU kernel tests: never zero, so every product counts.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "model/bf16.h"

namespace markbase::testing {

// Uniform in +-[0.05, 1) with a random sign.
inline std::vector<float> random_floats(size_t count, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> mag(0.05f, 1.0f);
    std::vector<float> v(count);
    for (auto& f : v) f = (rng() & 1u) ? mag(rng) : -mag(rng);
    return v;
}

// random_floats rounded to bf16.
inline std::vector<bf16> random_bf16(size_t count, uint32_t seed) {
    std::vector<float> f = random_floats(count, seed);
    std::vector<bf16> v(count);
    for (size_t i = 0; i < count; ++i) v[i] = float_to_bf16(f[i]);
    return v;
}

}  // namespace markbase::testing
