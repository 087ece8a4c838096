#include "parallel/rank_threads.h"

#include "model/error.h"

namespace markbase {

RankThreads::RankThreads(int world) {
    if (world < 1) throw Error("RankThreads: world must be >= 1, found " + std::to_string(world));
    errors_.resize(static_cast<size_t>(world));
    threads_.reserve(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) threads_.emplace_back([this, r] { loop(r); });
}

RankThreads::~RankThreads() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    cv_work_.notify_all();
    for (std::thread& t : threads_) t.join();
}

void RankThreads::run(const std::function<void(int)>& f) {
    std::unique_lock<std::mutex> lock(mu_);
    task_ = &f;
    pending_ = world();
    for (auto& e : errors_) e = nullptr;
    ++generation_;
    cv_work_.notify_all();
    cv_done_.wait(lock, [this] { return pending_ == 0; });
    task_ = nullptr;
    for (auto& e : errors_)
        if (e) std::rethrow_exception(e);
}

void RankThreads::loop(int rank) {
    unsigned long seen = 0;
    for (;;) {
        const std::function<void(int)>* task = nullptr;
        {
            std::unique_lock<std::mutex> lock(mu_);
            cv_work_.wait(lock, [&] { return stop_ || generation_ != seen; });
            if (stop_) return;
            seen = generation_;
            task = task_;
        }
        std::exception_ptr err;
        try {
            (*task)(rank);
        } catch (...) {
            err = std::current_exception();
        }
        {
            std::lock_guard<std::mutex> lock(mu_);
            errors_[static_cast<size_t>(rank)] = err;
            if (--pending_ == 0) cv_done_.notify_all();
        }
    }
}

}  // namespace markbase
