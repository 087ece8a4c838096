// Tuning::residual_splits: the residual updates of prompt chunks and batched steps write the next product's
// input rows (cuda/kernels/residual.cu RowSplit), which split_rows wrote in a launch of its own. The rows
// must be split_rows' to the bit: the kernels against split_rows over the updated x (both updates, with and
// without the input norm, at E2B's, the 26B-A4B's and the 31B's widths), then models at real widths whose
// prompt chunks and batched steps (the MoE's forked and unforked experts) give the same logits both ways, bit
// for bit: a split taken for the wrong product (another norm, stale rows) would change them.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "runtime/backend.h"
#include "runtime/tuning.h"
#include "support/device_arrays.h"
#include "support/logits_compare.h"
#include "support/require_cuda.h"
#include "support/tiny_models.h"

#ifdef MARKBASE_HAS_CUDA
#include <cuda_runtime.h>

#include "cuda/backend.h"
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

#ifdef MARKBASE_HAS_CUDA
// Two layers at real widths: the last token's logits of a 300-token prompt (chunks of 256 and 44), and the
// logits of batched steps of 20 and of 8 sequences (the MoE forks its experts beside the dense MLP at 8).
std::vector<float> model_logits(const char* variant, bool splits) {
    BackendOptions o;
    o.ctx_size = 512;
    o.chunk = 256;
    o.tuning.residual_splits = splits;
    std::vector<float> out;
    {
        auto one = make_synthetic_cuda_backend(variant, 2, o, 43);
        const int V = static_cast<int>(one->config().vocab_size);
        const std::vector<int> prompt = testing::random_ids(300, V, 5);
        out.resize(static_cast<size_t>(V));
        one->eval(prompt.data(), 300, out.data(), false);
    }
    o.slots = 20;
    auto b = make_synthetic_cuda_backend(variant, 2, o, 43);
    const int V = static_cast<int>(b->config().vocab_size);
    for (int n : {20, 8}) {
        std::vector<int> order(n), in(n);
        for (int s = 0; s < n; ++s) {
            const std::vector<int> p = testing::random_ids(3 + s % 5, V, 100 + s + n);
            b->slot_reset(s);
            b->slot_eval(s, p.data(), static_cast<int64_t>(p.size()));
            order[s] = n - 1 - s;
            in[s] = (7 * s + 3) % V;
        }
        std::vector<float> step(static_cast<size_t>(n) * V);
        b->decode_batch(order.data(), in.data(), n, step.data());
        out.insert(out.end(), step.begin(), step.end());
    }
    return out;
}
#endif

class ResidualSplitsModel : public ::testing::TestWithParam<const char*> {};

TEST_P(ResidualSplitsModel, ChangeNoLogitBit) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    const std::vector<float> apart = model_logits(GetParam(), false);
    const std::vector<float> fused = model_logits(GetParam(), true);
    ASSERT_EQ(apart.size(), fused.size());
    size_t differ = 0;
    for (size_t i = 0; i < apart.size(); ++i) differ += apart[i] != fused[i];
    EXPECT_EQ(differ, 0u) << "of " << apart.size()
                          << " logits (the prompt's row, then the steps' of 20 and 8)";
#endif
}

std::string family_name(const ::testing::TestParamInfo<const char*>& p) {
    return testing::test_name(p.param);
}

INSTANTIATE_TEST_SUITE_P(Families, ResidualSplitsModel, ::testing::Values("e2b", "26b-a4b", "31b"),
                         family_name);

}  // namespace
}  // namespace markbase
