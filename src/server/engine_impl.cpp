#include "server/engine_impl.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "model/error.h"
#include "runtime/generate.h"
#include "runtime/scheduler.h"
#include "runtime/timing.h"
#include "server/engine_metrics.h"
#include "server/logprobs.h"
#include "server/reply_text.h"
#include "server/sink_emitter.h"

namespace markbase::server {

namespace {

constexpr int kBlockSize = 16;
constexpr int kMaxTopLogprobs = 20;

// A one-pass backend's steps hold at most what one of its passes takes.
SchedulerLimits scheduler_limits(const EngineLimits& l, const SlotBackend& be) {
    SchedulerLimits s;
    s.max_sequences = l.max_sequences;
    s.max_queue = l.max_queue;
    s.step_token_budget = l.step_token_budget;
    s.ctx_size = l.ctx_size;
    s.one_pass_steps = be.one_pass_rows() > 0;
    if (s.one_pass_steps) s.step_token_budget = std::min(s.step_token_budget, be.one_pass_rows());
    return s;
}

// A paged backend's pool is its full-attention layers' blocks (its sliding layers keep a ring per slot);
// otherwise the tables are the accounting of per-slot caches.
KvBlockOptions kv_options(const ModelConfig& c, const EngineLimits& l, const SlotBackend& be) {
    if (be.kv_pool_blocks() > 0) {
        KvBlockOptions o = KvBlockOptions::for_model(c, be.kv_pool_blocks(), be.kv_block_size());
        o.sliding = false;
        if (l.kv_blocks > 0) o.n_blocks = std::min(o.n_blocks, l.kv_blocks);
        return o;
    }
    KvBlockOptions o = KvBlockOptions::for_model(c, l.kv_blocks, kBlockSize);
    if (l.kv_blocks == 0) {
        const KvBlockAllocator probe(o);
        o.n_blocks = int64_t{l.max_sequences} * probe.blocks_for(l.ctx_size, l.step_token_budget);
    }
    return o;
}

class EngineImpl final : public Engine {
  public:
    EngineImpl(SlotBackend& be, const Tokenizer& tok, const ModelConfig& c, EngineLimits lim)
        : be_(be), tok_(tok), cfg_(c), lim_(lim), sched_(scheduler_limits(lim, be), kv_options(c, lim, be)) {
        if (lim.max_sequences > be.slots())
            throw Error("max_sequences " + std::to_string(lim.max_sequences) + " exceeds the backend's " +
                        std::to_string(be.slots()) + " slots");
        if (lim.ctx_size > be.ctx_size())
            throw Error("ctx_size " + std::to_string(lim.ctx_size) + " exceeds the backend's " +
                        std::to_string(be.ctx_size()) + " positions per slot");
        publish_counts();
        thread_ = std::thread([this] { loop(); });
    }
    ~EngineImpl() override { shutdown(); }

    uint64_t submit(GenerationRequest req, std::shared_ptr<RequestSink> sink) override;
    void cancel(uint64_t id) override {
        {
            std::lock_guard<std::mutex> lk(mu_);
            cancels_.push_back(id);
        }
        cv_.notify_one();
    }
    EngineMetrics metrics() const override { return book_.snapshot(); }
    const EngineLimits& limits() const override { return lim_; }
    int vocab_size() const override { return static_cast<int>(cfg_.vocab_size); }
    void shutdown() override {
        {
            std::lock_guard<std::mutex> lk(mu_);
            stopping_ = true;
        }
        cv_.notify_one();
        std::lock_guard<std::mutex> lk(join_mu_);
        if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
        emitter_.stop();  // after the scheduler's last events (fail_all's) are queued
    }

  private:
    struct Pending {
        uint64_t id;
        GenerationRequest req;
        std::shared_ptr<RequestSink> sink;
        double t_submit;
    };
    // One accepted request, owned by the scheduler thread.
    struct Live {
        Live(Pending&& p, const Tokenizer& tok)
            : id(p.id),
              req(std::move(p.req)),
              sink(std::move(p.sink)),
              sampler(req.sampling),
              text(tok, req.stop),
              history(req.prompt),
              t_submit(p.t_submit) {}
        uint64_t id;
        GenerationRequest req;
        std::shared_ptr<RequestSink> sink;
        Sampler sampler;
        ReplyText text;
        std::vector<int> history;  // prompt + generated: the penalties' window
        int generated = 0;
        double t_submit, t_first = 0, t_last = 0;
    };

    void validate(const GenerationRequest& req, const RequestSink* sink) const;
    void loop();
    bool drain();  // false when shutting down
    void step();
    void on_logits(Live& r, const float* row, int argmax, const DeviceSelection* sel);
    static bool argmax_only(const GenerationRequest& req);
    bool select_on_device(const Live& r, DeviceSelect* sel) const;
    void finish(Live& r, FinishReason why, const std::string& text, const std::string& error = "");
    void fail_all(const std::string& error);
    void publish_counts();  // the scheduler's counts to submit() and the gauges

    SlotBackend& be_;
    const Tokenizer& tok_;
    const ModelConfig& cfg_;
    const EngineLimits lim_;
    MetricsBook book_;

    // scheduler thread only
    Scheduler sched_;
    std::map<uint64_t, Live> live_;
    std::vector<float> logits_;
    std::vector<int> next_;              // each wanted row's argmax
    std::vector<DeviceSelect> selects_;  // each wanted row's device selection, where it has one
    std::vector<DeviceSelection> selections_;
    double intake_s_ = 0;        // drain()'s busy time since the last step (its wait for work excluded)
    std::vector<Emission> out_;  // the sinks' events since the last hand-over to emitter_

    // shared with the callers, under mu_
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Pending> inbox_;
    std::vector<uint64_t> cancels_;
    bool stopping_ = false;
    uint64_t next_id_ = 1;
    int64_t waiting_ = 0, running_ = 0;  // the scheduler's, as of its last publish_counts()

    SinkEmitter emitter_;  // delivers out_'s events to the sinks (sink_emitter.h)
    std::mutex join_mu_;
    std::thread thread_;
};

void EngineImpl::validate(const GenerationRequest& req, const RequestSink* sink) const {
    if (sink == nullptr) throw Error("submit: no sink for the results");
    if (req.prompt.empty()) throw Error("the prompt is empty: give at least one token");
    if (static_cast<int64_t>(req.prompt.size()) >= lim_.ctx_size)
        throw Error("the prompt has " + std::to_string(req.prompt.size()) + " tokens; the context holds " +
                    std::to_string(lim_.ctx_size) + " with at least one generated");
    for (size_t i = 0; i < req.prompt.size(); ++i)
        if (req.prompt[i] < 0 || req.prompt[i] >= cfg_.vocab_size)
            throw Error("prompt token " + std::to_string(i) + ": id " + std::to_string(req.prompt[i]) +
                        " is outside the vocabulary [0, " + std::to_string(cfg_.vocab_size) + ")");
    req.sampling.validate();
    if (req.max_tokens < 1)
        throw Error("max_tokens must be at least 1, found " + std::to_string(req.max_tokens));
    if (req.top_logprobs < -1 || req.top_logprobs > kMaxTopLogprobs)
        throw Error("top_logprobs must be in [0, 20] (or -1: none), found " +
                    std::to_string(req.top_logprobs));
}

uint64_t EngineImpl::submit(GenerationRequest req, std::shared_ptr<RequestSink> sink) {
    validate(req, sink.get());
    uint64_t id = 0;
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (stopping_) throw Error("server shutting down");
        const int64_t waiting = waiting_ + static_cast<int64_t>(inbox_.size());
        if (Scheduler::queue_full(waiting, running_, sched_.limits()))
            throw QueueFull("the queue is full: " + std::to_string(waiting) + " requests wait for " +
                            std::to_string(lim_.max_sequences) + " sequences");
        id = next_id_++;
        inbox_.push_back(Pending{id, std::move(req), std::move(sink), now_s()});
    }
    cv_.notify_one();
    return id;
}

void EngineImpl::loop() {
    while (drain()) {
        if (!sched_.idle()) step();
        emitter_.post(out_);  // the step's events, one hand-over, delivered while the next step runs
    }
    fail_all("server shutting down");
    emitter_.post(out_);
}

bool EngineImpl::drain() {
    std::deque<Pending> in;
    std::vector<uint64_t> cancels;
    bool stop = false;
    double t0 = 0;
    {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stopping_ || !inbox_.empty() || !cancels_.empty() || !sched_.idle(); });
        t0 = now_s();
        in.swap(inbox_);
        cancels.swap(cancels_);
        stop = stopping_;
        waiting_ += static_cast<int64_t>(in.size());  // still counted by submit() until they are queued
    }
    // (sinks are called on emitter_'s thread with no lock of ours held: one may call cancel() or submit())
    for (Pending& p : in) {
        const uint64_t id = p.id;
        Live& r = live_.emplace(id, Live(std::move(p), tok_)).first->second;
        book_.accepted(static_cast<int>(r.req.prompt.size()));
        if (!sched_.add(id, r.req.prompt)) finish(r, FinishReason::Error, "", "the queue is full");
    }
    for (uint64_t id : cancels) {
        auto it = live_.find(id);
        if (it != live_.end()) finish(it->second, FinishReason::Cancelled, "");
    }
    publish_counts();
    emitter_.post(out_);  // refusals and cancellations
    intake_s_ += now_s() - t0;
    return !stop;
}

void EngineImpl::step() {
    const double t0 = now_s();
    const Step st = sched_.schedule();
    if (!st.preempted.empty()) book_.preempted(st.preempted.size());
    std::vector<SlotWork> work;
    int64_t rows = 0, decode_rows = 0, prompt_tokens = 0;
    selects_.resize(st.work.size());  // pointers into these stay valid through eval_slots
    selections_.resize(st.work.size());
    for (const StepWork& w : st.work) {
        if (w.pos0 == 0) be_.reset_slot(w.slot);
        const Live& r = live_.at(w.seq);
        SlotWork sw{w.slot, w.ids, w.wants_logits, w.wants_logits && argmax_only(r.req)};
        const size_t row = static_cast<size_t>(rows);
        selections_[row].ok = false;
        if (w.wants_logits && !sw.argmax_only && select_on_device(r, &selects_[row])) {
            sw.select = &selects_[row];
            sw.selection = &selections_[row];
        }
        work.push_back(sw);
        rows += w.wants_logits ? 1 : 0;
        if (w.ids.size() == 1)
            ++decode_rows;
        else
            prompt_tokens += static_cast<int64_t>(w.ids.size());
    }
    const int64_t V = cfg_.vocab_size;
    logits_.resize(static_cast<size_t>(rows * V));
    next_.resize(static_cast<size_t>(rows));
    try {
        if (be_.kv_pool_blocks() > 0)  // where each slot's positions live in the paged cache
            for (const StepWork& w : st.work)
                if (const KvBlockTables* t = sched_.blocks().tables(w.seq))
                    be_.set_kv_blocks(w.slot, t->full);
        if (!work.empty()) be_.eval_slots(work, rows ? logits_.data() : nullptr, next_.data());
    } catch (const std::exception& e) {  // the caches of this step's slots are unknown now: fail them all
        for (const StepWork& w : st.work) finish(live_.at(w.seq), FinishReason::Error, "", e.what());
        return;
    }
    int64_t row = 0;
    for (const StepWork& w : st.work) {
        if (!w.wants_logits) continue;
        Live& r = live_.at(w.seq);
        try {
            on_logits(r, logits_.data() + row * V, next_[static_cast<size_t>(row)],
                      &selections_[static_cast<size_t>(row)]);
        } catch (const std::exception& e) {
            if (live_.count(w.seq)) finish(r, FinishReason::Error, "", e.what());
        }
        ++row;
    }
    publish_counts();
    const StepSeconds be = work.empty() ? StepSeconds{} : be_.last_step_seconds();
    book_.step(be, now_s() - t0 - be.prefill - be.decode - be.mixed + intake_s_, decode_rows, prompt_tokens);
    intake_s_ = 0;
}

// Greedy with nothing that reads the row: no penalty (it would change the argmax) and no logprobs. The
// backend's argmax is then the sampler's choice (ties: the lowest id) and the row need not reach the host.
bool EngineImpl::argmax_only(const GenerationRequest& req) {
    const SamplingParams& s = req.sampling;
    const bool penalised = s.repeat_last_n != 0 && (s.repeat_penalty != 1.0f || s.presence_penalty != 0.0f ||
                                                    s.frequency_penalty != 0.0f);
    return s.temperature == 0.0f && !penalised && req.top_logprobs < 0;
}

// A sampled row the backend can cut to its k best candidates (after the penalties) where it computed them:
// what generate() asks of Backend::eval_select, so the draw is the host sampler's on either path. Not with
// logprobs (they read the whole row).
bool EngineImpl::select_on_device(const Live& r, DeviceSelect* sel) const {
    return r.req.top_logprobs < 0 &&
           device_select_request(r.req.sampling, r.history, cfg_.vocab_size, be_.max_select_k(),
                                 be_.max_select_penalty_ids(), sel);
}

void EngineImpl::on_logits(Live& r, const float* row, int argmax, const DeviceSelection* sel) {
    const int64_t V = cfg_.vocab_size;
    const int id = argmax_only(r.req) ? argmax
                   : sel->ok          ? r.sampler.sample_top(sel->top, sel->n_finite)
                                      : r.sampler.sample(row, V, r.history);
    const double now = now_s();
    if (r.generated == 0) {
        r.t_first = now;
        book_.ttft(now - r.t_submit);
    }
    r.t_last = now;
    ++r.generated;
    r.history.push_back(id);
    book_.token();
    const auto& stops = r.req.stop_ids;
    if (!r.req.ignore_eos && std::find(stops.begin(), stops.end(), id) != stops.end()) {
        finish(r, FinishReason::Stop, r.text.finish());  // the stop id itself is not shown
        return;
    }
    TokenEvent ev;
    ev.id = id;
    bool stopped = false;
    ev.text = r.text.push(id, &stopped);
    if (r.req.top_logprobs >= 0) {
        Logprobs lp = compute_logprobs(row, V, r.req.sampling.temperature, id, r.req.top_logprobs);
        ev.logprob = lp.chosen;
        ev.top = std::move(lp.top);
        for (const auto& [alt, p] : ev.top)
            ev.top_text.emplace_back(tok_.decode(std::span<const int>(&alt, 1)), p);
    }
    Emission e;
    e.sink = r.sink;
    e.token = std::move(ev);
    out_.push_back(std::move(e));
    if (stopped) {
        finish(r, FinishReason::Stop, "");
        return;
    }
    // generate()'s ends: the budget, or a token the context cannot take (it would sit at position ctx_size)
    if (r.generated >= r.req.max_tokens || static_cast<int64_t>(r.history.size()) > lim_.ctx_size) {
        bool stop_at_end = false;
        const std::string tail = r.text.finish(&stop_at_end);
        finish(r, stop_at_end ? FinishReason::Stop : FinishReason::Length, tail);
        return;
    }
    sched_.append(r.id, id);
}

void EngineImpl::finish(Live& r, FinishReason why, const std::string& text, const std::string& error) {
    sched_.finish(r.id);
    Usage u;
    u.prompt_tokens = static_cast<int>(r.req.prompt.size());
    u.completion_tokens = r.generated;
    u.ttft_s = r.generated > 0 ? r.t_first - r.t_submit : 0.0;
    if (r.generated > 1 && r.t_last > r.t_first) {
        u.decode_tok_s = (r.generated - 1) / (r.t_last - r.t_first);
        book_.tpot((r.t_last - r.t_first) / (r.generated - 1));
    }
    book_.finished(why);
    Emission e;
    e.sink = r.sink;
    e.finish = true;
    e.reason = why;
    e.text = text;
    e.error = error;
    e.usage = u;
    out_.push_back(std::move(e));
    live_.erase(r.id);
}

void EngineImpl::fail_all(const std::string& error) {
    while (!live_.empty()) finish(live_.begin()->second, FinishReason::Error, "", error);
    publish_counts();
}

void EngineImpl::publish_counts() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        waiting_ = sched_.waiting();
        running_ = sched_.running();
    }
    book_.gauges(static_cast<int>(sched_.running()), static_cast<int>(sched_.waiting()),
                 sched_.blocks().used(), sched_.blocks().free_blocks());
}

}  // namespace

std::unique_ptr<Engine> make_engine(SlotBackend& be, const Tokenizer& tok, const ModelConfig& config,
                                    EngineLimits limits) {
    return std::make_unique<EngineImpl>(be, tok, config, limits);
}

}  // namespace markbase::server
