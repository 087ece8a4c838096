// Batched decode (docs/batched-decode.md): sequences of different lengths, each in its own cache slot,
// decoded together one token each per step must give what each gives decoded alone on the one-sequence path
// (itself checked against the CPU in test_cuda_backend.cpp): logits within 1e-3 of the logit range, the same
// greedy ids. Lengths pass the tiny models' sliding window (4) so ring slots wrap per sequence; one sequence
// crosses position 256 while the steps run, so the step's graph changes range class (batch.cu) under it, and
// another sits in the next class from the start; one step takes a subset of the slots in another order.
// Skips, saying why, without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "loading/checkpoint.h"
#include "loading/random_checkpoint.h"
#include "model/error.h"
#include "runtime/backend.h"
#include "support/exact_options.h"
#include "support/logits_compare.h"
#include "support/tiny_models.h"
#ifdef MARKBASE_HAS_CUDA
#include "cuda/backend.h"
#endif

namespace markbase {
namespace {

class CudaBatch : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaBatch, SequencesTogetherDecodeAsAlone) {
#ifndef MARKBASE_HAS_CUDA
    GTEST_SKIP() << "no CUDA device: this build has no CUDA backend (MARKBASE_CUDA off or nvcc missing)";
#else
    const CudaDeviceInfo info = cuda_device_info();
    if (!info.available) GTEST_SKIP() << "no CUDA device: " << info.why_not;
    const std::string family = GetParam();
    testing::TempDir dir("cuda-batch-" + family);
    write_random_checkpoint(dir.path(), testing::tiny_config(family), 21);
    auto ck = load_checkpoint(dir.path());
    const int64_t V = ck->config.vocab_size;
    BackendOptions o = testing::exact_options();
    o.ctx_size = 640;
    // the exact cache: with bf16 the two paths' ~1e-6 differences round keys to neighbouring bf16 values now
    // and then (test_cuda_kv_bf16.cpp holds the bf16 batched step to the CPU's bf16 cache)
    o.kv_dtype = KvDtype::kF32;
    o.chunk = 8;  // prompts longer than a chunk go in several prefill passes
    auto alone = make_cuda_backend(*ck, o);
    const std::vector<std::vector<int> > prompts = {
        testing::random_ids(5, 256, 1), testing::random_ids(254, 256, 2), testing::random_ids(300, 256, 3)};
    constexpr int kSteps = 6;
    // alone: each prompt, then kSteps greedy tokens fed one by one, with every step's logits
    std::vector<std::vector<int> > ids_alone(3);
    std::vector<std::vector<std::vector<float> > > lg_alone(3);
    for (int s = 0; s < 3; ++s) {
        std::vector<float> lg(V);
        int next = prompts[s].back();  // the prompt's last token is the first one decoded, here and batched
        alone->reset();
        alone->eval(prompts[s].data(), static_cast<int64_t>(prompts[s].size()) - 1, nullptr, false);
        for (int k = 0; k < kSteps; ++k) {
            alone->eval(&next, 1, lg.data(), false);
            lg_alone[s].push_back(lg);
            next = static_cast<int>(std::max_element(lg.begin(), lg.end()) - lg.begin());
            ids_alone[s].push_back(next);
        }
    }
    {
        BackendOptions ob = o;
        ob.slots = 3;
        auto batch = make_cuda_backend(*ck, ob);
        ASSERT_EQ(batch->slots(), 3);

        // batched: the same prompts without their last token in slots 0..2, then kSteps steps of all three
        std::vector<int> next(3);
        for (int s = 0; s < 3; ++s) {
            batch->slot_reset(s);
            batch->slot_eval(s, prompts[s].data(), static_cast<int64_t>(prompts[s].size()) - 1);
            next[s] = prompts[s].back();
        }
        const std::vector<int> order = {2, 0, 1};  // slots listed out of order
        double worst = 0;
        for (int k = 0; k < kSteps; ++k) {
            std::vector<int> in = {next[2], next[0], next[1]};
            std::vector<float> lg(3 * V);
            std::vector<int> out;
            if (k + 1 < kSteps) {
                out = batch->decode_batch(order.data(), in.data(), 3, lg.data());
            } else {  // the last step one sequence at a time: each slot's own decode graph
                for (int t = 0; t < 3; ++t)
                    out.push_back(batch->decode_batch(&order[t], &in[t], 1, lg.data() + t * V).at(0));
            }
            ASSERT_EQ(out.size(), 3u);
            for (int t = 0; t < 3; ++t) {
                const int s = order[t];
                const std::vector<float> row(lg.begin() + t * V, lg.begin() + (t + 1) * V);
                worst = std::max(worst, testing::rel_err(lg_alone[s][k], row));
                EXPECT_EQ(out[t], ids_alone[s][k]) << "slot " << s << " step " << k;
                next[s] = out[t];
            }
        }
        std::printf("  %s: batched vs alone, worst rel err %.2e over %d steps of 3 sequences\n",
                    family.c_str(), worst, kSteps);
        EXPECT_LT(worst, 1e-3);

        // a step with two of the slots
        {
            std::vector<int> two = {1, 0}, in = {next[1], next[0]};
            batch->decode_batch(two.data(), in.data(), 2, nullptr);
        }
        // the same step without its graph, phase by phase: every layer's attention, the logits, real times
        {
            std::vector<int> two = {0, 2}, in = {next[0], next[2]};
            const std::vector<CudaProfileEntry> prof = batch->profile_batch(two.data(), in.data(), 2);
            int attention = 0, lm_head = 0;
            for (const CudaProfileEntry& e : prof) {
                EXPECT_GE(e.ms, 0.0) << e.kernel;
                attention += e.kernel == std::string("attention");
                lm_head += e.kernel == std::string("lm_head");
            }
            EXPECT_EQ(attention, ck->config.n_layers);
            EXPECT_EQ(lm_head, 1);
        }
        const std::vector<int> dup = {1, 1}, bad = {3}, in2 = {3, 4};
        EXPECT_THROW(batch->decode_batch(dup.data(), in2.data(), 2, nullptr), Error)
            << "a slot twice in one step";
        EXPECT_THROW(batch->decode_batch(bad.data(), in2.data(), 1, nullptr), Error)
            << "a slot past the last";
        const std::vector<int> long_prompt = testing::random_ids(700, 256, 4);
        EXPECT_THROW(batch->slot_eval(0, long_prompt.data(), 700), Error) << "more than the context";
    }
#endif
}

// Ten sequences of different lengths in one batched step: each row must be what that sequence's own step
// gives (its slot's decode graph), on a dense model (the step's graph) and on the MoE: at the tiny widths
// (expert width 24) the grouped GEMV kernels, at expert width 32 the step's graph with its experts on
// the device (moe_stream); the backend's note says which ran.
TEST(CudaBatchPasses, TenSequencesMatchEachAlone) {
#ifndef MARKBASE_HAS_CUDA
    GTEST_SKIP() << "no CUDA device: this build has no CUDA backend (MARKBASE_CUDA off or nvcc missing)";
#else
    const CudaDeviceInfo info = cuda_device_info();
    if (!info.available) GTEST_SKIP() << "no CUDA device: " << info.why_not;
    constexpr int kSeq = 10;
    for (const std::string family : {"e2b", "26b-a4b", "26b-a4b/stream"}) {
        SCOPED_TRACE(family);
        testing::TempDir dir("cuda-batch-passes-" + testing::test_name(family));
        nlohmann::json config = testing::tiny_config(family.substr(0, family.find('/')));
        const bool stream = family == "26b-a4b/stream";
        if (stream) config["moe_intermediate_size"] = 32;
        write_random_checkpoint(dir.path(), config, 22);
        auto ck = load_checkpoint(dir.path());
        const int64_t V = ck->config.vocab_size;
        BackendOptions o = testing::exact_options();
        o.ctx_size = 64;
        o.chunk = 16;
        o.slots = kSeq;
        auto together = make_cuda_backend(*ck, o);
        auto apart = make_cuda_backend(*ck, o);
        std::vector<int> slots(kSeq), last(kSeq);
        for (int s = 0; s < kSeq; ++s) {
            const std::vector<int> p = testing::random_ids(3 + s, 256, 100 + s);
            slots[s] = s;
            last[s] = p.back();
            for (auto* be : {together.get(), apart.get()}) be->slot_eval(s, p.data(), 2 + s);
        }
        std::vector<float> lg(kSeq * V), one(V);
        const std::vector<int> ids = together->decode_batch(slots.data(), last.data(), kSeq, lg.data());
        double worst = 0;
        for (int s = 0; s < kSeq; ++s) {
            const int id = apart->decode_batch(&slots[s], &last[s], 1, one.data()).at(0);
            EXPECT_EQ(ids[s], id) << "sequence " << s;
            worst = std::max(worst, testing::rel_err(one, std::vector<float>(lg.begin() + s * V,
                                                                             lg.begin() + (s + 1) * V)));
        }
        std::printf("  %s: %d sequences in one step vs each alone, worst rel err %.2e\n", family.c_str(),
                    kSeq, worst);
        EXPECT_LT(worst, 1e-3);
        if (family != "e2b") {
            const std::string note = together->prefill_note();
            const bool none =
                note.find("; 0 batched-step layers recorded with their experts on the device") !=
                std::string::npos;
            EXPECT_EQ(none, !stream) << note;
        }
    }
#endif
}

INSTANTIATE_TEST_SUITE_P(Families, CudaBatch, ::testing::Values("e2b", "e4b", "26b-a4b", "31b"),
                         [](const auto& p) { return testing::test_name(p.param); });

}  // namespace
}  // namespace markbase
