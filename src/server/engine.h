// The serving engine: what `markbase serve`'s HTTP layer (src/server/http_*.cpp, openai_*.cpp) asks of the
// model side, and nothing more. Requests arrive as token ids with their sampling and stop settings; the
// engine's one scheduler thread admits them at every step, runs their prompts in chunks beside the running
// decodes (src/runtime/scheduler.h), samples each sequence with its own parameters, and reports each
// sequence's tokens and its end to that request's sink. HTTP threads only submit, cancel and read metrics:
// no request can hold the scheduler, and a slow client only fills its own sink.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "runtime/sampler.h"

namespace markbase::server {

// One request, already validated by the API layer (ids inside the vocabulary, sampling params valid).
struct GenerationRequest {
    std::vector<int> prompt;        // token ids, BOS included where the API adds it (chat: the template's)
    SamplingParams sampling;        // per request; temperature 0 is greedy
    int max_tokens = 256;           // generated tokens at most (the context may end it sooner: "length")
    std::vector<std::string> stop;  // stop strings: matched across token boundaries, never emitted
    std::vector<int> stop_ids;      // ids that end the reply (eos, <turn|>); reported as "stop", not emitted
    bool ignore_eos = false;        // stop_ids do not end it (benchmarks)
    int top_logprobs = -1;          // -1: no logprobs; 0..20: the chosen token's logprob and this many others
};

// One generated token as the client sees it. `text` is the UTF-8 the token completes (may be empty while a
// multi-byte character or a possible stop string is held back); held-back text is released with a later
// token or dropped when a stop string matches.
struct TokenEvent {
    int id = 0;
    std::string text;
    float logprob = 0;                       // natural log of the sampled token's probability (logprobs on)
    std::vector<std::pair<int, float>> top;  // top_logprobs alternatives (id, logprob), descending
    std::vector<std::pair<std::string, float>> top_text;  // the same alternatives' token texts
};

enum class FinishReason { Stop, Length, Cancelled, Error };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", "error"

struct Usage {
    int prompt_tokens = 0;
    int completion_tokens = 0;
    double ttft_s = 0;        // submit to first token
    double decode_tok_s = 0;  // completion tokens after the first, per second
};

// Where a request's results go. Called on the engine's emitter thread (sink_emitter.h), a request's events in
// order: implementations must not block (queue the event for the HTTP thread and return). on_finish is called
// exactly once, last.
class RequestSink {
  public:
    virtual ~RequestSink() = default;
    virtual void on_token(const TokenEvent& ev) = 0;
    // text: the final held-back text (possibly empty); error: a message when reason == Error
    virtual void on_finish(FinishReason reason, const std::string& text, const Usage& usage,
                           const std::string& error) = 0;
};

struct EngineLimits {
    int max_sequences = 4;        // -np: sequences decoding at once
    int64_t ctx_size = 4096;      // per sequence: prompt + generated
    int max_queue = 64;           // requests waiting beyond max_sequences; more are refused (503)
    int step_token_budget = 512;  // prompt ids one step may run (chunked prefill; serve -b; SchedulerLimits)
    int64_t kv_blocks = 0;        // KV pool, blocks of 16 positions; 0: room for max_sequences full contexts
};

struct EngineMetrics {
    uint64_t requests_ok = 0, requests_error = 0, requests_cancelled = 0;
    uint64_t prompt_tokens = 0, generated_tokens = 0;
    uint64_t preemptions = 0;  // running sequences sent back to the queue for lack of KV blocks
    int running = 0, queued = 0;
    int64_t kv_blocks_used = 0, kv_blocks_free = 0;
    // histograms: cumulative counts per upper bound (seconds), Prometheus style
    std::vector<double> ttft_bounds, tpot_bounds;
    std::vector<uint64_t> ttft_counts, tpot_counts;
    double ttft_sum = 0, tpot_sum = 0;
    uint64_t ttft_n = 0, tpot_n = 0;
    // The scheduler thread's time while it has work, in seconds: the steps' prompt chunks (prefill), their
    // one-id rows (decode: the batched step), both in one pass (mixed: the CUDA backend's steps that carry
    // prompt chunks), and the rest of each step and of the request intake between steps (engine:
    // scheduling, sampling, the sinks, the queue). Idle waits for work are not counted.
    double step_prefill_s = 0, step_decode_s = 0, step_mixed_s = 0, step_engine_s = 0;
    uint64_t steps = 0, step_decode_rows = 0, step_prompt_tokens = 0;
};

class Engine {
  public:
    virtual ~Engine() = default;
    // Queues the request; results go to sink. Returns the request's id. Throws QueueFull when max_queue
    // requests already wait; throws markbase::Error when the prompt cannot fit the context (API: 400).
    virtual uint64_t submit(GenerationRequest req, std::shared_ptr<RequestSink> sink) = 0;
    // The client went away: the sequence stops within one step, its cache is freed, on_finish(Cancelled).
    virtual void cancel(uint64_t id) = 0;
    virtual EngineMetrics metrics() const = 0;
    virtual const EngineLimits& limits() const = 0;
    virtual int vocab_size() const = 0;
    // Ends every running and queued request with on_finish(Error, "server shutting down") and joins the
    // scheduler and emitter threads (the last events delivered). Idempotent; the destructor calls it.
    virtual void shutdown() = 0;
};

struct QueueFull : std::runtime_error {
    using std::runtime_error::runtime_error;
};

}  // namespace markbase::server
