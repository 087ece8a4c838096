// The serving engine on the bundled model: batching (and preemption) change no greedy id, stop strings and
// stop ids end a reply without being shown, the context's end is generate()'s, cancel frees the slot,
// shutdown ends everything in flight, seeded sampling repeats itself, and the metrics add up.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "model/error.h"
#include "server/engine_fixture.h"

namespace markbase::server {
namespace {

using Sinks = std::vector<std::shared_ptr<Collect>>;

const std::vector<std::string> kTexts = {"And God said", "In the beginning", "The LORD is my shepherd",
                                         "Blessed are the", "Jesus answered and said"};

TEST_F(EngineTest, BatchingChangesNoGreedyId) {
    auto sb = make_cpu_slot_backend(*ck_, options(3));
    auto engine = make_engine(*sb, *tok_, ck_->config, limits(3));  // 5 requests: two wait for a slot
    Sinks sinks;
    for (const auto& t : kTexts) {
        sinks.push_back(std::make_shared<Collect>());
        engine->submit(request(prompt(t), greedy(), 24), sinks.back());
    }
    for (size_t i = 0; i < kTexts.size(); ++i) {
        ASSERT_TRUE(sinks[i]->wait_done());
        const std::vector<int> want = alone(prompt(kTexts[i]), greedy(), 24);
        EXPECT_EQ(sinks[i]->ids(), want) << kTexts[i];
        EXPECT_EQ(sinks[i]->reason(), FinishReason::Length);
        EXPECT_EQ(sinks[i]->text(), tok_->decode(want, true));
        EXPECT_EQ(sinks[i]->usage().completion_tokens, 24);
        EXPECT_EQ(sinks[i]->usage().prompt_tokens, static_cast<int>(prompt(kTexts[i]).size()));
        EXPECT_EQ(sinks[i]->finishes(), 1);
    }
    const EngineMetrics m = settled(*engine);
    EXPECT_EQ(m.requests_ok, 5u);
    EXPECT_EQ(m.generated_tokens, 5u * 24);
    EXPECT_EQ(m.kv_blocks_used, 0);
    EXPECT_EQ(m.preemptions, 0u);
    // the steps' split: every prompt in one chunk, each reply's tokens after the first from a decode row
    size_t prompt_tokens = 0;
    for (const auto& t : kTexts) prompt_tokens += prompt(t).size();
    EXPECT_EQ(m.step_prompt_tokens, prompt_tokens);
    EXPECT_EQ(m.step_decode_rows, 5u * 23);
    EXPECT_GE(m.steps, 24u);
    EXPECT_GT(m.step_prefill_s, 0.0);
    EXPECT_GT(m.step_decode_s, 0.0);
    EXPECT_GT(m.step_engine_s, 0.0);
}

TEST_F(EngineTest, PreemptionRecomputesAndKeepsGreedyIds) {
    auto sb = make_cpu_slot_backend(*ck_, options(3));
    EngineLimits l = limits(3);
    l.kv_blocks = 32;  // one context of 256 (16 full + 16 sliding blocks); three replies of 100 do not fit
    auto engine = make_engine(*sb, *tok_, ck_->config, l);
    Sinks sinks;
    for (size_t i = 0; i < 3; ++i) {
        sinks.push_back(std::make_shared<Collect>());
        engine->submit(request(prompt(kTexts[i]), greedy(), 100), sinks.back());
    }
    for (size_t i = 0; i < 3; ++i) {
        ASSERT_TRUE(sinks[i]->wait_done());
        EXPECT_EQ(sinks[i]->reason(), FinishReason::Length);
        EXPECT_EQ(sinks[i]->ids(), alone(prompt(kTexts[i]), greedy(), 100)) << kTexts[i];
    }
    const EngineMetrics m = settled(*engine);
    EXPECT_GT(m.preemptions, 0u);
    EXPECT_EQ(m.kv_blocks_used, 0);
    EXPECT_EQ(m.kv_blocks_free, 32);
}

TEST_F(EngineTest, StopStringSplitAcrossTokensIsFoundAndNotShown) {
    const std::vector<int> p = prompt("And God said");
    const std::vector<int> ids = alone(p, greedy(), 40);
    // the stop string: the last 2 bytes of token k's text and the first 2 of token k+1's
    std::string a, b, stop;
    size_t k = 3;
    for (; k + 1 < ids.size() && stop.empty(); ++k) {
        a = tok_->decode(std::vector<int>(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k)), true);
        b = tok_->decode(std::vector<int>(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k + 1)),
                         true);
        if (a.size() >= 2 && b.size() >= a.size() + 2 && b.compare(0, a.size(), a) == 0)
            stop = a.substr(a.size() - 2) + b.substr(a.size(), 2);
    }
    ASSERT_FALSE(stop.empty());
    const std::string full = tok_->decode(ids, true);
    size_t completes = 0;  // the token that completes the stop string's first occurrence
    while (
        tok_->decode(std::vector<int>(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(completes + 1)),
                     true)
            .find(stop) == std::string::npos)
        ++completes;

    auto sb = make_cpu_slot_backend(*ck_, options(2));
    auto engine = make_engine(*sb, *tok_, ck_->config, limits(2));
    auto sink = std::make_shared<Collect>();
    GenerationRequest r = request(p, greedy(), 40);
    r.stop = {"no such text", stop};
    engine->submit(r, sink);
    ASSERT_TRUE(sink->wait_done());
    EXPECT_EQ(sink->reason(), FinishReason::Stop);
    EXPECT_EQ(sink->text(), full.substr(0, full.find(stop))) << "stop string: '" << stop << "'";
    EXPECT_EQ(sink->usage().completion_tokens, static_cast<int>(completes + 1));
    for (const TokenEvent& ev : sink->events()) EXPECT_EQ(ev.text.find(stop), std::string::npos);
}

TEST_F(EngineTest, StopIdEndsTheReplyUnshownUnlessIgnored) {
    const std::vector<int> p = prompt("In the beginning");
    const std::vector<int> ids = alone(p, greedy(), 30);
    size_t k = 3;
    while (std::find(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids[k]) != ids.begin() + k)
        ++k;
    auto sb = make_cpu_slot_backend(*ck_, options(2));
    auto engine = make_engine(*sb, *tok_, ck_->config, limits(2));
    auto stopped = std::make_shared<Collect>(), ignored = std::make_shared<Collect>();
    GenerationRequest r = request(p, greedy(), 30);
    r.stop_ids = {ids[k]};
    engine->submit(r, stopped);
    r.ignore_eos = true;
    engine->submit(r, ignored);
    ASSERT_TRUE(stopped->wait_done());
    ASSERT_TRUE(ignored->wait_done());
    EXPECT_EQ(stopped->reason(), FinishReason::Stop);
    EXPECT_EQ(stopped->ids(), std::vector<int>(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k)));
    EXPECT_EQ(stopped->usage().completion_tokens, static_cast<int>(k + 1));
    EXPECT_EQ(ignored->reason(), FinishReason::Length);
    EXPECT_EQ(ignored->ids(), ids);
}

TEST_F(EngineTest, TheContextEndsTheReplyWhereGenerateDoes) {
    std::vector<int> p = prompt("And God said");
    while (p.size() < static_cast<size_t>(kCtx) - 6) p.push_back(p[1 + p.size() % 3]);
    const std::vector<int> want = alone(p, greedy(), 100);
    ASSERT_EQ(want.size(), 7u);  // ctx - prompt + 1: the last one is never fed
    auto sb = make_cpu_slot_backend(*ck_, options(1));
    auto engine = make_engine(*sb, *tok_, ck_->config, limits(1));
    auto sink = std::make_shared<Collect>();
    engine->submit(request(p, greedy(), 100), sink);
    ASSERT_TRUE(sink->wait_done());
    EXPECT_EQ(sink->reason(), FinishReason::Length);
    EXPECT_EQ(sink->ids(), want);
}

TEST_F(EngineTest, CancelFreesTheSlot) {
    auto sb = make_cpu_slot_backend(*ck_, options(1));
    auto engine = make_engine(*sb, *tok_, ck_->config, limits(1));
    auto running = std::make_shared<Collect>(), queued = std::make_shared<Collect>();
    auto next = std::make_shared<Collect>();
    SamplingParams sp = greedy();
    const uint64_t a = engine->submit(request(prompt(kTexts[0]), sp, 200), running);
    const uint64_t b = engine->submit(request(prompt(kTexts[1]), sp, 5), queued);
    engine->cancel(b);  // still waiting for the only slot
    ASSERT_TRUE(queued->wait_done());
    EXPECT_EQ(queued->reason(), FinishReason::Cancelled);
    EXPECT_TRUE(queued->ids().empty());
    ASSERT_TRUE(running->wait_tokens(2));
    engine->cancel(a);
    ASSERT_TRUE(running->wait_done());
    EXPECT_EQ(running->reason(), FinishReason::Cancelled);
    EXPECT_LT(running->ids().size(), 200u);
    engine->cancel(a);  // again: nothing happens
    const EngineMetrics m = settled(*engine);
    EXPECT_EQ(m.kv_blocks_used, 0);
    EXPECT_EQ(m.requests_cancelled, 2u);
    engine->submit(request(prompt(kTexts[2]), sp, 8), next);  // the freed slot serves the next one
    ASSERT_TRUE(next->wait_done());
    EXPECT_EQ(next->ids(), alone(prompt(kTexts[2]), sp, 8));
    EXPECT_EQ(running->finishes(), 1);
}

TEST_F(EngineTest, ShutdownEndsEveryRequestInFlight) {
    auto sb = make_cpu_slot_backend(*ck_, options(2));
    auto engine = make_engine(*sb, *tok_, ck_->config, limits(2));
    Sinks sinks;
    for (const auto& t : kTexts) {
        sinks.push_back(std::make_shared<Collect>());
        engine->submit(request(prompt(t), greedy(), 200), sinks.back());
    }
    ASSERT_TRUE(sinks[0]->wait_tokens(1));
    engine->shutdown();
    for (const auto& s : sinks) {
        EXPECT_EQ(s->finishes(), 1);  // shutdown returns after every sink heard its end
        EXPECT_EQ(s->reason(), FinishReason::Error);
        EXPECT_EQ(s->error(), "server shutting down");
    }
    EXPECT_THROW(engine->submit(request(prompt("x"), greedy(), 4), std::make_shared<Collect>()), Error);
    engine->shutdown();
    EXPECT_EQ(engine->metrics().requests_error, kTexts.size());
}

TEST_F(EngineTest, SeededSamplingIsReproducible) {
    SamplingParams sp;
    sp.temperature = 0.8f;
    sp.top_k = 64;
    sp.top_p = 0.95f;
    sp.seed = 1234;
    const std::vector<int> p = prompt("The LORD is my shepherd");
    const std::vector<int> want = alone(p, sp, 30);
    auto sb = make_cpu_slot_backend(*ck_, options(3));
    auto engine = make_engine(*sb, *tok_, ck_->config, limits(3));
    auto first = std::make_shared<Collect>(), second = std::make_shared<Collect>();
    auto other = std::make_shared<Collect>();
    engine->submit(request(p, sp, 30), first);
    SamplingParams sp2 = sp;
    sp2.seed = 99;
    engine->submit(request(p, sp2, 30), other);
    engine->submit(request(p, sp, 30), second);
    ASSERT_TRUE(first->wait_done());
    ASSERT_TRUE(second->wait_done());
    ASSERT_TRUE(other->wait_done());
    EXPECT_EQ(first->ids(), want);
    EXPECT_EQ(second->ids(), want);
    EXPECT_NE(other->ids(), want);
}

TEST_F(EngineTest, LogprobsAndMetrics) {
    auto sb = make_cpu_slot_backend(*ck_, options(2));
    auto engine = make_engine(*sb, *tok_, ck_->config, limits(2));
    auto sink = std::make_shared<Collect>();
    GenerationRequest r = request(prompt("Blessed are the"), greedy(), 12);
    r.top_logprobs = 3;
    engine->submit(r, sink);
    ASSERT_TRUE(sink->wait_done());
    for (const TokenEvent& ev : sink->events()) {
        ASSERT_EQ(ev.top.size(), 3u);
        ASSERT_EQ(ev.top_text.size(), 3u);
        EXPECT_EQ(ev.top[0].first, ev.id);  // greedy takes the most likely
        EXPECT_EQ(ev.logprob, ev.top[0].second);
        EXPECT_LE(ev.logprob, 0.0f);
        EXPECT_GE(ev.top[0].second, ev.top[1].second);
        EXPECT_EQ(ev.top_text[1].first, tok_->decode(std::vector<int>{ev.top[1].first}));
    }
    const EngineMetrics m = settled(*engine);
    EXPECT_EQ(m.requests_ok, 1u);
    EXPECT_EQ(m.generated_tokens, 12u);
    EXPECT_EQ(m.prompt_tokens, prompt("Blessed are the").size());
    EXPECT_EQ(m.ttft_n, 1u);
    EXPECT_EQ(m.tpot_n, 1u);
    EXPECT_GT(sink->usage().decode_tok_s, 0.0);
    ASSERT_EQ(m.ttft_counts.size(), m.ttft_bounds.size());
    for (size_t i = 1; i < m.ttft_counts.size(); ++i) EXPECT_GE(m.ttft_counts[i], m.ttft_counts[i - 1]);
    EXPECT_LE(m.ttft_counts.back(), m.ttft_n);
}

TEST_F(EngineTest, RefusesWhatCannotRun) {
    auto sb = make_cpu_slot_backend(*ck_, options(1));
    EngineLimits l = limits(1);
    l.max_queue = 0;
    auto engine = make_engine(*sb, *tok_, ck_->config, l);
    auto a = std::make_shared<Collect>();
    const uint64_t id = engine->submit(request(prompt(kTexts[0]), greedy(), 200), a);
    EXPECT_THROW(engine->submit(request(prompt(kTexts[1]), greedy(), 4), std::make_shared<Collect>()),
                 QueueFull);
    engine->cancel(id);
    ASSERT_TRUE(a->wait_done());
    settled(*engine);
    auto sink = std::make_shared<Collect>();
    EXPECT_THROW(engine->submit(request(std::vector<int>(kCtx, 2), greedy(), 4), sink), Error);
    EXPECT_THROW(engine->submit(request({2, 1 << 20}, greedy(), 4), sink), Error);
    GenerationRequest r = request(prompt("x"), greedy(), 4);
    r.top_logprobs = 21;
    EXPECT_THROW(engine->submit(r, sink), Error);
    EXPECT_EQ(sink->finishes(), 0);
    EXPECT_THROW(make_engine(*sb, *tok_, ck_->config, limits(2)), Error);  // more sequences than slots
}

}  // namespace
}  // namespace markbase::server
