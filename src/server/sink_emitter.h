// The engine's results reach the requests' sinks from a thread of their own. A sink hands its event to the
// HTTP thread that streams the request, waking it: a futex wake, several microseconds, per token. Called
// from the scheduler thread, that was most of its host work in series with every step (0.88 ms a step of 100
// rows beside a backend that only sleeps, bench/results/engine-host-cpu.txt); here the scheduler hands a
// step's events over with one wake and the emitter delivers them, in order, while the next step runs (0.26
// ms).
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "server/engine.h"

namespace markbase::server {

// One event for one request's sink: a token, or (finish) its end.
struct Emission {
    std::shared_ptr<RequestSink> sink;
    bool finish = false;
    TokenEvent token;
    FinishReason reason = FinishReason::Error;
    std::string text, error;
    Usage usage;
};

class SinkEmitter {
  public:
    SinkEmitter();
    ~SinkEmitter() { stop(); }
    SinkEmitter(const SinkEmitter&) = delete;
    SinkEmitter& operator=(const SinkEmitter&) = delete;

    // Queues the events (each request's in the order given) and wakes the emitter once; `batch` is emptied.
    void post(std::vector<Emission>& batch);
    // Delivers what is queued, then ends the thread (idempotent; not from a sink).
    void stop();

  private:
    void loop();

    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::vector<Emission>> queue_;
    bool stopping_ = false;
    std::mutex join_mu_;
    std::thread thread_;
};

}  // namespace markbase::server
