// What /metrics serves (Prometheus text format 0.0.4) and the one line per request markbase serve logs.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "server/engine.h"

namespace markbase::server {

// HTTP responses by status code, counted as the server answers.
class StatusCounts {
  public:
    void add(int status);
    std::map<int, uint64_t> snapshot() const;

  private:
    mutable std::mutex mu_;
    std::map<int, uint64_t> counts_;
};

// markbase_requests_total{status}, markbase_prompt_tokens_total, markbase_generated_tokens_total, the TTFT
// and time-per-output-token histograms, running/queued sequences, KV blocks used/free, and
// markbase_http_responses_total{code}.
std::string prometheus_text(const EngineMetrics& m, const std::map<int, uint64_t>& http_responses);

// One request as the log line tells it.
struct RequestLog {
    std::string id = "-";  // the response id of a generation request
    std::string method, path;
    int status = 0;
    bool generated = false;  // the fields below are known
    int prompt_tokens = 0, completion_tokens = 0;
    double ttft_s = 0, decode_tok_s = 0;
    std::string finish;  // stop, length, cancelled, error
    double elapsed_s = 0;
};

// "serve: chatcmpl-1f.. POST /v1/chat/completions 200 prompt 12 gen 34 ttft 0.120 s decode 45.6 tok/s
// finish stop (1.234 s)"; without generation: "serve: - GET /health 200 (0.000 s)".
std::string format_request_log(const RequestLog& r);

}  // namespace markbase::server
