// The GPU's bf16 KV cache (--kv-cache-dtype auto or bf16): the decode graph and the batched step against the
// CPU backend rounding its cache to bf16 (the same function), and the prompt's path over a prompt long
// enough that the full layers' prefill attention rows pass 2048 keys (the softmax that does not keep its row
// in registers) and the sliding rings wrap many times, against the fp32 cache. The goldens
// (test_cuda_golden.cpp) hold both caches to transformers. Without a GPU every test skips.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loading/checkpoint.h"
#include "loading/random_checkpoint.h"
#include "runtime/backend.h"
#include "support/exact_options.h"
#include "support/kv_long_prompt.h"
#include "support/logits_compare.h"
#include "support/require_cuda.h"
#include "support/tiny_models.h"
#ifdef MARKBASE_HAS_CUDA
#include "cuda/backend.h"
#endif

namespace markbase {
namespace {

class CudaKvBf16 : public ::testing::TestWithParam<std::string> {};

// One sequence through the decode graph and three through batched steps (decode_batch), every token one at a
// time, against the CPU backend with its cache's values rounded to bf16 (--kv-cache-dtype bf16 there): the
// same function. The residue is rounding's: the engines' fp32 keys differ a little, so now and then one
// rounds to the neighbouring bf16 value, 2^-8 away. The decode graph's GEMVs keep ~1e-7 of fp32 (measured
// 3e-6 to 6.3e-4: 2e-3); the batched step's GEMMs take the activations as bf16 hi + lo halves (~1e-5), so
// many more keys round the other way (measured 7.8e-4 to 7.5e-3 on the dense families: 2e-2) and the MoE's
// router picks other experts from them (0.33): printed, not bounded.
TEST_P(CudaKvBf16, ComputesTheCpusBf16Cache) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    const std::string family = GetParam();
    testing::TempDir dir("cuda-kv-bf16-cpu-" + family);
    write_random_checkpoint(dir.path(), testing::tiny_config(family), 23);
    auto ck = load_checkpoint(dir.path());
    const int64_t V = ck->config.vocab_size;
    constexpr int kLen = 40, kSeqs = 3;  // > 9 sliding windows of 4
    BackendOptions o = testing::exact_options();
    o.ctx_size = 64;
    o.chunk = 8;
    o.threads = 2;
    o.kv_dtype = KvDtype::kBf16;
    std::vector<std::vector<int>> ids;
    std::vector<std::vector<float>> ref(kSeqs);  // [seq][kLen x V], the CPU's, token by token
    auto cpu = make_cpu_backend(*ck, o);
    for (int s = 0; s < kSeqs; ++s) {
        ids.push_back(testing::random_ids(kLen, 256, 40 + s));
        ref[s] = testing::all_logits(*cpu, ids[s], true);
    }
    auto one = make_cuda_backend(*ck, o);
    const std::vector<float> got = testing::all_logits(*one, ids[0], true);
    const double e_one = testing::rel_err(ref[0], got);

    BackendOptions ob = o;
    ob.slots = kSeqs;
    auto batch = make_cuda_backend(*ck, ob);
    const std::vector<int> order = {2, 0, 1};
    double e_batch = 0;
    std::vector<float> lg(kSeqs * V);
    for (int k = 0; k < kLen; ++k) {
        const std::vector<int> in = {ids[2][k], ids[0][k], ids[1][k]};
        batch->decode_batch(order.data(), in.data(), kSeqs, lg.data());
        for (int t = 0; t < kSeqs; ++t) {
            const int s = order[t];
            const std::vector<float> want(ref[s].begin() + k * V, ref[s].begin() + (k + 1) * V);
            const std::vector<float> row(lg.begin() + t * V, lg.begin() + (t + 1) * V);
            e_batch = std::max(e_batch, testing::rel_err(want, row));
        }
    }
    std::printf("  %s: against the CPU's bf16 cache over %d tokens: decode graph %.2e, batched steps %.2e\n",
                family.c_str(), kLen, e_one, e_batch);
    EXPECT_LT(e_one, 2e-3) << family << " decode graph";
    if (!ck->config.moe) {
        EXPECT_LT(e_batch, 2e-2) << family << " batched steps";
    }
#endif
}

// Tuning::decode_attn=mma: the decode graph's full layers on the batched step's tensor-core pieces, at widths
// where they fit (full head dim 64, four query heads a KV head), against the same CPU reference as the
// default pieces: the queries and the softmax weights enter the MMAs as bf16 halves (~1e-5 of fp32), so the
// bound is the decode graph's. Pieces of 16 keys over a context of 1024 are 64 fixed pieces a head, 3 of them
// holding the 40 tokens' keys: the wide merge (attention_batched.cu, above kWideMergePieces) and its empty
// pieces. attn_cluster=0 for both runs: the short-range graph (below 256 keys) never takes the route. The
// MoE's tiny router turns the bf16 cache's roundings into other experts against the CPU (both routes
// measured 0.29), so there the route is held to the default pieces' logits. That the logits differ from the
// default graph's at all shows the route was taken (a fallback would match it bit for bit).
TEST_P(CudaKvBf16, DecodeGraphOnTensorCoresComputesTheCpusBf16Cache) {
    REQUIRE_CUDA();
    const std::string family = GetParam();
    testing::TempDir dir("cuda-kv-bf16-mma-" + family);
    write_random_checkpoint(dir.path(), testing::tiny_int4_config(family), 29);
    auto ck = load_checkpoint(dir.path());
    constexpr int kLen = 40;
    BackendOptions o = testing::exact_options();
    o.ctx_size = 1024;
    o.chunk = 8;
    o.threads = 2;
    o.kv_dtype = KvDtype::kBf16;
    o.tuning = testing::exact_tuning("attn_cluster=0");
    const std::vector<int> ids = testing::random_ids(kLen, 256, 47);
    const std::vector<float> ref = testing::all_logits(*make_cpu_backend(*ck, o), ids, true);
    const std::vector<float> pieces = testing::all_logits(*make_cuda_backend(*ck, o), ids, true);
    BackendOptions om = o;
    om.tuning = testing::exact_tuning("attn_cluster=0,decode_attn=mma,batch_attn_keys=16");
    const std::vector<float> mma = testing::all_logits(*make_cuda_backend(*ck, om), ids, true);
    const double e_pieces = testing::rel_err(ref, pieces), e_mma = testing::rel_err(ref, mma);
    const double apart = testing::rel_err(pieces, mma);
    std::printf(
        "  %s: against the CPU's bf16 cache over %d tokens: pieces %.2e, tensor cores %.2e (%.2e apart)\n",
        family.c_str(), kLen, e_pieces, e_mma, apart);
    if (ck->config.moe)
        EXPECT_LT(apart, 2e-3) << family;
    else
        EXPECT_LT(e_mma, 2e-3) << family;
    EXPECT_GT(apart, 0.0) << family << ": decode_attn=mma changed nothing, so its pieces did not run";
}

// decode_attn=auto, the default: the long-range graph past max(4096, context / 8) keys. A prompt of 4,090
// tokens, then 24 tokens one at a time through the decode graphs (positions 4,090 to 4,113: the general
// graph, then the long-range one from 4,096 on) in a context of 4,160: 65 fixed pieces of 64 keys a head,
// merged by the wide merge. Against the same steps with decode_attn=pieces: the two differ only in the
// full layers' attention arithmetic (bf16 queries and weights into the MMAs, ~1e-5; measured below), the
// general graph's steps not at all, and the long ones must differ or the range never switched.
TEST_P(CudaKvBf16, LongRangeGraphTakesTheTensorCoresPast4096Keys) {
    REQUIRE_CUDA();
    const std::string family = GetParam();
    testing::TempDir dir("cuda-kv-bf16-long-" + family);
    nlohmann::json cfg = testing::tiny_int4_config(family);
    cfg["max_position_embeddings"] = 4160;  // (the tiny configs hold 512)
    write_random_checkpoint(dir.path(), cfg, 31);
    auto ck = load_checkpoint(dir.path());
    const int64_t V = ck->config.vocab_size;
    constexpr int kPrompt = 4090, kSteps = 24, kLong = 4096 - kPrompt;  // steps before the long range
    BackendOptions o = testing::exact_options();
    o.ctx_size = 4160;
    o.chunk = 512;
    o.kv_dtype = KvDtype::kBf16;
    const std::vector<int> ids = testing::random_ids(kPrompt + kSteps, 256, 53);
    auto steps = [&](const char* tuning) {
        BackendOptions ot = o;
        ot.tuning = testing::exact_tuning(tuning);
        auto be = make_cuda_backend(*ck, ot);
        be->eval(ids.data(), kPrompt, nullptr, false);
        std::vector<float> out(kSteps * V);
        for (int i = 0; i < kSteps; ++i) be->eval(&ids[kPrompt + i], 1, out.data() + i * V, false);
        return out;
    };
    const std::vector<float> pieces = steps("decode_attn=pieces"), dflt = steps("");
    auto rows = [&](const std::vector<float>& v, int from, int to) {
        return std::vector<float>(v.begin() + from * V, v.begin() + to * V);
    };
    const double general = testing::rel_err(rows(pieces, 0, kLong), rows(dflt, 0, kLong));
    const double long_range = testing::rel_err(rows(pieces, kLong, kSteps), rows(dflt, kLong, kSteps));
    std::printf("  %s: default against decode_attn=pieces: %d general steps %.2e, %d long-range %.2e\n",
                family.c_str(), kLong, general, kSteps - kLong, long_range);
    EXPECT_EQ(general, 0.0) << family << ": below 4096 keys the graphs are the same";
    EXPECT_GT(long_range, 0.0) << family << ": past 4096 keys the long-range graph did not run";
    EXPECT_LT(long_range, 2e-3) << family;
}

// The prompt's path (attention as GEMMs over bf16 Q, K, V and P) over a long prompt, against the fp32 cache
// (support/kv_long_prompt.h): half the bytes, logits within 0.1 (measured 8.3e-3 to 3.2e-2 on the dense
// families: a cache read as the wrong type or a softmax row stored over itself is off by ~1). Not the MoE's:
// its router turns these differences into other experts (measured 0.81).
TEST_P(CudaKvBf16, HalvesTheCacheAndStaysNearTheFp32Cache) {
    REQUIRE_CUDA();
    const std::string family = GetParam();
    const testing::KvLongPrompt r = testing::kv_long_prompt_against_f32(family, KvDtype::kBf16);
    EXPECT_EQ(r.bytes * 2, r.f32_bytes);
    std::printf("  %s: bf16 vs fp32 cache after 2300 tokens: batched %.2e, token by token %.2e\n",
                family.c_str(), r.batched, r.token_by_token);
    EXPECT_GT(r.batched, 0.0) << family
                              << ": the bf16 cache changed nothing, so it is not the one being read";
    if (r.moe) return;
    EXPECT_LT(r.batched, 0.1) << family << " batched";
    EXPECT_LT(r.token_by_token, 0.1) << family << " token by token";
}

INSTANTIATE_TEST_SUITE_P(Families, CudaKvBf16, ::testing::Values("e2b", "e4b", "26b-a4b", "31b"),
                         [](const auto& p) { return testing::test_name(p.param); });

}  // namespace
}  // namespace markbase
