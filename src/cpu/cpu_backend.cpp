// The CPU backend: CpuModel + its KV cache behind the runtime's Backend interface.
#include <algorithm>
#include <string>

#include "cpu/forward.h"
#include "model/error.h"
#include "runtime/backend.h"

namespace markbase {

namespace {

class CpuBackend final : public Backend {
  public:
    CpuBackend(const Checkpoint& ck, const BackendOptions& opt)
        : pool_(opt.threads, opt.tuning.cpu_pin),
          chunk_(std::max(1, opt.chunk)),
          model_(ck, pool_, chunk_, cpu::prompt_products(opt.tuning)),
          cache_(ck.config, clamp_ctx(ck.config, opt.ctx_size), chunk_) {
        cache_.values = cpu_kv_dtype(opt.kv_dtype);
    }

    const ModelConfig& config() const override { return model_.config(); }
    std::string name() const override { return "cpu (" + std::to_string(pool_.size()) + " threads)"; }
    int64_t n_past() const override { return cache_.n_past; }
    int64_t ctx_size() const override { return cache_.max_ctx; }
    void reset() override {
        cache_.clear();
        model_.reset_router_margin();
    }
    float router_margin() const override { return model_.router_margin(); }
    bool truncate(int64_t n_keep) override { return cache_.truncate(n_keep, config().sliding_window); }
    uint64_t cache_bytes() const override { return cache_.bytes(); }

    void eval(const int* ids, int64_t n, float* logits, bool all_logits) override {
        if (cache_.n_past + n > cache_.max_ctx)
            throw Error("context full: " + std::to_string(cache_.n_past) + " cached + " + std::to_string(n) +
                        " new tokens exceed the context size " + std::to_string(cache_.max_ctx) +
                        " (set --ctx-size, at most " + std::to_string(config().max_positions) + ")");
        const int64_t V = config().vocab_size;
        for (int64_t b = 0; b < n; b += chunk_) {
            const int m = static_cast<int>(std::min<int64_t>(chunk_, n - b));
            const bool last = b + m == n;
            float* out = nullptr;
            if (logits && all_logits)
                out = logits + b * V;
            else if (logits && last)
                out = logits;
            model_.forward(ids + b, m, cache_, out, all_logits);
        }
    }

  private:
    static int64_t clamp_ctx(const ModelConfig& c, int64_t ctx) {
        if (ctx <= 0) throw Error("--ctx-size must be positive, found " + std::to_string(ctx));
        return std::min<int64_t>(ctx, c.max_positions);
    }
    cpu::ThreadPool pool_;
    int chunk_;
    cpu::CpuModel model_;
    cpu::KvCache cache_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const Checkpoint& ck, const BackendOptions& opt) {
    return std::make_unique<CpuBackend>(ck, opt);
}

}  // namespace markbase
