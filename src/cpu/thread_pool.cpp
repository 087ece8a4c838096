#include "cpu/thread_pool.h"

#include <chrono>
#include <memory>

#if defined(__linux__)
#include <sched.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "cpu/cpu_topology.h"

namespace markbase::cpu {
namespace {

// True on a thread that is running a chunk: a nested parallel_for then runs inline instead of deadlocking.
thread_local bool t_in_parallel = false;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
}

// How long a waiting thread spins before it sleeps. Between two matmuls of one layer the caller does only a
// little serial work (a norm, a residual add), so a short spin keeps the next wake-up free of a syscall.
constexpr auto kSpinTime = std::chrono::microseconds(200);

// Spins until value != old, or until kSpinTime has passed; returns the last value read. After a short pure
// spin it yields between polls, so an oversubscribed pool (more threads than free cores) lets the thread it
// waits for run instead of burning that thread's core.
template <typename T>
T spin_while_equal(const std::atomic<T>& a, T old) {
    T v = a.load(std::memory_order_acquire);
    if (v != old) return v;
    for (int i = 0; i < 2000; ++i) {
        cpu_relax();
        v = a.load(std::memory_order_acquire);
        if (v != old) return v;
    }
    const auto deadline = std::chrono::steady_clock::now() + kSpinTime;
    for (;;) {
        std::this_thread::yield();
        for (int i = 0; i < 16; ++i) {
            cpu_relax();
            v = a.load(std::memory_order_acquire);
            if (v != old) return v;
        }
        if (std::chrono::steady_clock::now() > deadline) return v;
    }
}

inline int64_t chunk_begin(int64_t n, int chunks, int i) {
    // n * i fits in int64 for any n this engine sees (< 2^55) times a thread count (< 2^8).
    return n * i / chunks;
}

// Binds the calling thread to one CPU (best effort: a refused bind leaves it where it was).
void bind_to(int cpu) {
#if defined(__linux__)
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    (void)sched_setaffinity(0, sizeof set, &set);
#else
    (void)cpu;
#endif
}

thread_local bool t_bound = false;  // this thread was bound by a pinned pool's parallel_for

std::mutex g_global_mutex;
std::unique_ptr<ThreadPool> g_global;

}  // namespace

ThreadPool::ThreadPool(int n_threads, bool pin) {
    if (n_threads <= 0) n_threads = default_thread_count();
    n_threads_ = n_threads > 0 ? n_threads : 1;
    errors_.resize(n_threads_);
    if (pin) {
        cpus_ = allowed_cpus();
        if (static_cast<int>(cpus_.size()) < n_threads_) cpus_.clear();
    }
    workers_.reserve(n_threads_ - 1);
    for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_main(i); });
}

ThreadPool::~ThreadPool() {
    stop_.store(true, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunk(int index) noexcept {
    const int64_t b = chunk_begin(job_n_, n_threads_, index);
    const int64_t e = chunk_begin(job_n_, n_threads_, index + 1);
    if (b >= e) return;
    t_in_parallel = true;
    try {
        (*job_)(b, e);
    } catch (...) {
        errors_[index] = std::current_exception();
    }
    t_in_parallel = false;
}

void ThreadPool::worker_main(int index) {
    if (!cpus_.empty()) bind_to(cpus_[static_cast<size_t>(index)]);
    uint32_t seen = 0;
    for (;;) {
        uint32_t g = spin_while_equal(generation_, seen);
        if (g == seen) {
            generation_.wait(seen, std::memory_order_acquire);
            continue;
        }
        seen = g;
        if (stop_.load(std::memory_order_relaxed)) return;
        run_chunk(index);
        if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
    }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    if (n <= 0) return;
    if (n_threads_ == 1 || n == 1 || t_in_parallel) {
        fn(0, n);
        return;
    }
    std::lock_guard<std::mutex> lock(call_mutex_);
    if (!cpus_.empty() && !t_bound) {
        bind_to(cpus_[0]);
        t_bound = true;
    }
    job_ = &fn;
    job_n_ = n;
    for (auto& e : errors_) e = nullptr;
    pending_.store(n_threads_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();

    run_chunk(0);

    for (;;) {
        int p = pending_.load(std::memory_order_acquire);
        if (p == 0) break;
        p = spin_while_equal(pending_, p);
        if (p == 0) break;
        pending_.wait(p, std::memory_order_acquire);
    }
    job_ = nullptr;
    std::exception_ptr first;
    for (auto& e : errors_) {
        if (e && !first) first = e;
        e = nullptr;
    }
    if (first) std::rethrow_exception(first);
}

ThreadPool& ThreadPool::global() {
    std::lock_guard<std::mutex> lock(g_global_mutex);
    if (!g_global) g_global = std::make_unique<ThreadPool>(0);
    return *g_global;
}

void ThreadPool::set_global_threads(int n) {
    std::lock_guard<std::mutex> lock(g_global_mutex);
    g_global = std::make_unique<ThreadPool>(n);
}

}  // namespace markbase::cpu
