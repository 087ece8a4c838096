// The RequestSink an HTTP thread waits on: the engine's emitter thread (sink_emitter.h) queues each event and
// returns at once (never blocking on a slow client); the thread serving the request takes them in order,
// waiting on a condition variable with a timeout so it can look at its client between events.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>

#include "server/engine.h"

namespace markbase::server {

struct SinkEvent {
    bool finished = false;  // false: `token`; true: the end, with reason, text, usage and error
    TokenEvent token;
    FinishReason reason = FinishReason::Stop;
    std::string text;  // the final held-back text
    Usage usage;
    std::string error;
};

class QueueSink : public RequestSink {
  public:
    void on_token(const TokenEvent& ev) override;
    void on_finish(FinishReason reason, const std::string& text, const Usage& usage,
                   const std::string& error) override;

    // Moves every queued event to the end of `out`; waits up to `timeout` while none is queued. Returns
    // false when nothing came.
    bool take(std::deque<SinkEvent>& out, std::chrono::milliseconds timeout);

  private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<SinkEvent> events_;
};

}  // namespace markbase::server
