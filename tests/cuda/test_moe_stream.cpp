// moe_stream (cuda/kernels/moe_stream.cu), a batched step's experts with no host in the loop: the gate/up
// pass's GeGLU halves and the down pass's slots against fp64 host products of the same bf16 inputs and
// weights, over routings that leave experts empty, give one expert more entries than a block's token tiles
// hold (further passes over its rows), and take each token-tile count (1, 2, 4 tiles of 8 entries).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "support/device_arrays.h"
#include "support/require_cuda.h"

#ifdef MARKBASE_HAS_CUDA
#include <cuda_runtime.h>

#include "cuda/kernels/kernels.h"
#endif

namespace markbase {
namespace {

#ifdef MARKBASE_HAS_CUDA
using testing::from_bf16;
using testing::to_bf16;
using testing::to_device;
using testing::to_host;

double gelu_tanh(double x) {
    return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
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
double half_value(const std::vector<uint16_t>& hl, size_t count, size_t i) {
    return double(from_bf16(hl[i])) + double(from_bf16(hl[count + i]));
}

struct Errors {
    double h = 0.0, slots = 0.0;  // the largest errors relative to the sum of |terms|
};

// n tokens of K slots over E experts, routed by `expert_of(t, k)`; both passes against fp64.
template <class Route>
Errors run_case(int n, int K, int E, int H, int Ie, Route expert_of, uint32_t seed) {
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
    const std::vector<uint16_t> x = random_halves(rng, nx);
    std::vector<uint16_t> gu(static_cast<size_t>(E) * 2 * Ie * H), down(static_cast<size_t>(E) * H * Ie);
    for (uint16_t& v : gu) v = to_bf16(0.1f * u(rng));
    for (uint16_t& v : down) v = to_bf16(0.1f * u(rng));
    uint16_t *d_x = to_device(x), *d_gu = to_device(gu), *d_down = to_device(down);
    int *d_off = to_device(off), *d_ent = to_device(entries);
    uint16_t* d_h = nullptr;
    float* d_slots = nullptr;
    EXPECT_EQ(cudaMalloc(&d_h, 2 * nh * sizeof(uint16_t)), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&d_slots, static_cast<size_t>(n) * K * H * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemset(d_h, 0xff, 2 * nh * sizeof(uint16_t)), cudaSuccess);  // NaN: every output written
    EXPECT_EQ(cudaMemset(d_slots, 0xff, static_cast<size_t>(n) * K * H * sizeof(float)), cudaSuccess);
    cuda::moe_stream_gate_up(d_x, d_x + nx, H, K, d_gu, Ie, d_off, d_ent, E, n, d_h, d_h + nh, nullptr);
    cuda::moe_stream_down(d_h, d_h + nh, Ie, d_down, H, K, d_off, d_ent, E, n, d_slots, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint16_t> h = to_host(d_h, 2 * nh);
    const std::vector<float> slots = to_host(d_slots, static_cast<size_t>(n) * K * H);
    Errors err;
    for (int i = 0; i < n * K; ++i) {
        const int e = expert_of(i / K, i % K);
        for (int j = 0; j < Ie; ++j) {  // GeGLU of the gate and up products; bf16 halves keep ~2^-16
            double g = 0, up = 0, mag_g = 0, mag_u = 0;
            for (int k = 0; k < H; ++k) {
                const double xv = half_value(x, nx, static_cast<size_t>(i / K) * H + k);
                const size_t row = (static_cast<size_t>(e) * 2 * Ie + j) * H + k;
                g += xv * from_bf16(gu[row]);
                up += xv * from_bf16(gu[row + static_cast<size_t>(Ie) * H]);
                mag_g += std::fabs(xv * from_bf16(gu[row]));
                mag_u += std::fabs(xv * from_bf16(gu[row + static_cast<size_t>(Ie) * H]));
            }
            const double want = gelu_tanh(g) * up, got = half_value(h, nh, static_cast<size_t>(i) * Ie + j);
            // |gelu(g) up| <= |g| |up|: the error relative to the product of the two sums of |terms|
            const double scale = mag_g * mag_u + 1e-12;
            err.h = std::max(err.h, std::isfinite(got) ? std::fabs(got - want) / scale : 1e30);
        }
        for (int r = 0; r < H; ++r) {  // the down product of the h the kernel wrote
            double want = 0, mag = 0;
            for (int k = 0; k < Ie; ++k) {
                const double p = half_value(h, nh, static_cast<size_t>(i) * Ie + k) *
                                 from_bf16(down[(static_cast<size_t>(e) * H + r) * Ie + k]);
                want += p;
                mag += std::fabs(p);
            }
            const float got = slots[static_cast<size_t>(i) * H + r];
            err.slots =
                std::max(err.slots, std::isfinite(got) ? std::fabs(got - want) / (mag + 1e-12) : 1e30);
        }
    }
    for (void* p : {static_cast<void*>(d_x), static_cast<void*>(d_gu), static_cast<void*>(d_down),
                    static_cast<void*>(d_off), static_cast<void*>(d_ent), static_cast<void*>(d_h),
                    static_cast<void*>(d_slots)})
        cudaFree(p);
    return err;
}
#endif

TEST(MoeStream, GeGluAndDownMatchTheFp64Products) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    const int E = 16, K = 4, H = 96, Ie = 64;  // H: 3 chunks of 32 (an uneven round), 3 row blocks of 32
    // uniform routing at 1, 6, 20, 40 tokens: the token tiles go 1, 1, 2, 4 (moe_stream's rule)
    for (int n : {1, 6, 20, 40}) {
        const Errors e = run_case(
            n, K, E, H, Ie, [&](int t, int k) { return (t * 7 + k * 5 + (t * k) % 3) % E; },
            static_cast<uint32_t>(n));
        EXPECT_LT(e.h, 1e-5) << n << " tokens: GeGLU";
        EXPECT_LT(e.slots, 1e-5) << n << " tokens: down";
    }
    // one busy expert, the others empty but one: 6 tokens with three slots each on expert 3 (18 entries at
    // one tile: passes of 8, 8, 2); 100 tokens with their first slot on expert 3 (4 tiles: 32, 32, 32, 4)
    for (int n : {6, 100}) {
        const Errors e = run_case(
            n, K, E, H, Ie,
            [&](int t, int k) { return n == 6 ? (k < 3 ? 3 : 9) : (k == 0 ? 3 : 9 + (t + k) % 3); },
            static_cast<uint32_t>(n + 1));
        EXPECT_LT(e.h, 1e-5) << n << " tokens, one busy expert: GeGLU";
        EXPECT_LT(e.slots, 1e-5) << n << " tokens, one busy expert: down";
    }
#endif
}

}  // namespace
}  // namespace markbase
