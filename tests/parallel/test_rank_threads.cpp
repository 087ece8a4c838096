// RankThreads (issue 7): each call runs the task once on every rank's own thread, returns only when all are
// done, and an error on any rank reaches the caller (and the threads stay usable).
#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "model/error.h"
#include "parallel/rank_threads.h"

namespace markbase {
namespace {

TEST(RankThreads, RunsEveryRankOnItsOwnThreadAndWaits) {
    RankThreads t(3);
    EXPECT_EQ(t.world(), 3);
    std::vector<int> seen(3, 0);
    std::vector<std::thread::id> ids(3);
    for (int round = 0; round < 50; ++round) {
        t.run([&](int r) {
            ++seen[static_cast<size_t>(r)];
            ids[static_cast<size_t>(r)] = std::this_thread::get_id();
        });
        for (int r = 0; r < 3; ++r) ASSERT_EQ(seen[static_cast<size_t>(r)], round + 1) << "rank " << r;
    }
    const std::set<std::thread::id> distinct(ids.begin(), ids.end());
    EXPECT_EQ(distinct.size(), 3u);
    EXPECT_EQ(distinct.count(std::this_thread::get_id()), 0u) << "not on the caller's thread";
}

TEST(RankThreads, RanksRunTogether) {
    // each rank waits for the other: only concurrent execution finishes (as NCCL calls need)
    RankThreads t(2);
    std::atomic<int> arrived{0};
    t.run([&](int) {
        ++arrived;
        while (arrived.load() < 2) std::this_thread::yield();
    });
    EXPECT_EQ(arrived.load(), 2);
}

TEST(RankThreads, AnErrorOnOneRankReachesTheCaller) {
    RankThreads t(2);
    try {
        t.run([](int r) {
            if (r == 1) throw Error("rank 1 failed");
        });
        FAIL() << "expected the rank's error";
    } catch (const Error& e) {
        EXPECT_STREQ(e.what(), "rank 1 failed");
    }
    int ok = 0;
    t.run([&](int r) {
        if (r == 0) ok = 1;
    });
    EXPECT_EQ(ok, 1) << "usable after an error";
    EXPECT_THROW(RankThreads(0), Error);
}

}  // namespace
}  // namespace markbase
