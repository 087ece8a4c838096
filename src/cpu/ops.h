// Small fp32 building blocks of the Gemma 4 forward on the CPU. Weights are bf16 read in place.
#pragma once

#include <cmath>
#include <cstdint>

#include "cpu/thread_pool.h"
#include "model/bf16.h"

namespace markbase::cpu {

// y = x * (mean(x^2) + eps)^-1/2 * w   (plain w, not 1+w; w == nullptr means no weight, as v_norm/router
// norm)
inline void rmsnorm(const float* x, const bf16* w, int64_t n, float eps, float* y) {
    double ss = 0.0;  // double: the result must not depend on n's size or summation order at the 1e-6 level
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
    if (w) {
        for (int64_t i = 0; i < n; ++i) y[i] = x[i] * inv * bf16_to_float(w[i]);
    } else {
        for (int64_t i = 0; i < n; ++i) y[i] = x[i] * inv;
    }
}

// pool.parallel_for when the items' total cost (in rough flops) is worth waking other threads for, else
// inline: a decode step of a small model makes hundreds of these calls, each only microseconds of work.
template <class Fn>
void parallel_if(ThreadPool& pool, int64_t n, int64_t cost_per_item, Fn&& fn) {
    if (n * cost_per_item < (int64_t{1} << 17)) {
        fn(int64_t{0}, n);
        return;
    }
    pool.parallel_for(n, fn);
}

// gelu with the tanh approximation (HF gelu_pytorch_tanh): 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715
// x^3), computed as x * sigmoid(2u), the same function: one expf instead of tanhf (an expm1f inside), which
// made GELU ~8% of a prefill on one thread. Far out on the negative side exp overflows to inf and the result
// is -0, as 0.5 x (1 + (-1)) is.
inline float gelu_tanh(float x) {
    const float k = 0.7978845608028654f;  // sqrt(2/pi)
    const float u = k * (x + 0.044715f * x * x * x);
    return x / (1.0f + std::exp(-2.0f * u));
}

// out[j] = gelu_tanh(gate[j]) * up[j] for j < n, over the pool when it is worth waking (a prompt's MLP
// activations are n x I of them). out may be gate.
inline void gelu_mul(ThreadPool& pool, const float* gate, const float* up, float* out, int64_t n) {
    parallel_if(pool, n, 32, [&](int64_t b, int64_t e) {
        for (int64_t j = b; j < e; ++j) out[j] = gelu_tanh(gate[j]) * up[j];
    });
}

// NeoX-style (rotate_half) RoPE on one head of `d` dims: dim j pairs with j + d/2, for the first `n_rot`
// pairs; inv_freq has d/2 entries (zeros beyond n_rot mean those pairs pass through).
inline void rope_neox(float* x, int d, const float* cos_t, const float* sin_t) {
    const int half = d / 2;
    for (int j = 0; j < half; ++j) {
        const float a = x[j], b = x[j + half];
        x[j] = a * cos_t[j] - b * sin_t[j];
        x[j + half] = b * cos_t[j] + a * sin_t[j];
    }
}

}  // namespace markbase::cpu
