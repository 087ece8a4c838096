// The CPU SlotBackend on the bundled model: four sequences with different prompts, admitted at different
// steps and listed in shifting orders, each decoding its own greedy continuation; every logits row must be
// bit-identical to that sequence run alone through make_cpu_backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "loading/checkpoint.h"
#include "model/error.h"
#include "runtime/backend.h"
#include "runtime/slot_backend.h"

namespace markbase {
namespace {

const std::string kModel = std::string(MARKBASE_TEST_DATA) + "/../../models/default";

int argmax(const float* row, int64_t n) {
    return static_cast<int>(std::max_element(row, row + n) - row);
}

struct Alone {
    std::vector<int> next;                 // the greedy token after the prompt and after each decode
    std::vector<std::vector<float>> rows;  // the logits that chose each
};

// chunk 4: the prompts span several forward() calls, so the slot backend must split them the same way
BackendOptions options(int slots) {
    BackendOptions o;
    o.threads = 2;
    o.ctx_size = 128;
    o.chunk = 4;
    o.slots = slots;
    return o;
}

Alone run_alone(const Checkpoint& ck, const std::vector<int>& prompt, int decodes) {
    auto be = make_cpu_backend(ck, options(1));
    const int64_t V = ck.config.vocab_size;
    Alone a;
    std::vector<float> row(static_cast<size_t>(V));
    be->eval(prompt.data(), static_cast<int64_t>(prompt.size()), row.data(), false);
    for (int i = 0;; ++i) {
        a.rows.push_back(row);
        a.next.push_back(argmax(row.data(), V));
        if (i == decodes) break;
        be->eval(&a.next.back(), 1, row.data(), false);
    }
    return a;
}

TEST(CpuSlots, InterleavedSequencesMatchEachRunAlone) {
    auto ck = load_checkpoint(kModel);
    const int64_t V = ck->config.vocab_size;
    const std::vector<std::vector<int>> prompts = {
        {2, 651, 4130, 1176}, {2, 17, 300, 41, 99, 1000, 7, 7, 12, 5, 801}, {2, 5000}, {2, 9, 8, 7, 6, 5, 4}};
    const int decodes = 6;
    std::vector<Alone> alone;
    for (const auto& p : prompts) alone.push_back(run_alone(*ck, p, decodes));

    auto sb = make_cpu_slot_backend(*ck, options(4));
    ASSERT_EQ(sb->slots(), 4);
    // sequence s enters at step s (its prompt beside the others' decodes) and lives in slot 3 - s
    std::vector<int> fed(prompts.size(), -1);  // decode tokens fed so far; -1: prompt not fed
    for (int step = 0; step < static_cast<int>(prompts.size()) + decodes; ++step) {
        std::vector<SlotWork> work;
        std::vector<int> seq_of;
        std::vector<int> token(prompts.size());
        for (int k = 0; k < static_cast<int>(prompts.size()); ++k) {
            const int s = (k + step) % static_cast<int>(prompts.size());  // a different order every step
            if (s > step || fed[s] >= decodes) continue;
            SlotWork w;
            w.slot = 3 - s;
            w.logits = true;
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
        std::vector<float> logits(work.size() * static_cast<size_t>(V));
        std::vector<int> next(work.size(), -1);
        sb->eval_slots(work, logits.data(), next.data());
        for (size_t r = 0; r < work.size(); ++r) {
            const int s = seq_of[r];
            ++fed[s];
            const std::vector<float>& want = alone[s].rows[static_cast<size_t>(fed[s])];
            ASSERT_EQ(std::memcmp(want.data(), logits.data() + r * V, sizeof(float) * V), 0)
                << "sequence " << s << " after " << fed[s] << " decode tokens (step " << step << ")";
            EXPECT_EQ(next[r], alone[s].next[static_cast<size_t>(fed[s])]) << "the row's argmax";
        }
    }
    for (int s = 0; s < 4; ++s) EXPECT_EQ(fed[s], decodes);
    EXPECT_EQ(sb->n_past(3), static_cast<int64_t>(prompts[0].size()) + decodes);

    // a reset slot starts over: the first prompt again gives its first row
    sb->reset_slot(0);
    std::vector<float> row(static_cast<size_t>(V));
    sb->eval_slots({SlotWork{0, prompts[0], true}}, row.data());
    EXPECT_EQ(std::memcmp(row.data(), alone[0].rows[0].data(), sizeof(float) * V), 0);

    // only the argmax, no logits buffer at all
    sb->reset_slot(1);
    int next = -1;
    sb->eval_slots({SlotWork{1, prompts[0], true, true}}, nullptr, &next);
    EXPECT_EQ(next, alone[0].next[0]);
}

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
