#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "cpu/thread_pool.h"

#if defined(__linux__)
#include <sched.h>
#endif

namespace markbase::cpu {
namespace {

TEST(ThreadPool, CoversEveryIndexExactlyOnce) {
    for (int threads : {1, 2, 3, 4, 7, 16}) {
        ThreadPool pool(threads);
        EXPECT_EQ(pool.size(), threads);
        for (int64_t n : {0, 1, 2, 3, 5, 15, 16, 17, 100, 1023, 100000}) {
            std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
            std::atomic<int> calls{0};
            pool.parallel_for(n, [&](int64_t b, int64_t e) {
                ASSERT_LT(b, e);
                ASSERT_GE(b, 0);
                ASSERT_LE(e, n);
                calls.fetch_add(1);
                for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
            });
            for (int64_t i = 0; i < n; ++i)
                ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "n=" << n << " i=" << i;
            EXPECT_LE(calls.load(), threads);
            EXPECT_EQ(calls.load(), n < threads ? n : threads) << "threads=" << threads << " n=" << n;
        }
    }
}

TEST(ThreadPool, ChunksAreContiguousAndBalanced) {
    ThreadPool pool(4);
    std::vector<std::pair<int64_t, int64_t>> chunks(4, {-1, -1});
    std::atomic<int> next{0};
    pool.parallel_for(10, [&](int64_t b, int64_t e) {
        chunks[static_cast<size_t>(next.fetch_add(1))] = {b, e};
    });
    ASSERT_EQ(next.load(), 4);
    for (const auto& c : chunks) {
        EXPECT_GE(c.second - c.first, 2);
        EXPECT_LE(c.second - c.first, 3);
    }
}

TEST(ThreadPool, ManySmallCallsInARow) {
    ThreadPool pool(3);
    std::atomic<int64_t> total{0};
    for (int rep = 0; rep < 2000; ++rep) {
        pool.parallel_for(3, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
    }
    EXPECT_EQ(total.load(), 6000);
}

TEST(ThreadPool, ExceptionPropagatesToCaller) {
    ThreadPool pool(4);
    for (int64_t thrower : {0, 1, 3}) {  // chunk of the caller and of workers
        std::atomic<int> finished{0};
        EXPECT_THROW(pool.parallel_for(4,
                                       [&](int64_t b, int64_t) {
                                           if (b == thrower) throw std::runtime_error("boom");
                                           finished.fetch_add(1);
                                       }),
                     std::runtime_error);
        EXPECT_EQ(finished.load(), 3);  // the others ran to completion before the rethrow
    }
    // The pool still works afterwards.
    std::atomic<int64_t> total{0};
    pool.parallel_for(1000, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
    EXPECT_EQ(total.load(), 1000);
}

TEST(ThreadPool, NestedCallRunsInline) {
    ThreadPool pool(4);
    std::atomic<int64_t> total{0};
    pool.parallel_for(8, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
            pool.parallel_for(10, [&](int64_t b2, int64_t e2) { total.fetch_add(e2 - b2); });
        }
    });
    EXPECT_EQ(total.load(), 80);
}

TEST(ThreadPool, ConcurrentCallersTakeTurns) {
    ThreadPool pool(3);
    std::atomic<int64_t> total{0};
    std::vector<std::thread> callers;
    for (int c = 0; c < 3; ++c) {
        callers.emplace_back([&] {
            for (int rep = 0; rep < 500; ++rep) {
                pool.parallel_for(100, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
            }
        });
    }
    for (auto& t : callers) t.join();
    EXPECT_EQ(total.load(), 3 * 500 * 100);
}

// cpu_pin: chunk i runs on the i-th CPU of the affinity mask, every call (worker i takes chunk i); the
// calling thread is bound too, so it is run on a thread of its own here.
TEST(ThreadPool, PinnedChunksRunOnTheirOwnCpus) {
#if defined(__linux__)
    cpu_set_t set;
    CPU_ZERO(&set);
    ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
    std::vector<int> cpus;
    for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &set)) cpus.push_back(c);
    if (cpus.size() < 2) GTEST_SKIP() << "one CPU in this process's affinity mask: nothing to pin apart";
    std::thread caller([&] {
        ThreadPool pool(2, true);
        for (int call = 0; call < 50; ++call) {
            std::vector<int> where(2, -1);
            pool.parallel_for(2, [&](int64_t b, int64_t e) {
                for (int64_t i = b; i < e; ++i) where[static_cast<size_t>(i)] = sched_getcpu();
            });
            EXPECT_EQ(where[0], cpus[0]) << "call " << call;
            EXPECT_EQ(where[1], cpus[1]) << "call " << call;
        }
    });
    caller.join();
#else
    GTEST_SKIP() << "thread binding is Linux only";
#endif
}

TEST(ThreadPool, GlobalPool) {
    ThreadPool::set_global_threads(3);
    EXPECT_EQ(ThreadPool::global().size(), 3);
    std::atomic<int64_t> total{0};
    ThreadPool::global().parallel_for(50, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
    EXPECT_EQ(total.load(), 50);
    ThreadPool::set_global_threads(0);
    EXPECT_GE(ThreadPool::global().size(), 1);
}

}  // namespace
}  // namespace markbase::cpu
