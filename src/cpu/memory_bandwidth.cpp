#include "cpu/memory_bandwidth.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "cpu/matmul.h"
#include "model/bf16.h"

namespace markbase::cpu {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Integer sums: associative, so the compiler vectorises them, and far faster than memory on any core.
// One sequential stream: the classic read test.
uint64_t sum_sequential(const uint64_t* p, int64_t n) {
    uint64_t acc[8] = {};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) acc[j] += p[i + j];
    for (; i < n; ++i) acc[0] += p[i];
    uint64_t total = 0;
    for (int j = 0; j < 8; ++j) total += acc[j];
    return total;
}

// Sixteen neighbouring 8 KB rows read side by side, as a GEMV reads a tile of weight rows. Which of the two
// patterns a core streams faster differs between CPUs (Zen 4: one stream; Sapphire Rapids: many), and the
// ceiling is the faster one.
uint64_t sum_rows(const uint64_t* p, int64_t n) {
    constexpr int64_t kRow = 1024, kRows = 16, kBlock = kRow * kRows;
    uint64_t acc[8] = {};
    int64_t b = 0;
    for (; b + kBlock <= n; b += kBlock) {
        for (int64_t i = 0; i < kRow; i += 8)
            for (int64_t r = 0; r < kRows; ++r)
                for (int j = 0; j < 8; ++j) acc[j] += p[b + r * kRow + i + j];
    }
    uint64_t total = sum_sequential(p + b, n - b);
    for (int j = 0; j < 8; ++j) total += acc[j];
    return total;
}

std::atomic<uint64_t> g_sink{0};  // keeps the sums alive

// Every thread of the pool runs `loop` (flops done in `rounds` rounds) at once; the sum of their rates,
// median of 3 passes.
double measure_peak_gflops(ThreadPool& pool, double (*loop)(int64_t rounds)) {
    // rounds per timed call: ~0.1 s at 100 GFLOP/s per core on the widest path (16 chains x 16 lanes x 2)
    constexpr int64_t kRounds = int64_t{20} << 20;
    const int threads = pool.size();
    std::vector<double> passes;
    for (int pass = 0; pass < 3; ++pass) {
        std::vector<double> rate(static_cast<size_t>(threads), 0.0);
        pool.parallel_for(threads, [&](int64_t b, int64_t e) {
            for (int64_t t = b; t < e; ++t) {
                const auto t0 = Clock::now();
                const double flops = loop(kRounds);
                rate[static_cast<size_t>(t)] = flops / seconds_since(t0) / 1e9;
            }
        });
        double sum = 0;
        for (double r : rate) sum += r;
        passes.push_back(sum);
    }
    return median(passes);
}

}  // namespace

double measure_fma_peak_gflops(ThreadPool& pool) {
    return measure_peak_gflops(pool, &fma_peak_rounds);
}

double measure_bf16_peak_gflops(ThreadPool& pool) {
    return bf16_products_supported() ? measure_peak_gflops(pool, &bf16_peak_rounds) : 0.0;
}

BandwidthResult measure_read_bandwidth(ThreadPool& pool, size_t bytes) {
    const int64_t words = static_cast<int64_t>(std::max<size_t>(bytes / sizeof(uint64_t), 1));
    std::unique_ptr<uint64_t[]> buf(new uint64_t[static_cast<size_t>(words)]);
    uint64_t* p = buf.get();
    // Written by the threads that will read it, so each slice's pages sit near its reader on NUMA machines.
    pool.parallel_for(words, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) p[i] = static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull;
    });
    auto pass = [&](bool rows) {
        pool.parallel_for(words, [&](int64_t b, int64_t e) {
            const uint64_t v = rows ? sum_rows(p + b, e - b) : sum_sequential(p + b, e - b);
            g_sink.fetch_add(v, std::memory_order_relaxed);
        });
    };
    pass(false);
    pass(true);
    std::vector<double> times[2];
    for (int i = 0; i < 5; ++i) {
        for (int rows = 0; rows < 2; ++rows) {
            const auto t0 = Clock::now();
            pass(rows != 0);
            times[rows].push_back(seconds_since(t0));
        }
    }
    const double best = std::min(median(times[0]), median(times[1]));
    BandwidthResult r;
    r.bytes = static_cast<double>(words) * sizeof(uint64_t);
    r.read_gbs = r.bytes / best / 1e9;
    r.threads = pool.size();
    return r;
}

namespace {

struct GemvResult {
    double ms;
    double gbs;
};

// Median time of matmul_bf16 at n tokens; weights are random bf16 in [-1, 1), never zeros. A weight smaller
// than 512 MB is replicated and the copies are used in turn, so every call streams it from memory, not from
// L3.
GemvResult time_matmul(ThreadPool& pool, int64_t n, int64_t in, int64_t out, int reps) {
    const int64_t elems = in * out;
    const int64_t copies = std::max<int64_t>(1, ((int64_t{512} << 20) + elems * 2 - 1) / (elems * 2));
    std::vector<bf16> w(static_cast<size_t>(elems * copies));
    pool.parallel_for(out * copies, [&](int64_t b, int64_t e) {
        std::mt19937 r(static_cast<uint32_t>(b) * 7919u + 17u);
        std::uniform_real_distribution<float> ud(-1.0f, 1.0f);
        for (int64_t i = b * in; i < e * in; ++i) w[static_cast<size_t>(i)] = float_to_bf16(ud(r));
    });
    std::mt19937 rng(1234);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(n * in)), y(static_cast<size_t>(n * out));
    for (auto& v : x) v = u(rng);
    for (int64_t c = 0; c < copies; ++c)
        matmul_bf16(pool, x.data(), n, in, w.data() + c * elems, out, y.data());
    std::vector<double> times;
    for (int i = 0; i < reps; ++i) {
        const bf16* wc = w.data() + (i % copies) * elems;
        const auto t0 = Clock::now();
        matmul_bf16(pool, x.data(), n, in, wc, out, y.data());
        times.push_back(seconds_since(t0));
    }
    const double t = median(times);
    const double bytes = static_cast<double>(elems) * sizeof(bf16) + static_cast<double>(n * (in + out)) * 4;
    return {t * 1e3, bytes / t / 1e9};
}

}  // namespace

void run_matmul_bench(ThreadPool& pool) {
    const BandwidthResult bw = measure_read_bandwidth(pool);
    std::printf("simd path: %s, threads: %d\n", matmul_simd_path(), pool.size());
    std::printf("read bandwidth: %.2f GB/s (%.0f MB buffer, best pattern, median of 5)\n", bw.read_gbs,
                bw.bytes / 1e6);
    const int64_t shapes[][2] = {{2816, 2816}, {5376, 21504}, {1536, 262144}};  // {in, out}
    for (const auto& s : shapes) {
        const int reps = s[0] * s[1] > (int64_t{1} << 26) ? 9 : 64;
        const GemvResult r = time_matmul(pool, 1, s[0], s[1], reps);
        std::printf("gemv  out=%-7lld in=%-6lld %8.3f ms  %7.2f GB/s  %5.1f%% of read\n",
                    static_cast<long long>(s[1]), static_cast<long long>(s[0]), r.ms, r.gbs,
                    100.0 * r.gbs / bw.read_gbs);
    }
    for (int64_t n : {int64_t{2}, int64_t{4}, int64_t{5}, int64_t{8}, int64_t{16}, int64_t{32}, int64_t{128},
                      int64_t{512}}) {
        const int64_t in = 2048, out = 2048;
        const GemvResult r = time_matmul(pool, n, in, out, n >= 128 ? 7 : 32);
        const double gflops = 2.0 * static_cast<double>(n * in * out) / (r.ms * 1e-3) / 1e9;
        std::printf("matmul n=%-4lld 2048x2048 %8.3f ms  %7.1f GFLOP/s  %7.2f GB/s of weight\n",
                    static_cast<long long>(n), r.ms, gflops, r.gbs);
    }
}

}  // namespace markbase::cpu
