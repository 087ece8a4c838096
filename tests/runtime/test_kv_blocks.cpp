// The paged KV block bookkeeping: no block leaked or owned twice through a long random walk, sliding tables
// that keep only the window, KV-shared layers that own nothing, and a full pool reported as such.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "runtime/kv_blocks.h"

namespace markbase {
namespace {

KvBlockOptions opts(int64_t n_blocks, int block, int window, bool full, bool sliding) {
    KvBlockOptions o;
    o.n_blocks = n_blocks;
    o.block_size = block;
    o.sliding_window = window;
    o.full = full;
    o.sliding = sliding;
    return o;
}

int64_t ceil_div(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

TEST(KvBlocks, RandomWalkLeaksNothing) {
    const int B = 4, W = 10;
    KvBlockAllocator kv(opts(64, B, W, true, true));
    std::mt19937_64 rng(29);
    std::vector<uint64_t> live;
    uint64_t next_id = 1;
    int refused = 0;
    for (int step = 0; step < 10000; ++step) {
        const int op = static_cast<int>(rng() % 10);
        if (op < 2 || live.empty()) {  // admit: a prompt of 1..40 positions
            const int64_t n = 1 + static_cast<int64_t>(rng() % 40);
            const int64_t before = kv.used(), cost = kv.grow_cost(next_id, n);
            if (kv.grow(next_id, n)) {
                EXPECT_EQ(kv.used() - before, cost);
                live.push_back(next_id);
            } else {
                ++refused;
                EXPECT_EQ(kv.used(), before);
                EXPECT_EQ(kv.tables(next_id), nullptr);
            }
            ++next_id;
        } else if (op < 8) {  // grow by a chunk of 1..8, then the step ends (trim)
            const uint64_t id = live[rng() % live.size()];
            const int64_t n0 = kv.tables(id)->n_pos, n = std::min<int64_t>(n0 + 1 + rng() % 8, 200);
            const int64_t before = kv.used(), cost = kv.grow_cost(id, n);
            if (kv.grow(id, n)) {
                EXPECT_EQ(kv.used() - before, cost);
                // mid-chunk: the first query's window plus the chunk
                EXPECT_LE(static_cast<int64_t>(kv.tables(id)->sliding.size()),
                          ceil_div(W - 1 + (n - n0), B) + 1);
            } else {
                ++refused;
                EXPECT_EQ(kv.used(), before);
                EXPECT_EQ(kv.tables(id)->n_pos, n0);
            }
            kv.trim(id);
            EXPECT_LE(static_cast<int64_t>(kv.tables(id)->sliding.size()), ceil_div(W, B) + 1);
        } else {  // finish or cancel: both free everything
            const size_t k = rng() % live.size();
            kv.free(live[k]);
            EXPECT_EQ(kv.tables(live[k]), nullptr);
            live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
        }
        ASSERT_NO_THROW(kv.check()) << "at step " << step;
        ASSERT_EQ(kv.used() + kv.free_blocks(), kv.total());
    }
    EXPECT_GT(refused, 0) << "the walk never exhausted the pool";
    kv.free_all();
    EXPECT_EQ(kv.used(), 0);
    EXPECT_EQ(kv.sequences(), 0);
    EXPECT_NO_THROW(kv.check());
}

TEST(KvBlocks, SlidingTableKeepsOnlyTheWindow) {
    const int B = 4, W = 8;
    KvBlockAllocator kv(opts(16, B, W, false, true));
    ASSERT_TRUE(kv.grow(1, 1));
    for (int64_t n = 2; n <= 300; ++n) {
        ASSERT_TRUE(kv.grow(1, n)) << n;  // one decode token per step, never more than the window's blocks
        kv.trim(1);
        const KvBlockTables* t = kv.tables(1);
        EXPECT_EQ(t->sliding_first, std::max<int64_t>(0, n - W + 1) / B);
        EXPECT_LE(static_cast<int64_t>(t->sliding.size()), ceil_div(W, B) + 1);
        EXPECT_EQ(kv.used(), static_cast<int64_t>(t->sliding.size()));
        EXPECT_TRUE(t->full.empty());
    }
    ASSERT_NO_THROW(kv.check());

    // a full table over the same positions keeps them all
    KvBlockAllocator full(opts(100, B, W, true, false));
    ASSERT_TRUE(full.grow(1, 300));
    EXPECT_EQ(full.used(), ceil_div(300, B));
    EXPECT_EQ(full.blocks_for(300, 16), ceil_div(300, B));
}

TEST(KvBlocks, KvSharedLayersOwnNoBlocks) {
    ModelConfig c;
    c.sliding_window = 64;
    c.n_layers = 3;
    c.layers.resize(3);
    c.layers[0].kind = AttentionKind::Sliding;
    c.layers[1].kind = AttentionKind::Sliding;
    c.layers[1].kv_source = 0;
    c.layers[2].kind = AttentionKind::Full;
    c.layers[2].kv_source = 0;  // shared: it brings no table of its own kind
    KvBlockOptions o = KvBlockOptions::for_model(c, 32);
    EXPECT_TRUE(o.sliding);
    EXPECT_FALSE(o.full);
    EXPECT_EQ(o.sliding_window, 64);
    c.layers[2].kv_source = -1;
    o = KvBlockOptions::for_model(c, 32);
    EXPECT_TRUE(o.full);
    KvBlockAllocator kv(o);
    ASSERT_TRUE(kv.grow(7, 20));  // 2 blocks of 16 per kind
    EXPECT_EQ(kv.used(), 4);
}

TEST(KvBlocks, ExhaustionIsReportedAndChangesNothing) {
    KvBlockAllocator kv(opts(4, 4, 8, true, false));
    ASSERT_TRUE(kv.grow(1, 16));
    EXPECT_EQ(kv.free_blocks(), 0);
    EXPECT_FALSE(kv.grow(2, 1));
    EXPECT_EQ(kv.tables(2), nullptr);
    EXPECT_FALSE(kv.grow(1, 17));
    EXPECT_EQ(kv.tables(1)->n_pos, 16);
    EXPECT_EQ(kv.max_growable(1, 100), 16);
    EXPECT_EQ(kv.max_growable(2, 100), 0);
    kv.free(1);
    EXPECT_EQ(kv.max_growable(2, 100), 16);
    EXPECT_TRUE(kv.grow(2, 1));
    EXPECT_NO_THROW(kv.check());
    EXPECT_THROW(kv.grow(2, 0), std::logic_error);  // shrinking is a caller bug, not a pool state
}

}  // namespace
}  // namespace markbase
