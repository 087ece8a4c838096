// The GPU's fp8 KV cache (--kv-cache-dtype fp8: e4m3, no scale): the decode graph, a paged slot's prompt
// (prefill widening its rows to bf16) and the batched steps after it against the CPU backend rounding its
// cache to e4m3 (the same function), and a long prompt (the rings wrapping, the full layers' softmax rows
// past 2048 keys) against the fp32 cache. Without a GPU every test skips.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
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

class CudaKvFp8 : public ::testing::TestWithParam<std::string> {};

// Against the CPU with its cache rounded to e4m3: one sequence through the decode graph, token by token;
// three slots whose first kPrompt ids are one prompt each (slot_eval: the prefill's attention over the paged
// pool, widened) and whose other ids are batched steps. The residue is rounding's: where the engines' fp32
// keys differ a little (the decode graph ~1e-7 of a value, the prefill's and the batched step's hi/lo GEMMs
// ~1e-5), one may round to the neighbouring e4m3 value, 2^-4 to 2^-3 of it away, so rarely, but by more
// than bf16's neighbour. The MoE's router turns these into other experts: printed, not bounded.
TEST_P(CudaKvFp8, ComputesTheCpusFp8Cache) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    const std::string family = GetParam();
    testing::TempDir dir("cuda-kv-fp8-cpu-" + family);
    write_random_checkpoint(dir.path(), testing::tiny_config(family), 23);
    auto ck = load_checkpoint(dir.path());
    const int64_t V = ck->config.vocab_size;
    constexpr int kLen = 40, kPrompt = 24, kSeqs = 3;  // > 9 sliding windows of 4
    BackendOptions o = testing::exact_options();
    // 512 positions: the one sequence's decode graph below 256 keys runs its pieces as thread-block clusters
    // of 16 (past the portable 8, each cache type's kernel opted in: attention_cluster_fits)
    o.ctx_size = 512;
    o.chunk = 8;
    o.threads = 2;
    o.kv_dtype = KvDtype::kFp8;
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
    for (int s = 0; s < kSeqs; ++s) batch->slot_eval(s, ids[s].data(), kPrompt);
    const std::vector<int> order = {2, 0, 1};
    double e_batch = 0;
    std::vector<float> lg(kSeqs * V);
    for (int k = kPrompt; k < kLen; ++k) {
        const std::vector<int> in = {ids[2][k], ids[0][k], ids[1][k]};
        batch->decode_batch(order.data(), in.data(), kSeqs, lg.data());
        for (int t = 0; t < kSeqs; ++t) {
            const int s = order[t];
            const std::vector<float> want(ref[s].begin() + k * V, ref[s].begin() + (k + 1) * V);
            const std::vector<float> row(lg.begin() + t * V, lg.begin() + (t + 1) * V);
            e_batch = std::max(e_batch, testing::rel_err(want, row));
        }
    }
    std::printf(
        "  %s: against the CPU's fp8 cache over %d tokens: decode graph %.2e, prompt + batched steps "
        "%.2e\n",
        family.c_str(), kLen, e_one, e_batch);
    // measured 6e-7 to 9e-7 on an H200's host; 2.6e-3 for the 31B on an H100's, the same under every
    // attention and GEMV variant (attn_cluster=0, decode_attn=pieces, gemv=rows): one key rounded to the
    // neighbouring e4m3 value (the CPU's fp32 key on the other side of a rounding boundary; taken as that,
    // not proven). A cache read as the wrong type or slot is off by ~1.
    EXPECT_LT(e_one, 1e-2) << family << " decode graph";
    if (!ck->config.moe) {
        EXPECT_LT(e_batch, 0.1) << family << " prompt + batched steps";  // measured 2.1e-2 to 5.8e-2
    }
#endif
}

// A long prompt through the prefill (its attention over every layer's rows widened to bf16) and then token by
// token, against the fp32 cache (support/kv_long_prompt.h): a quarter of the bytes, logits within 0.5 (a
// cache read as the wrong type, a row widened from the wrong slot or a ring read past its rows is off by ~1
// or more). Not the MoE's, whose router turns the differences into other experts.
TEST_P(CudaKvFp8, QuartersTheCacheAndStaysNearTheFp32Cache) {
    REQUIRE_CUDA();
    const std::string family = GetParam();
    const testing::KvLongPrompt r = testing::kv_long_prompt_against_f32(family, KvDtype::kFp8);
    EXPECT_EQ(r.bytes * 4, r.f32_bytes);
    std::printf("  %s: fp8 vs fp32 cache after 2300 tokens: batched %.2e, token by token %.2e\n",
                family.c_str(), r.batched, r.token_by_token);
    EXPECT_GT(r.batched, 0.0) << family << ": the fp8 cache changed nothing, so it is not the one being read";
    if (r.moe) return;
    EXPECT_LT(r.batched, 0.5) << family << " batched";                // measured 0.24 to 0.29
    EXPECT_LT(r.token_by_token, 0.5) << family << " token by token";  // measured 0.14 to 0.18
}

INSTANTIATE_TEST_SUITE_P(Families, CudaKvFp8, ::testing::Values("e2b", "e4b", "26b-a4b", "31b"),
                         [](const auto& p) { return testing::test_name(p.param); });

}  // namespace
}  // namespace markbase
