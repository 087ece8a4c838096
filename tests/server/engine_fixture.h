// The bundled model, its tokenizer and a sink that records what the engine reports, for the engine tests.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "loading/checkpoint.h"
#include "runtime/backend.h"
#include "runtime/generate.h"
#include "runtime/slot_backend.h"
#include "server/engine_impl.h"
#include "tokenizer/tokenizer.h"

namespace markbase::server {

class Collect final : public RequestSink {
  public:
    void on_token(const TokenEvent& ev) override {
        std::lock_guard<std::mutex> lk(mu_);
        events_.push_back(ev);
        cv_.notify_all();
    }
    void on_finish(FinishReason r, const std::string& text, const Usage& u, const std::string& err) override {
        std::lock_guard<std::mutex> lk(mu_);
        ++finishes_;
        reason_ = r;
        final_text_ = text;
        usage_ = u;
        error_ = err;
        cv_.notify_all();
    }
    bool wait_done(int seconds = 120) {
        std::unique_lock<std::mutex> lk(mu_);
        return cv_.wait_for(lk, std::chrono::seconds(seconds), [&] { return finishes_ > 0; });
    }
    bool wait_tokens(size_t n, int seconds = 120) {
        std::unique_lock<std::mutex> lk(mu_);
        return cv_.wait_for(lk, std::chrono::seconds(seconds),
                            [&] { return events_.size() >= n || finishes_; });
    }
    std::vector<int> ids() const {
        std::lock_guard<std::mutex> lk(mu_);
        std::vector<int> v;
        for (const auto& e : events_) v.push_back(e.id);
        return v;
    }
    std::string text() const {
        std::lock_guard<std::mutex> lk(mu_);
        std::string s;
        for (const auto& e : events_) s += e.text;
        return s + final_text_;
    }
    std::vector<TokenEvent> events() const {
        std::lock_guard<std::mutex> lk(mu_);
        return events_;
    }
    int finishes() const {
        std::lock_guard<std::mutex> lk(mu_);
        return finishes_;
    }
    FinishReason reason() const {
        std::lock_guard<std::mutex> lk(mu_);
        return reason_;
    }
    std::string error() const {
        std::lock_guard<std::mutex> lk(mu_);
        return error_;
    }
    Usage usage() const {
        std::lock_guard<std::mutex> lk(mu_);
        return usage_;
    }

  private:
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::vector<TokenEvent> events_;
    int finishes_ = 0;
    FinishReason reason_ = FinishReason::Error;
    std::string final_text_, error_;
    Usage usage_;
};

// Waits until the engine's gauges show nothing running or queued (they are published after each step).
inline EngineMetrics settled(const Engine& e) {
    EngineMetrics m = e.metrics();
    for (int i = 0; i < 2000 && (m.running || m.queued || m.kv_blocks_used); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        m = e.metrics();
    }
    return m;
}

class EngineTest : public ::testing::Test {
  protected:
    static constexpr int64_t kCtx = 256;
    static void SetUpTestSuite() {
        const std::string dir = std::string(MARKBASE_TEST_DATA) + "/../../models/default";
        ck_ = load_checkpoint(dir).release();
        tok_ = new Tokenizer(Tokenizer::load(dir + "/tokenizer.json"));
    }
    static void TearDownTestSuite() {
        delete ck_;
        delete tok_;
    }
    static BackendOptions options(int slots) {
        BackendOptions o;
        o.threads = 2;
        o.ctx_size = kCtx;
        o.slots = slots;
        return o;
    }
    static std::vector<int> prompt(const std::string& text) {
        std::vector<int> ids{tok_->bos_id()};
        tok_->encode_append(text, ids);
        return ids;
    }
    // What generate() gives for this prompt alone (the reference the engine must match).
    static std::vector<int> alone(const std::vector<int>& p, const SamplingParams& sp, int n) {
        auto be = make_cpu_backend(*ck_, options(1));
        GenerateOptions go;
        go.max_new_tokens = n;
        go.sampling = sp;
        std::vector<int> out;
        generate(
            *be, p, go, [](int) { return true; }, &out);
        return out;
    }
    static SamplingParams greedy() {
        SamplingParams sp;
        sp.temperature = 0;
        return sp;
    }
    static GenerationRequest request(const std::vector<int>& p, const SamplingParams& sp, int n) {
        GenerationRequest r;
        r.prompt = p;
        r.sampling = sp;
        r.max_tokens = n;
        return r;
    }
    static EngineLimits limits(int seqs) {
        EngineLimits l;
        l.max_sequences = seqs;
        l.ctx_size = kCtx;
        return l;
    }
    inline static Checkpoint* ck_ = nullptr;
    inline static Tokenizer* tok_ = nullptr;
};

}  // namespace markbase::server
