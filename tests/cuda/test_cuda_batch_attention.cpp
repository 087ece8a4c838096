// A batched step's attention pieces over the bf16 cache: the tensor-core kernel (batch_attn=mma,
// cuda/kernels/attention_mma.cu) against the CUDA-core warp kernel (batch_attn=warp, attention_warp.cu) on
// the same model, cache and ids. The warp kernel's products are fp32 over the bf16 rows; the tensor cores
// take the queries and the softmax weights as two bf16 halves each, 16 of fp32's 24 bits, so a score moves by
// up to ~2^-17 of |q| |k|: measured, the logits by ~1e-5 at real widths and by up to 2.8e-4 in the first step
// on the tiny models. Later steps read keys the two wrote, and their differences round a key to the
// neighbouring bf16 value (2^-8 away) now and then (test_cuda_kv_bf16.cpp): 3.5e-4 over five steps. A wrong
// mask, head or column is off by ~1. Over an fp8 cache (e4m3 rows widened to f16 for the MMAs) the tensor
// cores take the queries and the softmax weights as one f16 each, 11 bits, so a score moves by up to ~2^-12
// of |q| |k| (still 2^-7 of what e4m3's rounding of the key itself moves it by).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "loading/checkpoint.h"
#include "loading/random_checkpoint.h"
#include "runtime/backend.h"
#include "support/exact_options.h"
#include "support/logits_compare.h"
#include "support/require_cuda.h"
#include "support/tiny_models.h"
#ifdef MARKBASE_HAS_CUDA
#include "cuda/backend.h"
#endif

namespace markbase {
namespace {

#ifdef MARKBASE_HAS_CUDA
// Prompts of these lengths (all but the last id) in slots 0.., then kSteps batched steps of every slot, the
// slots listed in reverse; every step's logits [slot order][V].
std::vector<float> batched_logits(CudaBackend& be, const std::vector<std::vector<int>>& prompts, int steps) {
    const int n = static_cast<int>(prompts.size());
    const int64_t V = be.config().vocab_size;
    std::vector<int> order(n), next(n);
    for (int s = 0; s < n; ++s) {
        be.slot_reset(s);
        be.slot_eval(s, prompts[s].data(), static_cast<int64_t>(prompts[s].size()) - 1);
        next[s] = prompts[s].back();
        order[n - 1 - s] = s;
    }
    std::vector<float> all;
    for (int k = 0; k < steps; ++k) {
        std::vector<int> in(n);
        for (int t = 0; t < n; ++t) in[t] = next[order[t]];
        std::vector<float> lg(n * V);
        const std::vector<int> out = be.decode_batch(order.data(), in.data(), n, lg.data());
        for (int t = 0; t < n; ++t) next[order[t]] = out[t];
        all.insert(all.end(), lg.begin(), lg.end());
    }
    return all;
}

std::vector<std::vector<int>> prompts_of(const std::vector<int>& lengths, int vocab, uint32_t seed) {
    std::vector<std::vector<int>> p;
    for (int len : lengths) p.push_back(testing::random_ids(len, vocab, seed++));
    return p;
}

// The first step's rows (step_floats of them) within first, every step's within all; not identical, or the
// tensor-core kernel did not run.
void expect_close(const std::vector<float>& warp, const std::vector<float>& mma, size_t step_floats,
                  const std::string& label, double first = 1e-3, double all = 2e-3) {
    const std::vector<float> w0(warp.begin(), warp.begin() + step_floats),
        m0(mma.begin(), mma.begin() + step_floats);
    const double e0 = testing::rel_err(w0, m0), e = testing::rel_err(warp, mma);
    std::printf("  %s: tensor cores vs warp kernel: rel err first step %.2e, all steps %.2e\n", label.c_str(),
                e0, e);
    EXPECT_GT(e, 0.0) << label << ": identical to the last bit: the tensor-core kernel did not run";
    EXPECT_LT(e0, first) << label << " first step";
    EXPECT_LT(e, all) << label << " all steps";
}

// The tiny models with head dims the tensor-core kernel takes (64 sliding, 128 full), 8 query heads over 1, 2
// or 4 KV heads, a sliding window of 40.
nlohmann::json tiny_tc_config(const std::string& family) {
    nlohmann::json c = testing::tiny_config(family);
    c["head_dim"] = 64;
    c["global_head_dim"] = 128;
    c["num_attention_heads"] = 8;
    c["num_key_value_heads"] = family == "e2b" ? 1 : family == "e4b" ? 2 : 4;
    if (c.contains("num_global_key_value_heads")) c["num_global_key_value_heads"] = 1;
    c["sliding_window"] = 40;
    return c;
}
#endif

class CudaBatchAttention : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaBatchAttention, TensorCoresGiveTheWarpKernelsLogits) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    const std::string family = GetParam();
    testing::TempDir dir("cuda-batch-attn-" + family);
    write_random_checkpoint(dir.path(), tiny_tc_config(family), 41);
    auto ck = load_checkpoint(dir.path());
    const auto prompts = prompts_of({5, 77, 250, 16}, 256, 60);
    for (const KvDtype kv : {KvDtype::kBf16, KvDtype::kFp8})
        for (const char* keys : {"batch_attn_keys=16", "batch_attn_keys=48"}) {
            const bool fp8 = kv == KvDtype::kFp8;
            BackendOptions o = testing::exact_options();
            o.ctx_size = 320;
            o.chunk = 64;
            o.slots = 4;
            o.kv_dtype = kv;
            o.tuning = testing::exact_tuning(std::string(keys) + ",batch_attn=warp");
            auto warp = make_cuda_backend(*ck, o);
            o.tuning = testing::exact_tuning(std::string(keys) + ",batch_attn=mma");
            auto mma = make_cuda_backend(*ck, o);
            const std::vector<float> a = batched_logits(*warp, prompts, 5),
                                     b = batched_logits(*mma, prompts, 5);
            const std::string label = family + (fp8 ? " fp8" : " bf16") + " [" + keys + "]";
            if (fp8)  // measured up to 8.7e-3 and 1.5e-2 (e2b)
                expect_close(a, b, prompts.size() * ck->config.vocab_size, label, 2e-2, 5e-2);
            else
                expect_close(a, b, prompts.size() * ck->config.vocab_size, label);
        }
#endif
}

INSTANTIATE_TEST_SUITE_P(Families, CudaBatchAttention, ::testing::Values("e2b", "e4b", "26b-a4b", "31b"),
                         [](const auto& p) { return testing::test_name(p.param); });

// Real widths: E2B's 8 query heads over one KV head (dims 256 and 512), the 31B's sliding layers (2 per KV
// head, 256) and its full layer (8 per KV head, 512: two warps per piece).
class CudaBatchAttentionReal : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaBatchAttentionReal, TensorCoresGiveTheWarpKernelsLogits) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    const std::string v = GetParam();
    const int layers = v == "e2b" ? 5 : 6;  // through the first full layer
    for (const KvDtype kv : {KvDtype::kBf16, KvDtype::kFp8}) {
        const bool fp8 = kv == KvDtype::kFp8;
        BackendOptions o = testing::exact_options();
        o.ctx_size = 1300;
        o.chunk = 256;
        o.slots = 3;
        o.kv_dtype = kv;
        o.tuning = testing::exact_tuning("batch_attn=warp");
        std::vector<float> a, b;
        std::vector<std::vector<int>> prompts;
        size_t warp_vocab = 0;
        {
            auto warp = make_synthetic_cuda_backend(v, layers, o, 77);
            warp_vocab = warp->config().vocab_size;
            prompts = prompts_of({1200, 300, 37}, static_cast<int>(warp->config().vocab_size), 90);
            a = batched_logits(*warp, prompts, 3);
        }
        o.tuning = testing::exact_tuning("batch_attn=mma");
        {
            auto mma = make_synthetic_cuda_backend(v, layers, o, 77);
            b = batched_logits(*mma, prompts, 3);
        }
        const std::string label = v + "/" + std::to_string(layers) + "L" + (fp8 ? " fp8" : " bf16");
        expect_close(a, b, prompts.size() * warp_vocab, label);  // fp8 measured 1.7e-4 and 2.3e-4
    }
#endif
}

INSTANTIATE_TEST_SUITE_P(Variants, CudaBatchAttentionReal, ::testing::Values("e2b", "31b"),
                         [](const auto& p) { return testing::test_name(p.param); });

}  // namespace
}  // namespace markbase
