// The CPU forward must compute the same function however the sequence is fed: one batched pass, several
// prefill chunks (sliding rings wrapping mid-prompt), or token by token through the KV cache. Runs on random
// tiny checkpoints of every family; the golden tests check the function itself against transformers.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "loading/checkpoint.h"
#include "loading/config_json.h"
#include "loading/random_checkpoint.h"
#include "model/variants.h"
#include "runtime/backend.h"
#include "support/logits_compare.h"
#include "support/tiny_models.h"

namespace markbase {
namespace {

std::vector<float> run_all_logits(const Checkpoint& ck, const std::vector<int>& ids, int chunk,
                                  bool one_by_one) {
    BackendOptions o;
    o.ctx_size = 512;
    o.chunk = chunk;
    o.threads = 2;
    auto be = make_cpu_backend(ck, o);
    const int64_t V = ck.config.vocab_size;
    std::vector<float> out(ids.size() * V);
    if (one_by_one) {
        for (size_t i = 0; i < ids.size(); ++i) be->eval(&ids[i], 1, out.data() + i * V, false);
    } else {
        be->eval(ids.data(), static_cast<int64_t>(ids.size()), out.data(), true);
    }
    return out;
}

class ForwardConsistency : public ::testing::TestWithParam<std::string> {};

TEST_P(ForwardConsistency, BatchedChunkedAndCachedDecodeAgree) {
    testing::TempDir dir("fwd-" + GetParam());
    write_random_checkpoint(dir.path(), testing::tiny_config(GetParam()), 7);
    auto ck = load_checkpoint(dir.path());

    std::mt19937 rng(42);
    std::vector<int> ids(23);  // > 5 windows of 4
    ids[0] = 2;
    for (size_t i = 1; i < ids.size(); ++i) ids[i] = static_cast<int>(rng() % 256);

    const auto full = run_all_logits(*ck, ids, 64, false);
    const auto chunked = run_all_logits(*ck, ids, 5, false);
    const auto cached = run_all_logits(*ck, ids, 64, true);
    float max_abs = 0;
    for (float v : full) {
        ASSERT_TRUE(std::isfinite(v));
        max_abs = std::max(max_abs, std::fabs(v));
    }
    ASSERT_GT(max_abs, 0.1f) << "logits are suspiciously flat";
    for (size_t i = 0; i < full.size(); ++i) {
        ASSERT_NEAR(full[i], chunked[i], 1e-4f * max_abs) << "chunked prefill differs at " << i;
        ASSERT_NEAR(full[i], cached[i], 1e-4f * max_abs) << "cached decode differs at " << i;
    }
}

INSTANTIATE_TEST_SUITE_P(Families, ForwardConsistency, ::testing::Values("e2b", "e4b", "26b-a4b", "31b"),
                         [](const auto& p) { return testing::test_name(p.param); });

TEST(Forward, CountsMatchThePublishedSizes) {
    // GEMMA4.md 1.2: derived text parameters 4.65B (E2B), 7.52B (E4B), 25.23B (26B), 30.70B (31B);
    // PERFORMANCE.md: active bytes per token 4.56, 9.28, 7.64, 61.4 GB.
    struct Case {
        const char* v;
        double total_b, active_gb;
    };
    for (const Case& k : {Case{"e2b", 4.65, 4.56}, Case{"e4b", 7.52, 9.28}, Case{"26b-a4b", 25.23, 7.64},
                          Case{"31b", 30.70, 61.4}}) {
        const ModelConfig c = parse_config_text(variant_config(k.v).dump(), k.v);
        const ModelCounts n = count_params(c);
        EXPECT_NEAR(n.total_params / 1e9, k.total_b, 0.02 * k.total_b) << k.v;
        EXPECT_NEAR(n.bytes_per_token / 1e9, k.active_gb, 0.03 * k.active_gb) << k.v;
    }
}

}  // namespace
}  // namespace markbase

namespace markbase {
namespace {

TEST(KvCache, TruncateThenContinueEqualsAFreshRun) {
    testing::TempDir dir("trunc");
    write_random_checkpoint(dir.path(), testing::tiny_config("e2b"), 9);  // window 4, KV sharing
    auto ck = load_checkpoint(dir.path());
    BackendOptions o;
    o.ctx_size = 64;
    o.chunk = 8;
    o.threads = 2;
    auto a = make_cpu_backend(*ck, o);
    auto b = make_cpu_backend(*ck, o);
    std::vector<int> first{2, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
    std::vector<int> second{2, 10, 11, 12, 13, 14, 15, 16, 99, 98, 97, 96, 95};
    const int64_t V = ck->config.vocab_size;
    std::vector<float> la(V), lb(V);
    a->eval(first.data(), 12, la.data(), false);
    ASSERT_TRUE(a->truncate(8));  // rolls back 4 positions: within the ring's slack (chunk 8)
    EXPECT_EQ(a->n_past(), 8);
    a->eval(second.data() + 8, 5, la.data(), false);
    b->eval(second.data(), 13, lb.data(), false);
    for (int64_t i = 0; i < V; ++i) ASSERT_NEAR(la[i], lb[i], 1e-5f) << i;
}

// The deepest rollback is pinned exactly. Window 4 and chunk 8 give sliding rings of 12 slots; after 43
// positions the rings hold 31..42, and a query at n reads n - 3 .. n, so continuing from 34 works (and must
// equal a fresh run) while 33 needs position 30, which is gone, and is refused with the cache unchanged.
TEST(KvCache, DeepestRollbackIsExactlyWhatTheRingsStillHold) {
    testing::TempDir dir("rollback");
    write_random_checkpoint(dir.path(), testing::tiny_config("e2b"), 9);
    auto ck = load_checkpoint(dir.path());
    ASSERT_EQ(ck->config.sliding_window, 4);
    BackendOptions o;
    o.ctx_size = 64;
    o.chunk = 8;
    o.threads = 2;
    const std::vector<int> seq = testing::random_ids(43, 256, 5);
    const std::vector<int> tail{7, 8, 9, 10, 11, 12};

    auto a = make_cpu_backend(*ck, o);
    a->eval(seq.data(), 43, nullptr, false);
    EXPECT_FALSE(a->truncate(33));
    EXPECT_EQ(a->n_past(), 43);
    ASSERT_TRUE(a->truncate(34));
    EXPECT_EQ(a->n_past(), 34);
    const int64_t V = ck->config.vocab_size;
    std::vector<float> got(tail.size() * V), want(tail.size() * V);
    a->eval(tail.data(), static_cast<int64_t>(tail.size()), got.data(), true);

    auto fresh = make_cpu_backend(*ck, o);
    fresh->eval(seq.data(), 34, nullptr, false);
    fresh->eval(tail.data(), static_cast<int64_t>(tail.size()), want.data(), true);
    EXPECT_LE(testing::rel_err(want, got), 1e-6);

    // rolling back to the start needs nothing from the rings
    ASSERT_TRUE(a->truncate(0));
    EXPECT_EQ(a->n_past(), 0);
    EXPECT_FALSE(a->truncate(1));  // and there is nothing past n_past to keep
}

}  // namespace
}  // namespace markbase
