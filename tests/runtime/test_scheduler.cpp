// The continuous-batching scheduler as plain logic: admission in arrival order, a step budget that feeds
// long prompts in chunks beside every decode, cancellation that frees at once, preemption of the newest
// sequence with its generated ids kept for recompute, and the queue limit.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "model/error.h"
#include "runtime/scheduler.h"

namespace markbase {
namespace {

SchedulerLimits lim(int seqs, int queue, int budget, int64_t ctx) {
    SchedulerLimits l;
    l.max_sequences = seqs;
    l.max_queue = queue;
    l.step_token_budget = budget;
    l.ctx_size = ctx;
    return l;
}

KvBlockOptions pool(int64_t n_blocks, int block = 16, bool sliding = false, int window = 64) {
    KvBlockOptions o;
    o.n_blocks = n_blocks;
    o.block_size = block;
    o.sliding_window = window;
    o.full = true;
    o.sliding = sliding;
    return o;
}

std::vector<int> prompt(int n, int base) {
    std::vector<int> v(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = base + i;
    return v;
}

// The driver's part of a step: every sequence whose logits came back gets the next token.
void sample_all(Scheduler& s, const Step& st, int token = 7) {
    for (const StepWork& w : st.work)
        if (w.wants_logits) s.append(w.seq, token);
}

const StepWork* work_of(const Step& st, uint64_t seq) {
    for (const StepWork& w : st.work)
        if (w.seq == seq) return &w;
    return nullptr;
}

TEST(Scheduler, AdmitsInArrivalOrderWhileSlotsAreFree) {
    Scheduler s(lim(2, 8, 64, 256), pool(64));
    for (uint64_t id = 1; id <= 4; ++id) ASSERT_TRUE(s.add(id, prompt(5, 100 * static_cast<int>(id))));
    Step st = s.schedule();
    EXPECT_EQ(st.admitted, (std::vector<uint64_t>{1, 2}));
    ASSERT_EQ(st.work.size(), 2u);
    EXPECT_EQ(st.work[0].slot, 0);
    EXPECT_EQ(st.work[1].slot, 1);
    EXPECT_EQ(st.work[0].ids, prompt(5, 100));
    EXPECT_TRUE(st.work[0].wants_logits);
    EXPECT_EQ(s.state(3), SeqState::Waiting);
    sample_all(s, st);
    EXPECT_EQ(s.state(1), SeqState::Decoding);

    s.finish(1);  // retired at once: its slot goes to the next in line, 3 (not 4)
    EXPECT_EQ(s.state(1), SeqState::Finished);
    st = s.schedule();
    EXPECT_EQ(st.admitted, (std::vector<uint64_t>{3}));
    ASSERT_NE(work_of(st, 3), nullptr);
    EXPECT_EQ(work_of(st, 3)->slot, 0);
    EXPECT_EQ(work_of(st, 3)->pos0, 0);
    ASSERT_NE(work_of(st, 2), nullptr);
    EXPECT_EQ(work_of(st, 2)->ids, std::vector<int>{7});  // its sampled token, at position 5
    EXPECT_EQ(work_of(st, 2)->pos0, 5);
    EXPECT_EQ(st.work.front().seq, 2u) << "decodes come before prompts";
    EXPECT_EQ(s.state(4), SeqState::Waiting);
}

TEST(Scheduler, LongPromptIsChunkedBesideEveryDecode) {
    const int budget = 64;
    Scheduler s(lim(4, 8, budget, 4096), pool(1024));
    for (uint64_t id = 1; id <= 3; ++id) ASSERT_TRUE(s.add(id, prompt(5, 10)));
    Step st = s.schedule();
    sample_all(s, st);
    ASSERT_TRUE(s.add(9, prompt(2000, 1)));
    int64_t fed = 0;
    int steps = 0;
    bool done = false;
    while (!done) {
        st = s.schedule();
        ++steps;
        ASSERT_LE(st.tokens(), budget + 3);  // the budget is the prompt's; the 3 decodes come on top
        for (uint64_t id = 1; id <= 3; ++id) {
            const StepWork* w = work_of(st, id);
            ASSERT_NE(w, nullptr) << "step " << steps << " did not decode sequence " << id;
            EXPECT_EQ(w->ids.size(), 1u);
        }
        const StepWork* p = work_of(st, 9);
        ASSERT_NE(p, nullptr);
        EXPECT_EQ(p->pos0, fed);
        EXPECT_EQ(static_cast<int64_t>(p->ids.size()), std::min<int64_t>(budget, 2000 - fed));
        fed += static_cast<int64_t>(p->ids.size());
        done = p->wants_logits;
        EXPECT_EQ(done, fed == 2000);
        sample_all(s, st);
    }
    EXPECT_EQ(steps, (2000 + budget - 1) / budget);
    EXPECT_EQ(s.state(9), SeqState::Decoding);
}

// Each prompt chunk is a pass over the weights, so a second prompt of a step starts only when it fits whole
// in what the first left of the budget; the first prompt of a step is the only one cut.
TEST(Scheduler, SecondPromptWaitsRatherThanStartingWithASliver) {
    Scheduler s(lim(4, 8, 64, 4096), pool(1024));
    ASSERT_TRUE(s.add(1, prompt(40, 1)));
    ASSERT_TRUE(s.add(2, prompt(40, 2)));
    ASSERT_TRUE(s.add(3, prompt(20, 3)));
    Step st = s.schedule();
    ASSERT_NE(work_of(st, 1), nullptr);
    EXPECT_EQ(work_of(st, 1)->ids.size(), 40u);
    EXPECT_EQ(work_of(st, 2), nullptr) << "40 ids do not fit the 24 left: no 24-id sliver";
    EXPECT_EQ(work_of(st, 3), nullptr) << "admission order: 3 waits behind 2";
    sample_all(s, st);
    st = s.schedule();
    ASSERT_NE(work_of(st, 2), nullptr);
    ASSERT_NE(work_of(st, 3), nullptr);
    EXPECT_EQ(work_of(st, 2)->ids.size(), 40u);
    EXPECT_EQ(work_of(st, 3)->ids.size(), 20u) << "40 + 20 fit the 64 whole";
    ASSERT_NE(work_of(st, 1), nullptr);
    EXPECT_EQ(work_of(st, 1)->ids.size(), 1u);
    sample_all(s, st);
    ASSERT_TRUE(s.add(4, prompt(100, 4)));
    st = s.schedule();
    ASSERT_NE(work_of(st, 4), nullptr);
    EXPECT_EQ(work_of(st, 4)->ids.size(), 64u) << "the step's first prompt is cut to the budget";
}

// A backend that runs a step as one pass (one_pass_steps: the CUDA mixed step) gets at most the budget of
// ids a step, the decodes included, and every prompt is cut to fill it; a budget below max_sequences is
// refused there (the decodes could take it whole while a freed slot's prompt waits).
TEST(Scheduler, OnePassStepsCountTheDecodesAndFillTheBudget) {
    SchedulerLimits l = lim(4, 8, 64, 4096);
    l.one_pass_steps = true;
    Scheduler s(l, pool(1024));
    ASSERT_TRUE(s.add(1, prompt(5, 1)));
    Step st = s.schedule();
    sample_all(s, st);  // 1 decodes from now on
    ASSERT_TRUE(s.add(2, prompt(40, 2)));
    ASSERT_TRUE(s.add(3, prompt(100, 3)));
    st = s.schedule();
    EXPECT_EQ(st.tokens(), 64) << "1 decode + 40 + a 23-id sliver of the third";
    ASSERT_NE(work_of(st, 2), nullptr);
    ASSERT_NE(work_of(st, 3), nullptr);
    EXPECT_EQ(work_of(st, 2)->ids.size(), 40u);
    EXPECT_EQ(work_of(st, 3)->ids.size(), 23u);
    EXPECT_FALSE(work_of(st, 3)->wants_logits);
    sample_all(s, st);
    st = s.schedule();  // 1 and 2 decode; 3's next 62
    EXPECT_EQ(st.tokens(), 64);
    ASSERT_NE(work_of(st, 3), nullptr);
    EXPECT_EQ(work_of(st, 3)->ids.size(), 62u);
    EXPECT_EQ(work_of(st, 3)->pos0, 23);

    l = lim(8, 1, 7, 64);
    l.one_pass_steps = true;
    try {
        Scheduler bad(l, pool(64));
        ADD_FAILURE() << "a budget of 7 for 8 sequences was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("token budget (-b, 7) must be at least max_sequences (-np, 8)"),
                  std::string::npos)
            << e.what();
    }
    l.step_token_budget = 8;
    Scheduler ok(l, pool(64));  // one prompt id beside seven decodes
    l.one_pass_steps = false;
    l.step_token_budget = 7;
    Scheduler chunks(l, pool(64));  // the prompts' budget: decodes come on top
}

TEST(Scheduler, CancelFreesBlocksAndSlotWithinTheStep) {
    Scheduler s(lim(1, 8, 64, 256), pool(32));
    ASSERT_TRUE(s.add(1, prompt(40, 1)));
    ASSERT_TRUE(s.add(2, prompt(10, 1)));
    Step st = s.schedule();
    sample_all(s, st);
    EXPECT_EQ(s.blocks().used(), 3);  // 40 positions in blocks of 16
    EXPECT_TRUE(s.cancel(2));         // waiting: just leaves the queue
    EXPECT_EQ(s.waiting(), 0);
    EXPECT_TRUE(s.cancel(1));  // running: blocks and slot back now
    EXPECT_EQ(s.blocks().used(), 0);
    EXPECT_EQ(s.running(), 0);
    EXPECT_FALSE(s.cancel(1));
    EXPECT_TRUE(s.idle());
    ASSERT_TRUE(s.add(3, prompt(4, 1)));
    st = s.schedule();
    ASSERT_EQ(st.work.size(), 1u);
    EXPECT_EQ(st.work[0].slot, 0);
    EXPECT_NO_THROW(s.blocks().check());
}

TEST(Scheduler, PreemptsTheNewestAndResumesItWithItsTokens) {
    // blocks of 4 positions, a pool of 10: one context of 32 fits (8 blocks), two sequences of 20 do not
    Scheduler s(lim(2, 8, 16, 32), pool(10, 4));
    ASSERT_TRUE(s.add(1, prompt(8, 100)));
    ASSERT_TRUE(s.add(2, prompt(8, 200)));
    Step st = s.schedule();
    ASSERT_EQ(st.admitted.size(), 2u);
    sample_all(s, st, 1);
    std::vector<int> b_ids;
    for (int step = 0; step < 40 && st.preempted.empty(); ++step) {
        b_ids = *s.ids(2);
        st = s.schedule();
        for (const StepWork& w : st.work) ASSERT_TRUE(w.wants_logits);
        if (st.preempted.empty()) sample_all(s, st, 2 + step);
        ASSERT_NO_THROW(s.blocks().check());
    }
    ASSERT_EQ(st.preempted, std::vector<uint64_t>{2}) << "the newest sequence gives way";
    EXPECT_EQ(s.state(2), SeqState::Waiting);
    EXPECT_EQ(*s.ids(2), b_ids) << "its generated tokens are kept";
    EXPECT_GT(b_ids.size(), 8u);
    EXPECT_EQ(work_of(st, 2), nullptr);
    ASSERT_NE(work_of(st, 1), nullptr);
    sample_all(s, st, 99);
    s.finish(1);
    // readmitted: everything it knows is fed again as a prompt, in budget-sized chunks, then it decodes
    int64_t fed = 0;
    while (true) {
        st = s.schedule();
        const StepWork* w = work_of(st, 2);
        ASSERT_NE(w, nullptr);
        EXPECT_EQ(w->pos0, fed);
        EXPECT_TRUE(std::equal(w->ids.begin(), w->ids.end(), b_ids.begin() + fed));
        fed += static_cast<int64_t>(w->ids.size());
        if (w->wants_logits) break;
    }
    EXPECT_EQ(fed, static_cast<int64_t>(b_ids.size()));
    s.append(2, 5);
    EXPECT_EQ(s.state(2), SeqState::Decoding);
}

TEST(Scheduler, RefusesBeyondMaxQueue) {
    Scheduler s(lim(1, 2, 16, 64), pool(16));
    EXPECT_TRUE(s.add(1, prompt(3, 1)));  // takes the free slot's place
    EXPECT_TRUE(s.add(2, prompt(3, 1)));
    EXPECT_TRUE(s.add(3, prompt(3, 1)));
    EXPECT_FALSE(s.add(4, prompt(3, 1)));
    Step st = s.schedule();
    sample_all(s, st);
    EXPECT_EQ(s.waiting(), 2);
    EXPECT_FALSE(s.add(4, prompt(3, 1)));
    EXPECT_TRUE(s.cancel(3));
    EXPECT_TRUE(s.add(4, prompt(3, 1)));
    EXPECT_THROW(s.add(5, prompt(65, 1)), Error);  // longer than the context
    EXPECT_THROW(s.add(5, {}), Error);
}

TEST(Scheduler, RejectsAPoolTooSmallForOneContext) {
    EXPECT_THROW(Scheduler(lim(1, 1, 16, 64), pool(3)), Error);
    EXPECT_THROW(Scheduler(lim(4, 1, 0, 64), pool(64)), Error);  // no prompt budget
}

// A seeded random walk of a driver: every step stays within the budget, decodes every decoding sequence,
// never feeds past the context, and the blocks always add up; with one-pass steps, the decodes within it.
void random_walk(bool one_pass) {
    const int64_t ctx = 48;
    SchedulerLimits l = lim(3, 4, 12, ctx);
    l.one_pass_steps = one_pass;
    Scheduler s(l, pool(30, 4, true, 8));
    std::mt19937_64 rng(7);
    uint64_t next = 1;
    std::map<uint64_t, int> budget_left;  // tokens each live request may still generate
    for (int step = 0; step < 3000; ++step) {
        if (rng() % 3 == 0) {
            const int n = 1 + static_cast<int>(rng() % 30);
            if (s.add(next, prompt(n, 1))) budget_left[next] = 1 + static_cast<int>(rng() % 30);
            ++next;
        }
        if (rng() % 10 == 0 && !budget_left.empty()) {
            auto it = std::next(budget_left.begin(), static_cast<std::ptrdiff_t>(rng() % budget_left.size()));
            EXPECT_TRUE(s.cancel(it->first));
            budget_left.erase(it);
        }
        std::vector<uint64_t> decoding;
        for (const auto& [id, left] : budget_left)
            if (s.state(id) == SeqState::Decoding) decoding.push_back(id);
        Step st = s.schedule();
        // the prompt budget and one decode of each of the 3 sequences, or the decodes within it
        ASSERT_LE(st.tokens(), one_pass ? 12 : 12 + 3);
        for (uint64_t id : decoding) {
            if (std::find(st.preempted.begin(), st.preempted.end(), id) != st.preempted.end()) continue;
            ASSERT_NE(work_of(st, id), nullptr) << "step " << step << ": decoding " << id << " skipped";
        }
        for (const StepWork& w : st.work) {
            ASSERT_LE(w.pos0 + static_cast<int64_t>(w.ids.size()), ctx);
            if (!w.wants_logits) continue;
            const bool done = --budget_left[w.seq] == 0 || static_cast<int64_t>(s.ids(w.seq)->size()) == ctx;
            if (done) {
                s.finish(w.seq);
                budget_left.erase(w.seq);
            } else {
                s.append(w.seq, 3);
            }
        }
        ASSERT_NO_THROW(s.blocks().check()) << "step " << step;
        ASSERT_LE(s.running(), 3);
    }
    for (const auto& [id, left] : budget_left) s.cancel(id);
    EXPECT_EQ(s.blocks().used(), 0);
    EXPECT_TRUE(s.idle());
}

TEST(Scheduler, RandomDriverKeepsInvariants) {
    random_walk(false);
}
TEST(Scheduler, RandomDriverKeepsInvariantsWithOnePassSteps) {
    random_walk(true);
}

}  // namespace
}  // namespace markbase
