#include "server/request_sink.h"

namespace markbase::server {

void QueueSink::on_token(const TokenEvent& ev) {
    SinkEvent e;
    e.token = ev;
    {
        std::lock_guard<std::mutex> lock(mu_);
        events_.push_back(std::move(e));
    }
    cv_.notify_one();
}

void QueueSink::on_finish(FinishReason reason, const std::string& text, const Usage& usage,
                          const std::string& error) {
    SinkEvent e;
    e.finished = true;
    e.reason = reason;
    e.text = text;
    e.usage = usage;
    e.error = error;
    {
        std::lock_guard<std::mutex> lock(mu_);
        events_.push_back(std::move(e));
    }
    cv_.notify_one();
}

bool QueueSink::take(std::deque<SinkEvent>& out, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return false;
    for (auto& e : events_) out.push_back(std::move(e));
    events_.clear();
    return true;
}

}  // namespace markbase::server
