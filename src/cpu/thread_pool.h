// A persistent pool of worker threads for the CPU backend.
//
// parallel_for is called about ten times per layer per token, so it must cost microseconds, not tens of them:
// workers spin briefly on a generation counter before they sleep (futex via std::atomic::wait), and the
// caller thread does the first chunk itself instead of waiting idle.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace markbase::cpu {

class ThreadPool {
  public:
    // n_threads counts the caller: a pool of 4 starts 3 workers. 0 means default_thread_count(): one per
    // physical core of the process's affinity mask (cpu/cpu_topology.h). pin (Tuning::cpu_pin): worker i is
    // bound to the i-th CPU of the process's affinity mask, and a thread that calls parallel_for to the
    // first, from its first call on (chunk i always runs on worker i, so chunks never share a CPU). Ignored
    // when the mask holds fewer CPUs than the pool has threads.
    explicit ThreadPool(int n_threads, bool pin = false);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return n_threads_; }

    // Splits [0, n) into size() contiguous chunks of near-equal length (chunk i goes to worker i, chunk 0 to
    // the caller), calls fn(begin, end) for every non-empty chunk and returns when all are done. The first
    // exception thrown by any chunk is rethrown here, after every chunk has finished. A call made from inside
    // fn (nested) or from a second thread while one is running is safe: nested calls run inline, others wait
    // their turn.
    void parallel_for(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn);

    // The process-wide pool, created on first use with default_thread_count() threads.
    static ThreadPool& global();
    // Replaces the global pool. Call it before any work uses global(): references to the old pool dangle.
    static void set_global_threads(int n);

  private:
    void worker_main(int index);
    void run_chunk(int index) noexcept;

    int n_threads_ = 1;
    std::vector<int> cpus_;  // pin: the CPU of chunk i; empty: unbound
    std::vector<std::thread> workers_;
    std::mutex call_mutex_;  // one parallel_for at a time per pool

    // The job being run; written by the caller before generation_ is bumped (release), read by workers after.
    const std::function<void(int64_t, int64_t)>* job_ = nullptr;
    int64_t job_n_ = 0;
    std::vector<std::exception_ptr> errors_;  // one slot per chunk

    alignas(64) std::atomic<uint32_t> generation_{0};
    alignas(64) std::atomic<int> pending_{0};  // workers still running the current job
    std::atomic<bool> stop_{false};
};

}  // namespace markbase::cpu
