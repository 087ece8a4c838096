// The serving engine's host work on the critical path of a step: the engine (server/engine_impl.cpp) over a
// slot backend that computes nothing and sleeps a fixed time a step, as a GPU step holds the scheduler
// thread, with ROWS greedy requests (ignore_eos) whose sinks are drained by one thread each, as the HTTP
// threads drain theirs. Whatever a step takes beyond the sleep is the engine's: scheduling, the sampler,
// detokenising, handing the events to the sinks. The sleep's own overshoot is measured alone and reported
// beside it.
//   markbase_engine_host_bench [--rows 100] [--tokens 128] [--step-us 3000] [--reps 5]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "loading/checkpoint.h"
#include "runtime/slot_backend.h"
#include "server/engine_impl.h"
#include "server/request_sink.h"
#include "tokenizer/tokenizer.h"

using namespace markbase;
using namespace markbase::server;

namespace {

// Every wanted row's argmax is a fixed function of the slot's position; no logits rows.
class SleepingBackend final : public SlotBackend {
  public:
    SleepingBackend(const ModelConfig& c, int slots, int step_us)
        : c_(c), past_(slots, 0), step_us_(step_us) {}
    const ModelConfig& config() const override { return c_; }
    std::string name() const override { return "sleeping"; }
    int slots() const override { return static_cast<int>(past_.size()); }
    int64_t ctx_size() const override { return 4096; }
    int64_t n_past(int s) const override { return past_[static_cast<size_t>(s)]; }
    void reset_slot(int s) override { past_[static_cast<size_t>(s)] = 0; }
    void eval_slots(const std::vector<SlotWork>& work, float*, int* next) override {
        std::this_thread::sleep_for(std::chrono::microseconds(step_us_));
        int row = 0;
        for (const SlotWork& w : work) {
            int64_t& p = past_[static_cast<size_t>(w.slot)];
            p += static_cast<int64_t>(w.ids.size());
            if (w.logits) next[row++] = 300 + static_cast<int>((p * 7) % 5000);
        }
    }
    StepSeconds last_step_seconds() const override { return {}; }

  private:
    const ModelConfig& c_;
    std::vector<int64_t> past_;
    int step_us_;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One run: ms a step beyond the backend's sleep (tokens decode steps, plus the prompts' step).
double run(const Checkpoint& ck, const Tokenizer& tok, int rows, int tokens, int step_us) {
    SleepingBackend be(ck.config, rows, step_us);
    EngineLimits l;
    l.max_sequences = rows;
    l.max_queue = rows;
    auto engine = make_engine(be, tok, ck.config, l);
    std::vector<std::thread> readers;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < rows; ++i) {
        GenerationRequest r;
        for (int k = 0; k < 32; ++k) r.prompt.push_back(200 + (i * 31 + k) % 4000);
        r.sampling.temperature = 0;
        r.max_tokens = tokens;
        r.ignore_eos = true;
        auto sink = std::make_shared<QueueSink>();
        engine->submit(r, sink);
        readers.emplace_back([sink] {
            for (std::deque<SinkEvent> ev;; ev.clear())
                if (sink->take(ev, std::chrono::milliseconds(1000)) &&
                    std::any_of(ev.begin(), ev.end(), [](const SinkEvent& e) { return e.finished; }))
                    return;
        });
    }
    for (std::thread& t : readers) t.join();
    return 1e3 * seconds_since(t0) / tokens - step_us * 1e-3;
}

double sleep_overshoot(int tokens, int step_us) {  // the same sleeps alone
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i <= tokens; ++i) std::this_thread::sleep_for(std::chrono::microseconds(step_us));
    return 1e3 * seconds_since(t0) / tokens - step_us * 1e-3;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    int rows = 100, tokens = 128, step_us = 3000, reps = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        const int v = std::atoi(argv[i + 1]);
        if (!std::strcmp(argv[i], "--rows"))
            rows = v;
        else if (!std::strcmp(argv[i], "--tokens"))
            tokens = v;
        else if (!std::strcmp(argv[i], "--step-us"))
            step_us = v;
        else if (!std::strcmp(argv[i], "--reps"))
            reps = v;
        else {
            std::fprintf(stderr, "usage: %s [--rows N] [--tokens N] [--step-us N] [--reps N]\n", argv[0]);
            return 2;
        }
    }
    const std::string dir = std::string(MARKBASE_SOURCE_DIR) + "/models/default";
    const auto ck = load_checkpoint(dir);
    const Tokenizer tok = Tokenizer::load(dir + "/tokenizer.json");
    std::vector<double> engine, sleep;
    for (int r = 0; r < reps; ++r) {
        engine.push_back(run(*ck, tok, rows, tokens, step_us));
        sleep.push_back(sleep_overshoot(tokens, step_us));
    }
    const double e = median(engine), s = median(sleep);
    std::printf(
        "%d rows x %d tokens, steps of %d us: %.3f ms a step beyond the sleep (the sleep alone %.3f): "
        "%.3f ms of engine work a step, %.2f us a token (medians of %d)\n",
        rows, tokens, step_us, e, s, e - s, 1e3 * (e - s) / rows, reps);
    return 0;
}
