// A deterministic Engine for the HTTP layer's tests: no model, one scheduler thread, the contract of
// src/server/engine.h. Token i of a reply is id 1000 + i with the text " w<i>"; a stop string ends the reply
// where it first matches (its text never emitted), max_tokens or the context with "length", eos_after
// tokens with "stop". Options delay tokens, hold every request (to fill the queue) or fail every request.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "model/error.h"
#include "server/engine.h"

namespace markbase::testing {

struct FakeEngineOptions {
    server::EngineLimits limits;
    int vocab = 262144;
    std::chrono::milliseconds token_delay{0};  // between two tokens of one reply
    int eos_after = -1;                        // >= 0: end with "stop" after this many tokens
    bool fail = false;                         // end every request with FinishReason::Error
};

class FakeEngine : public server::Engine {
  public:
    explicit FakeEngine(FakeEngineOptions o = {}) : opt_(std::move(o)), thread_([this] { loop(); }) {}
    ~FakeEngine() override { shutdown(); }

    uint64_t submit(server::GenerationRequest req, std::shared_ptr<server::RequestSink> sink) override {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopped_) throw Error("the engine is shut down");
        if (static_cast<int64_t>(req.prompt.size()) >= opt_.limits.ctx_size)
            throw Error("prompt of " + std::to_string(req.prompt.size()) +
                        " tokens does not fit the context");
        // The real scheduler's rule: waiting requests may fill the free slots plus max_queue. A request not yet
        // moved to running_ by the loop thread still has its slot, so back-to-back submissions never race.
        const int free_slots = std::max(0, opt_.limits.max_sequences - static_cast<int>(running_.size()));
        if (static_cast<int>(queued_.size()) >= opt_.limits.max_queue + free_slots)
            throw server::QueueFull(std::to_string(queued_.size()) + " requests wait");
        Seq s;
        s.id = ++next_id_;
        s.req = std::move(req);
        s.sink = std::move(sink);
        s.submitted = Clock::now();
        last_request_ = s.req;
        ++submitted_;
        queued_.push_back(std::move(s));
        cv_.notify_all();
        return next_id_;
    }

    void cancel(uint64_t id) override {
        std::lock_guard<std::mutex> lock(mu_);
        cancel_calls_.push_back(id);
        for (auto* list : {&running_, &queued_})
            for (Seq& s : *list)
                if (s.id == id) s.cancelled = true;
        cv_.notify_all();
    }

    server::EngineMetrics metrics() const override {
        std::lock_guard<std::mutex> lock(mu_);
        server::EngineMetrics m = metrics_;
        m.running = static_cast<int>(running_.size());
        m.queued = static_cast<int>(queued_.size());
        m.kv_blocks_used = m.running;
        m.kv_blocks_free = 100 - m.running;
        return m;
    }
    const server::EngineLimits& limits() const override { return opt_.limits; }
    int vocab_size() const override { return opt_.vocab; }

    void shutdown() override {
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (stopped_) return;
            stopped_ = true;
            cv_.notify_all();
        }
        thread_.join();
        for (auto* list : {&running_, &queued_})
            for (Seq& s : *list) finish(s, server::FinishReason::Error, "server shutting down");
        running_.clear();
        queued_.clear();
    }

    // Test hooks.
    void hold(bool on) {  // held: requests are admitted but produce no tokens
        std::lock_guard<std::mutex> lock(mu_);
        held_ = on;
        cv_.notify_all();
    }
    std::vector<uint64_t> cancel_calls() const {
        std::lock_guard<std::mutex> lock(mu_);
        return cancel_calls_;
    }
    server::GenerationRequest last_request() const {
        std::lock_guard<std::mutex> lock(mu_);
        return last_request_;
    }
    int submitted() const {
        std::lock_guard<std::mutex> lock(mu_);
        return submitted_;
    }
    int active() const {
        std::lock_guard<std::mutex> lock(mu_);
        return static_cast<int>(running_.size() + queued_.size());
    }

  private:
    using Clock = std::chrono::steady_clock;
    struct Seq {
        uint64_t id = 0;
        server::GenerationRequest req;
        std::shared_ptr<server::RequestSink> sink;
        int produced = 0;
        std::string text;  // everything generated
        size_t emitted = 0;
        bool cancelled = false;
        Clock::time_point submitted, next;
        double ttft_s = 0;
    };

    void finish(Seq& s, server::FinishReason r, const std::string& error = "", const std::string& text = "") {
        server::Usage u;
        u.prompt_tokens = static_cast<int>(s.req.prompt.size());
        u.completion_tokens = s.produced;
        u.ttft_s = s.ttft_s;
        u.decode_tok_s = s.produced > 1 ? 1000.0 : 0;
        s.sink->on_finish(r, text, u, error);
        if (r == server::FinishReason::Cancelled)
            ++metrics_.requests_cancelled;
        else if (r == server::FinishReason::Error)
            ++metrics_.requests_error;
        else
            ++metrics_.requests_ok;
        metrics_.prompt_tokens += static_cast<uint64_t>(u.prompt_tokens);
        metrics_.generated_tokens += static_cast<uint64_t>(u.completion_tokens);
    }

    // One token of s, or its end; true when it ended.
    bool step(Seq& s) {
        using server::FinishReason;
        if (s.cancelled) {
            finish(s, FinishReason::Cancelled);
            return true;
        }
        if (opt_.fail) {
            finish(s, FinishReason::Error, "the fake engine fails every request");
            return true;
        }
        if (s.produced == opt_.eos_after) {
            finish(s, FinishReason::Stop);
            return true;
        }
        if (s.produced >= s.req.max_tokens ||
            static_cast<int64_t>(s.req.prompt.size()) + s.produced >= opt_.limits.ctx_size) {
            finish(s, FinishReason::Length);
            return true;
        }
        server::TokenEvent ev;
        ev.id = 1000 + s.produced % 1000;
        s.text += " w" + std::to_string(s.produced);
        if (s.produced++ == 0) s.ttft_s = std::chrono::duration<double>(Clock::now() - s.submitted).count();
        size_t stop_at = std::string::npos;
        for (const std::string& stop : s.req.stop) stop_at = std::min(stop_at, s.text.find(stop));
        const size_t end = std::min(stop_at, s.text.size());
        ev.text = s.text.substr(s.emitted, end - std::min(end, s.emitted));
        s.emitted = std::max(s.emitted, end);
        if (s.req.top_logprobs >= 0) {
            ev.logprob = -0.25f;
            for (int k = 0; k < s.req.top_logprobs; ++k) {
                ev.top.emplace_back(ev.id + 1 + k, -1.0f - float(k));
                ev.top_text.emplace_back(" alt" + std::to_string(k), -1.0f - float(k));
            }
        }
        s.sink->on_token(ev);
        if (stop_at != std::string::npos) {
            finish(s, FinishReason::Stop);
            return true;
        }
        return false;
    }

    void loop() {
        std::unique_lock<std::mutex> lock(mu_);
        while (!stopped_) {
            while (!queued_.empty() && static_cast<int>(running_.size()) < opt_.limits.max_sequences) {
                running_.push_back(std::move(queued_.front()));
                queued_.pop_front();
            }
            for (auto it = queued_.begin(); it != queued_.end();)  // a request cancelled while it waits
                if (it->cancelled) {
                    finish(*it, server::FinishReason::Cancelled);
                    it = queued_.erase(it);
                } else {
                    ++it;
                }
            const auto now = Clock::now();
            for (auto it = running_.begin(); it != running_.end();) {
                if ((held_ && !it->cancelled) || it->next > now) {
                    ++it;
                    continue;
                }
                it->next = now + opt_.token_delay;
                it = step(*it) ? running_.erase(it) : std::next(it);
            }
            cv_.wait_for(lock, std::chrono::milliseconds(opt_.token_delay.count() > 0 ? 1 : 0) +
                                   std::chrono::microseconds(200));
        }
    }

    FakeEngineOptions opt_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Seq> queued_;
    std::deque<Seq> running_;
    server::EngineMetrics metrics_;
    server::GenerationRequest last_request_;
    std::vector<uint64_t> cancel_calls_;
    uint64_t next_id_ = 0;
    int submitted_ = 0;
    bool stopped_ = false, held_ = false;
    std::thread thread_;  // last: starts once everything above exists
};

}  // namespace markbase::testing
