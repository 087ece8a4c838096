// The bf16 KV cache (--kv-cache-dtype bf16, the default) against the fp32 one on the same weights: half the
// cache's bytes, and logits within TOL of the fp32 cache's, batched and token by token, over a prompt long
// enough that the full layers' prefill attention rows pass 2048 keys (the softmax that does not keep its row
// in registers) and the sliding rings wrap many times. The goldens (test_cuda_golden.cpp) hold both caches
// to transformers; the batched step's bf16 path is test_cuda_batch.cpp's. Without a GPU every test skips.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "loading/checkpoint.h"
#include "loading/random_checkpoint.h"
#include "runtime/backend.h"
#include "support/logits_compare.h"
#include "support/require_cuda.h"
#include "support/tiny_models.h"
#ifdef MARKBASE_HAS_CUDA
#include "cuda/backend.h"
#endif

namespace markbase {
namespace {

class CudaKvBf16 : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaKvBf16, HalvesTheCacheAndStaysNearTheFp32Cache) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    const std::string family = GetParam();
    testing::TempDir dir("cuda-kv-bf16-" + family);
    nlohmann::json cfg = testing::tiny_config(family);
    cfg["max_position_embeddings"] = 4096;
    write_random_checkpoint(dir.path(), cfg, 31);
    auto ck = load_checkpoint(dir.path());
    const int64_t V = ck->config.vocab_size;
    constexpr int kPrompt = 2300, kSteps = 8;
    const std::vector<int> ids = testing::random_ids(kPrompt, 256, 17);
    BackendOptions o;
    o.ctx_size = kPrompt + kSteps + 1;
    o.chunk = 1024;  // the last chunk's queries see up to 2300 keys
    o.kv_dtype = KvDtype::kF32;
    auto f32 = make_cuda_backend(*ck, o);
    o.kv_dtype = KvDtype::kBf16;
    auto b16 = make_cuda_backend(*ck, o);
    EXPECT_EQ(b16->cache_bytes() * 2, f32->cache_bytes());

    // batched: the prompt's last chunk's logits, every row
    std::vector<float> lf(static_cast<size_t>(kPrompt) * V), lb(lf.size());
    f32->eval(ids.data(), kPrompt, lf.data(), true);
    b16->eval(ids.data(), kPrompt, lb.data(), true);
    const std::vector<float> tail_f(lf.end() - 1024 * V, lf.end()), tail_b(lb.end() - 1024 * V, lb.end());
    const double e_batch = testing::rel_err(tail_f, tail_b);
    // token by token through the decode graph, both fed the fp32 cache's greedy ids
    double e_decode = 0;
    std::vector<float> df(V), db(V);
    int next = std::max_element(lf.end() - V, lf.end()) - (lf.end() - V);
    for (int k = 0; k < kSteps; ++k) {
        f32->eval(&next, 1, df.data(), false);
        b16->eval(&next, 1, db.data(), false);
        e_decode = std::max(e_decode, testing::rel_err(df, db));
        next = static_cast<int>(std::max_element(df.begin(), df.end()) - df.begin());
    }
    std::printf("  %s: bf16 vs fp32 cache after %d tokens: batched %.2e, token by token %.2e\n",
                family.c_str(), kPrompt, e_batch, e_decode);
    EXPECT_LT(e_batch, 1e-2) << family << " batched";
    EXPECT_LT(e_decode, 1e-2) << family << " token by token";
    EXPECT_GT(e_batch, 0.0) << family << ": the bf16 cache changed nothing, so it is not the one being read";
#endif
}

INSTANTIATE_TEST_SUITE_P(Families, CudaKvBf16, ::testing::Values("e2b", "e4b", "26b-a4b", "31b"),
                         [](const auto& p) { return testing::test_name(p.param); });

}  // namespace
}  // namespace markbase
