// One host thread per rank (issue 7): a tensor-parallel model is driven by one thread per GPU, so that each
// rank enqueues its own kernels and NCCL calls (and captures its own decode graph) without one rank's host
// calls waiting on another's. run(f) calls f(rank) on every rank's thread at once and returns when all have
// finished; the first exception thrown by any rank is rethrown to the caller.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace markbase {

class RankThreads {
  public:
    explicit RankThreads(int world);
    ~RankThreads();
    RankThreads(const RankThreads&) = delete;
    RankThreads& operator=(const RankThreads&) = delete;

    int world() const { return static_cast<int>(threads_.size()); }
    void run(const std::function<void(int rank)>& f);

  private:
    void loop(int rank);

    std::vector<std::thread> threads_;
    std::mutex mu_;
    std::condition_variable cv_work_, cv_done_;
    const std::function<void(int)>* task_ = nullptr;
    unsigned long generation_ = 0;
    int pending_ = 0;
    bool stop_ = false;
    std::vector<std::exception_ptr> errors_;
};

}  // namespace markbase
