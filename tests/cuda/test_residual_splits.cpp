// The residual updates of prompt chunks and batched steps write the next product's input rows
// (cuda/kernels/residual.cu RowSplit), which split_rows wrote in a launch of its own. The rows must be
// split_rows' to the bit: the kernels against split_rows over the updated x (both updates, with and without
// the input norm, at E2B's, the 26B-A4B's and the 31B's widths). (Whole models with and without them gave
// the same logits bit for bit on the H200 before the split_rows launches were removed; the batched and
// golden tests hold the models now.)
#include <gtest/gtest.h>

#include <cstdint>
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
using testing::to_bf16;
using testing::to_device;
using testing::to_host;

std::vector<float> uniform(size_t n, float lo, float hi, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (float& f : v) f = u(rng);
    return v;
}
std::vector<uint16_t> weights(int H, uint32_t seed) {
    std::vector<uint16_t> w(static_cast<size_t>(H));
    const std::vector<float> f = uniform(w.size(), 0.5f, 1.5f, seed);
    for (size_t i = 0; i < w.size(); ++i) w[i] = to_bf16(f[i]);
    return w;
}

// One update of n rows of H both ways (moe: the MoE's combine of m with K expert slots, else the residual
// update of y): with the split, against the update then split_rows. Every x, hi and lo bit equal.
void check_update(int H, int n, bool moe, bool norm, uint32_t seed) {
    constexpr int K = 8;
    const size_t nh = static_cast<size_t>(n) * H;
    const std::vector<float> x0 = uniform(nh, -4.0f, 4.0f, seed), y = uniform(nh, -2.0f, 2.0f, seed + 1);
    const std::vector<float> slots = uniform(nh * K, -1.0f, 1.0f, seed + 2);
    const std::vector<float> sel = uniform(static_cast<size_t>(n) * K, 0.0f, 0.3f, seed + 3);
    const std::vector<uint16_t> w = weights(H, seed + 4), w1 = weights(H, seed + 5),
                                w2 = weights(H, seed + 6), nw = weights(H, seed + 7);
    float *dy = to_device(y), *ds = to_device(slots), *dsel = to_device(sel);
    uint16_t *dw = to_device(w), *dw1 = to_device(w1), *dw2 = to_device(w2), *dnw = to_device(nw);
    std::vector<float> xs[2];
    std::vector<uint16_t> hl[2];
    for (int fused = 0; fused < 2; ++fused) {
        float* dx = to_device(x0);
        uint16_t* dhl = to_device(std::vector<uint16_t>(2 * nh, 0));
        cuda::RowSplit sp;
        if (fused) sp = {norm, norm ? dnw : nullptr, dhl, dhl + nh};
        const float eps = 1e-6f, scale = 0.75f;
        if (moe)
            cuda::residual_moe_combine(dx, dy, ds, dsel, K, dw1, dw2, dw, H, n, eps, scale, nullptr, false,
                                       nullptr, nullptr, sp);
        else
            cuda::residual_add_norm(dx, dy, dw, H, n, eps, scale, nullptr, nullptr, nullptr, {}, sp);
        if (!fused) cuda::split_rows(dx, H, H, n, norm, norm ? dnw : nullptr, eps, dhl, dhl + nh, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        xs[fused] = to_host(dx, nh);
        hl[fused] = to_host(dhl, 2 * nh);
        cudaFree(dx);
        cudaFree(dhl);
    }
    for (void* p :
         {static_cast<void*>(dy), static_cast<void*>(ds), static_cast<void*>(dsel), static_cast<void*>(dw),
          static_cast<void*>(dw1), static_cast<void*>(dw2), static_cast<void*>(dnw)})
        cudaFree(p);
    EXPECT_EQ(xs[0], xs[1]) << "x, H " << H << (moe ? ", the MoE combine" : "");
    EXPECT_EQ(hl[0], hl[1]) << "hi and lo, H " << H << (norm ? ", normed" : "")
                            << (moe ? ", the MoE combine" : "");
    EXPECT_NE(hl[1], std::vector<uint16_t>(2 * nh, 0)) << "the fused update wrote no rows";
}
#endif

TEST(ResidualSplits, UpdatesWriteSplitRowsOwnRows) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    for (int H : {1536, 2816, 5376})
        for (int n : {1, 7, 96})
            for (bool moe : {false, true})
                for (bool norm : {false, true}) check_update(H, n, moe, norm, static_cast<uint32_t>(H + n));
#endif
}

}  // namespace
}  // namespace markbase
