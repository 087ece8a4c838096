// The engine's counters, gauges and latency histograms, written by the scheduler thread and read by any
// thread (GET /metrics) as one consistent snapshot.
//
// Histograms are Prometheus-style: counts per upper bound are cumulative (le="bound"), ttft_n / tpot_n is
// the +Inf bucket. TTFT is observed once per request that produced a token (submit to first token); TPOT
// once per request with at least two tokens, as its mean time per output token after the first (vLLM's
// request-level time_per_output_token). The bounds are vLLM's.
#pragma once

#include <cstdint>
#include <mutex>

#include "runtime/slot_backend.h"
#include "server/engine.h"

namespace markbase::server {

class MetricsBook {
  public:
    MetricsBook();
    void finished(FinishReason r);
    void accepted(int prompt_tokens);
    void token();
    void preempted(uint64_t n);
    void ttft(double s);
    void tpot(double s);
    void gauges(int running, int queued, int64_t kv_used, int64_t kv_free);
    // one engine step: its backend split, the rest of the engine's busy time since the last step, its rows
    void step(const StepSeconds& backend, double engine_s, int64_t decode_rows, int64_t prompt_tokens);
    EngineMetrics snapshot() const;

  private:
    mutable std::mutex mu_;
    EngineMetrics m_;
};

}  // namespace markbase::server
