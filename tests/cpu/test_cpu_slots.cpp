// The CPU SlotBackend: sequences with different prompts, admitted at different steps and listed in shifting
// orders, each decoding its own greedy continuation; every logits row must be bit-identical to that sequence
// run alone through make_cpu_backend. A step's one-token items run as one batched pass (CpuModel::
// forward_decode), so these check that a row's bits do not depend on its neighbours in the batch: on the
// bundled model and on tiny random checkpoints of every family (the MoE's routing, KV sharing, wrapping
// sliding rings).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "loading/checkpoint.h"
#include "loading/random_checkpoint.h"
#include "model/error.h"
#include "runtime/backend.h"
#include "runtime/slot_backend.h"
#include "support/cpu_alone.h"
#include "support/logits_compare.h"
#include "support/tiny_models.h"

namespace markbase {
namespace {

const std::string kModel = std::string(MARKBASE_TEST_DATA) + "/../../models/default";

// chunk 4: the prompts span several forward() calls, so the slot backend must split them the same way; and
// more than 4 slots decode in several batches of at most 4 rows
BackendOptions options(int slots) {
    BackendOptions o;
    o.threads = 2;
    o.ctx_size = 128;
    o.chunk = 4;
    o.slots = slots;
    return o;
}

// How run_steps feeds the sequences: sequence s enters at step enter[s] (its prompt beside the others'
// decode tokens) into slot slot[s]. With vary, on step k sequence k % S asks for no logits, and every odd
// step passes no logits buffer at all (only the argmax in next).
struct Plan {
    std::vector<int> enter, slot;
    bool vary = false;
};

// Runs every sequence's prompt and `decodes` greedy tokens through sb, listing the items in a different order
// every step, and checks every row it gets against the sequence alone.
void run_steps(SlotBackend& sb, const Checkpoint& ck, const std::vector<std::vector<int>>& prompts,
               int decodes, const Plan& plan) {
    const int64_t V = ck.config.vocab_size;
    const int S = static_cast<int>(prompts.size());
    std::vector<testing::AloneRun> alone;
    for (const auto& p : prompts) alone.push_back(testing::run_alone_on_cpu(ck, options(1), p, decodes));
    std::vector<int> fed(prompts.size(), -1);  // decode tokens fed so far; -1: prompt not fed
    std::vector<int> token(prompts.size());
    for (int step = 0;; ++step) {
        std::vector<SlotWork> work;
        std::vector<int> seq_of;
        for (int k = 0; k < S; ++k) {
            const int s = (k + step) % S;
            if (step < plan.enter[s] || fed[s] >= decodes) continue;
            SlotWork w;
            w.slot = plan.slot[s];
            w.logits = !(plan.vary && step % S == s);
            if (fed[s] < 0) {
                w.ids = prompts[s];
            } else {
                token[s] = alone[s].next[static_cast<size_t>(fed[s])];
                w.ids = std::span<const int>(&token[s], 1);
            }
            work.push_back(w);
            seq_of.push_back(s);
        }
        if (work.empty()) break;
        const bool no_buffer = plan.vary && step % 2 == 1;
        std::vector<float> logits(work.size() * static_cast<size_t>(V), NAN);
        std::vector<int> next(work.size(), -1);
        sb.eval_slots(work, no_buffer ? nullptr : logits.data(), next.data());
        size_t r = 0;
        for (size_t k = 0; k < work.size(); ++k) {
            const int s = seq_of[k];
            ++fed[s];
            if (!work[k].logits) continue;
            const std::vector<float>& want = alone[s].rows[static_cast<size_t>(fed[s])];
            if (!no_buffer) {
                ASSERT_EQ(std::memcmp(want.data(), logits.data() + r * V, sizeof(float) * V), 0)
                    << "sequence " << s << " after " << fed[s] << " decode tokens (step " << step << ")";
            }
            EXPECT_EQ(next[r], alone[s].next[static_cast<size_t>(fed[s])])
                << "the row's argmax, sequence " << s << " step " << step;
            ++r;
        }
    }
    for (int s = 0; s < S; ++s) {
        EXPECT_EQ(fed[s], decodes);
        EXPECT_EQ(sb.n_past(plan.slot[s]), static_cast<int64_t>(prompts[s].size()) + decodes);
    }
}

TEST(CpuSlots, InterleavedSequencesMatchEachRunAlone) {
    auto ck = load_checkpoint(kModel);
    const int64_t V = ck->config.vocab_size;
    const std::vector<std::vector<int>> prompts = {
        {2, 651, 4130, 1176}, {2, 17, 300, 41, 99, 1000, 7, 7, 12, 5, 801}, {2, 5000}, {2, 9, 8, 7, 6, 5, 4}};
    auto sb = make_cpu_slot_backend(*ck, options(4));
    ASSERT_EQ(sb->slots(), 4);
    // sequence s enters at step s (so the decode batches grow from 1 to 3 rows beside a prompt, then 4 rows)
    // and lives in slot 3 - s
    run_steps(*sb, *ck, prompts, 6, Plan{{0, 1, 2, 3}, {3, 2, 1, 0}, false});

    // a reset slot starts over: the first prompt again gives its first row
    const testing::AloneRun first = testing::run_alone_on_cpu(*ck, options(1), prompts[0], 0);
    sb->reset_slot(0);
    std::vector<float> row(static_cast<size_t>(V));
    sb->eval_slots({SlotWork{0, prompts[0], true}}, row.data());
    EXPECT_EQ(std::memcmp(row.data(), first.rows[0].data(), sizeof(float) * V), 0);

    // only the argmax, no logits buffer at all
    sb->reset_slot(1);
    int next = -1;
    sb->eval_slots({SlotWork{1, prompts[0], true, true}}, nullptr, &next);
    EXPECT_EQ(next, first.next[0]);
}

// Six sequences decoding in the same steps: batches of 4 and 2 rows (chunk 4), a one-token prompt that goes
// through the batched pass, rows that want no logits (they still advance their caches) and steps that take
// only the argmax.
TEST(CpuSlots, SequencesDecodingTogetherMatchEachRunAlone) {
    auto ck = load_checkpoint(kModel);
    const std::vector<std::vector<int>> prompts = {
        {2, 651, 4130, 1176}, {2}, {2, 17, 300, 41, 99}, {2, 5000}, {2, 9, 8, 7, 6, 5, 4}, {2, 33}};
    auto sb = make_cpu_slot_backend(*ck, options(6));
    run_steps(*sb, *ck, prompts, 7, Plan{{0, 0, 0, 0, 0, 0}, {0, 1, 2, 3, 4, 5}, true});
}

// The same on tiny random checkpoints of every family: the 26B-A4B's per-row routing, E2B's KV sharing, the
// 31B's k_eq_v layers, and sliding rings (window 4, 8 slots) that wrap while decoding.
class CpuSlotsFamilies : public ::testing::TestWithParam<std::string> {};

TEST_P(CpuSlotsFamilies, BatchedDecodeMatchesEachRunAlone) {
    testing::TempDir dir("slots-" + GetParam());
    write_random_checkpoint(dir.path(), testing::tiny_config(GetParam()), 13);
    auto ck = load_checkpoint(dir.path());
    const int vocab = ck->config.vocab_size;
    const std::vector<std::vector<int>> prompts = {
        testing::random_ids(9, vocab, 1), testing::random_ids(3, vocab, 2), testing::random_ids(6, vocab, 3),
        testing::random_ids(1, vocab, 4), testing::random_ids(5, vocab, 5)};
    auto sb = make_cpu_slot_backend(*ck, options(5));
    run_steps(*sb, *ck, prompts, 12, Plan{{0, 0, 1, 3, 3}, {4, 0, 2, 1, 3}, true});
}

INSTANTIATE_TEST_SUITE_P(Families, CpuSlotsFamilies, ::testing::Values("e2b", "e4b", "26b-a4b", "31b"),
                         [](const auto& p) { return testing::test_name(p.param); });

TEST(CpuSlots, RejectsInvalidSteps) {
    auto ck = load_checkpoint(kModel);
    auto sb = make_cpu_slot_backend(*ck, options(2));
    const std::vector<int> ids = {2, 17};
    EXPECT_THROW(sb->eval_slots({SlotWork{2, ids, false}}, nullptr), Error);
    EXPECT_THROW(sb->eval_slots({SlotWork{1, ids, false}, SlotWork{1, ids, false}}, nullptr), Error);
    EXPECT_THROW(sb->eval_slots({SlotWork{0, {}, false}}, nullptr), Error);
    const std::vector<int> bad = {2, 1 << 20};
    EXPECT_THROW(sb->eval_slots({SlotWork{0, bad, false}}, nullptr), Error);
    const std::vector<int> too_long(129, 2);
    EXPECT_THROW(sb->eval_slots({SlotWork{0, ids, false}, SlotWork{1, too_long, false}}, nullptr), Error);
    EXPECT_EQ(sb->n_past(0), 0) << "a refused step evaluates nothing";
}

}  // namespace
}  // namespace markbase

namespace markbase {
namespace {

// --kv-cache-dtype bf16 and fp8 on the CPU: every key and value rounded to bf16 or to e4m3 (no scale) as the
// GPU's caches hold them (the references tests/cuda/test_cuda_kv_bf16.cpp and test_cuda_kv_fp8.cpp hold the
// GPU to). Near the exact cache's logits, not equal to them, fp8 further than bf16 (3 mantissa bits against
// 8); and the slot backend rounds alike: its row is bit-identical to the single-sequence backend's.
TEST(CpuRoundedCache, RoundsEveryKeyAndValueAsTheGpusCachesDo) {
    testing::TempDir dir("cpu-rounded-cache");
    write_random_checkpoint(dir.path(), testing::tiny_config("e2b"), 5);
    auto ck = load_checkpoint(dir.path());
    const int64_t V = ck->config.vocab_size;
    const std::vector<int> ids = testing::random_ids(30, 256, 5);
    BackendOptions o = options(1);
    auto exact = make_cpu_backend(*ck, o);
    const std::vector<float> a = testing::all_logits(*exact, ids, false);
    double err[2] = {0, 0};
    for (const KvDtype kv : {KvDtype::kBf16, KvDtype::kFp8}) {
        const char* name = kv == KvDtype::kBf16 ? "bf16" : "fp8";
        o.kv_dtype = kv;
        auto rounded = make_cpu_backend(*ck, o);
        const std::vector<float> b = testing::all_logits(*rounded, ids, false);
        const double e = err[kv == KvDtype::kFp8] = testing::rel_err(a, b);
        EXPECT_GT(e, 0.0) << "the " << name << " cache changed nothing";
        auto sb = make_cpu_slot_backend(*ck, o);
        SlotWork w;
        w.slot = 0;
        w.ids = ids;
        w.logits = true;
        std::vector<float> row(V);
        sb->eval_slots({w}, row.data());
        EXPECT_EQ(0, std::memcmp(row.data(), b.data() + (ids.size() - 1) * V, V * sizeof(float))) << name;
    }
    std::printf("  against the exact cache: bf16 %.2e, fp8 %.2e\n", err[0], err[1]);
    EXPECT_LT(err[0], 0.1);  // measured 9.1e-3
    EXPECT_LT(err[1], 0.3);  // measured 0.17
    EXPECT_GT(err[1], 2 * err[0]) << "the fp8 cache rounds no coarser than bf16, so it is not e4m3";
}

}  // namespace
}  // namespace markbase
