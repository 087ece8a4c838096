#include "server/sink_emitter.h"

#include <utility>

namespace markbase::server {

SinkEmitter::SinkEmitter() : thread_([this] { loop(); }) {}

void SinkEmitter::post(std::vector<Emission>& batch) {
    if (batch.empty()) return;
    {
        std::lock_guard<std::mutex> lk(mu_);
        queue_.push_back(std::move(batch));
    }
    batch.clear();
    cv_.notify_one();
}

void SinkEmitter::stop() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stopping_ = true;
    }
    cv_.notify_one();
    std::lock_guard<std::mutex> lk(join_mu_);
    if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void SinkEmitter::loop() {
    for (;;) {
        std::deque<std::vector<Emission>> batches;
        {
            std::unique_lock<std::mutex> lk(mu_);
            cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
            if (queue_.empty()) return;  // stopping, and everything delivered
            batches.swap(queue_);
        }
        for (std::vector<Emission>& b : batches)
            for (Emission& e : b) {
                try {
                    if (e.finish)
                        e.sink->on_finish(e.reason, e.text, e.usage, e.error);
                    else
                        e.sink->on_token(e.token);
                } catch (...) {  // a sink must not throw; if one does, the others still get theirs
                }
            }
    }
}

}  // namespace markbase::server
