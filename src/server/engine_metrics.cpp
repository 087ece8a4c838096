#include "server/engine_metrics.h"

#include <vector>

namespace markbase::server {

namespace {

void observe(const std::vector<double>& bounds, std::vector<uint64_t>& counts, double& sum, uint64_t& n,
             double v) {
    for (size_t i = 0; i < bounds.size(); ++i)
        if (v <= bounds[i]) ++counts[i];
    sum += v;
    ++n;
}

}  // namespace

MetricsBook::MetricsBook() {
    m_.ttft_bounds = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
                      1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
    m_.tpot_bounds = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                      0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
    m_.ttft_counts.assign(m_.ttft_bounds.size(), 0);
    m_.tpot_counts.assign(m_.tpot_bounds.size(), 0);
}

void MetricsBook::finished(FinishReason r) {
    std::lock_guard<std::mutex> lk(mu_);
    switch (r) {
        case FinishReason::Stop:
        case FinishReason::Length:
            ++m_.requests_ok;
            break;
        case FinishReason::Cancelled:
            ++m_.requests_cancelled;
            break;
        case FinishReason::Error:
            ++m_.requests_error;
            break;
    }
}

void MetricsBook::accepted(int prompt_tokens) {
    std::lock_guard<std::mutex> lk(mu_);
    m_.prompt_tokens += static_cast<uint64_t>(prompt_tokens);
}

void MetricsBook::token() {
    std::lock_guard<std::mutex> lk(mu_);
    ++m_.generated_tokens;
}

void MetricsBook::preempted(uint64_t n) {
    std::lock_guard<std::mutex> lk(mu_);
    m_.preemptions += n;
}

void MetricsBook::ttft(double s) {
    std::lock_guard<std::mutex> lk(mu_);
    observe(m_.ttft_bounds, m_.ttft_counts, m_.ttft_sum, m_.ttft_n, s);
}

void MetricsBook::tpot(double s) {
    std::lock_guard<std::mutex> lk(mu_);
    observe(m_.tpot_bounds, m_.tpot_counts, m_.tpot_sum, m_.tpot_n, s);
}

void MetricsBook::gauges(int running, int queued, int64_t kv_used, int64_t kv_free) {
    std::lock_guard<std::mutex> lk(mu_);
    m_.running = running;
    m_.queued = queued;
    m_.kv_blocks_used = kv_used;
    m_.kv_blocks_free = kv_free;
}

void MetricsBook::step(const StepSeconds& backend, double engine_s, int64_t decode_rows,
                       int64_t prompt_tokens) {
    std::lock_guard<std::mutex> lk(mu_);
    m_.step_prefill_s += backend.prefill;
    m_.step_decode_s += backend.decode;
    m_.step_mixed_s += backend.mixed;
    m_.step_engine_s += engine_s;
    ++m_.steps;
    m_.step_decode_rows += static_cast<uint64_t>(decode_rows);
    m_.step_prompt_tokens += static_cast<uint64_t>(prompt_tokens);
}

EngineMetrics MetricsBook::snapshot() const {
    std::lock_guard<std::mutex> lk(mu_);
    return m_;
}

}  // namespace markbase::server
