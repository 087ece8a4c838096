#include "server/serve_metrics.h"

#include <cstdio>
#include <sstream>

namespace markbase::server {

void StatusCounts::add(int status) {
    std::lock_guard<std::mutex> lock(mu_);
    ++counts_[status];
}

std::map<int, uint64_t> StatusCounts::snapshot() const {
    std::lock_guard<std::mutex> lock(mu_);
    return counts_;
}

namespace {

std::string num(double x) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.15g", x);
    return buf;
}

void header(std::ostringstream& o, const char* name, const char* type, const char* help) {
    o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
}

void histogram(std::ostringstream& o, const char* name, const char* help, const std::vector<double>& bounds,
               const std::vector<uint64_t>& counts, double sum, uint64_t n) {
    header(o, name, "histogram", help);
    for (size_t i = 0; i < bounds.size() && i < counts.size(); ++i)
        o << name << "_bucket{le=\"" << num(bounds[i]) << "\"} " << counts[i] << '\n';
    o << name << "_bucket{le=\"+Inf\"} " << n << '\n';
    o << name << "_sum " << num(sum) << '\n' << name << "_count " << n << '\n';
}

}  // namespace

std::string prometheus_text(const EngineMetrics& m, const std::map<int, uint64_t>& http_responses) {
    std::ostringstream o;
    header(o, "markbase_requests_total", "counter", "Generation requests finished, by how they ended.");
    o << "markbase_requests_total{status=\"ok\"} " << m.requests_ok << '\n'
      << "markbase_requests_total{status=\"error\"} " << m.requests_error << '\n'
      << "markbase_requests_total{status=\"cancelled\"} " << m.requests_cancelled << '\n';
    header(o, "markbase_prompt_tokens_total", "counter", "Prompt tokens processed.");
    o << "markbase_prompt_tokens_total " << m.prompt_tokens << '\n';
    header(o, "markbase_generated_tokens_total", "counter", "Tokens generated.");
    o << "markbase_generated_tokens_total " << m.generated_tokens << '\n';
    histogram(o, "markbase_time_to_first_token_seconds", "Seconds from submission to the first token.",
              m.ttft_bounds, m.ttft_counts, m.ttft_sum, m.ttft_n);
    histogram(o, "markbase_time_per_output_token_seconds", "Seconds per generated token after the first.",
              m.tpot_bounds, m.tpot_counts, m.tpot_sum, m.tpot_n);
    header(o, "markbase_sequences_running", "gauge", "Sequences decoding now.");
    o << "markbase_sequences_running " << m.running << '\n';
    header(o, "markbase_sequences_queued", "gauge", "Requests waiting for a sequence.");
    o << "markbase_sequences_queued " << m.queued << '\n';
    header(o, "markbase_kv_blocks_used", "gauge", "KV cache blocks in use.");
    o << "markbase_kv_blocks_used " << m.kv_blocks_used << '\n';
    header(o, "markbase_kv_blocks_free", "gauge", "KV cache blocks free.");
    o << "markbase_kv_blocks_free " << m.kv_blocks_free << '\n';
    header(o, "markbase_step_seconds_total", "counter",
           "Scheduler-thread seconds while busy: prompt chunks, the batched decode rows, both in one pass "
           "(mixed), and the engine's own work (scheduling, sampling, streaming, intake).");
    o << "markbase_step_seconds_total{phase=\"prefill\"} " << num(m.step_prefill_s) << '\n'
      << "markbase_step_seconds_total{phase=\"decode\"} " << num(m.step_decode_s) << '\n'
      << "markbase_step_seconds_total{phase=\"mixed\"} " << num(m.step_mixed_s) << '\n'
      << "markbase_step_seconds_total{phase=\"engine\"} " << num(m.step_engine_s) << '\n';
    header(o, "markbase_steps_total", "counter", "Engine steps run.");
    o << "markbase_steps_total " << m.steps << '\n';
    header(o, "markbase_step_decode_rows_total", "counter", "One-id rows (decode tokens) over all steps.");
    o << "markbase_step_decode_rows_total " << m.step_decode_rows << '\n';
    header(o, "markbase_step_prompt_tokens_total", "counter", "Prompt-chunk tokens over all steps.");
    o << "markbase_step_prompt_tokens_total " << m.step_prompt_tokens << '\n';
    header(o, "markbase_http_responses_total", "counter", "HTTP responses, by status code.");
    for (const auto& [code, n] : http_responses)
        o << "markbase_http_responses_total{code=\"" << code << "\"} " << n << '\n';
    return o.str();
}

std::string format_request_log(const RequestLog& r) {
    std::string path = r.path.substr(0, 200);  // the client's text: no control bytes reach the log
    for (char& c : path)
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
    char buf[512];
    if (!r.generated) {
        std::snprintf(buf, sizeof buf, "serve: %s %s %s %d (%.3f s)", r.id.c_str(), r.method.c_str(),
                      path.c_str(), r.status, r.elapsed_s);
    } else {
        std::snprintf(buf, sizeof buf,
                      "serve: %s %s %s %d prompt %d gen %d ttft %.3f s decode %.1f tok/s finish %s (%.3f s)",
                      r.id.c_str(), r.method.c_str(), path.c_str(), r.status, r.prompt_tokens,
                      r.completion_tokens, r.ttft_s, r.decode_tok_s, r.finish.c_str(), r.elapsed_s);
    }
    return buf;
}

}  // namespace markbase::server
