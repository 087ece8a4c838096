// The CPU SlotBackend: one KV cache per slot over one CpuModel (weights and scratch shared). Each step runs
// its slots one after another through the same forward() calls as CpuBackend::eval (runtime/slot_backend.h
// says why and what the batched form will change).
#include <algorithm>
#include <string>

#include "cpu/forward.h"
#include "model/error.h"
#include "runtime/slot_backend.h"

namespace markbase {

namespace {

class CpuSlotBackend final : public SlotBackend {
  public:
    CpuSlotBackend(const Checkpoint& ck, const BackendOptions& opt)
        : pool_(opt.threads), chunk_(std::max(1, opt.chunk)), model_(ck, pool_, chunk_) {
        if (opt.slots < 1) throw Error("slots must be at least 1, found " + std::to_string(opt.slots));
        if (opt.ctx_size <= 0)
            throw Error("--ctx-size must be positive, found " + std::to_string(opt.ctx_size));
        const int64_t ctx = std::min<int64_t>(opt.ctx_size, ck.config.max_positions);
        caches_.reserve(static_cast<size_t>(opt.slots));
        for (int s = 0; s < opt.slots; ++s) caches_.emplace_back(ck.config, ctx, chunk_);
    }

    const ModelConfig& config() const override { return model_.config(); }
    std::string name() const override {
        return "cpu (" + std::to_string(pool_.size()) + " threads, " + std::to_string(slots()) + " slots)";
    }
    int slots() const override { return static_cast<int>(caches_.size()); }
    int64_t ctx_size() const override { return caches_.front().max_ctx; }
    int64_t n_past(int slot) const override { return caches_.at(static_cast<size_t>(slot)).n_past; }
    void reset_slot(int slot) override { caches_.at(static_cast<size_t>(slot)).clear(); }

    void eval_slots(const std::vector<SlotWork>& work, float* logits, int* next) override {
        check_slot_work(*this, work);
        const int64_t V = config().vocab_size;
        int64_t row = 0;
        for (const SlotWork& w : work) {
            cpu::KvCache& cache = caches_[static_cast<size_t>(w.slot)];
            const int64_t n = static_cast<int64_t>(w.ids.size());
            if (w.logits && !logits && next) row_.resize(static_cast<size_t>(V));  // argmax without a row
            float* out = !w.logits ? nullptr : logits ? logits + row * V : next ? row_.data() : nullptr;
            // the chunking of CpuBackend::eval, so that a slot's logits are the lone sequence's exactly
            for (int64_t b = 0; b < n; b += chunk_) {
                const int m = static_cast<int>(std::min<int64_t>(chunk_, n - b));
                model_.forward(w.ids.data() + b, m, cache, b + m == n ? out : nullptr, false);
            }
            if (w.logits && next) next[row] = static_cast<int>(std::max_element(out, out + V) - out);
            if (w.logits) ++row;
        }
    }

  private:
    cpu::ThreadPool pool_;
    int chunk_;
    cpu::CpuModel model_;
    std::vector<cpu::KvCache> caches_;
    std::vector<float> row_;  // a wanted row's logits when the caller takes only its argmax
};

}  // namespace

std::unique_ptr<SlotBackend> make_cpu_slot_backend(const Checkpoint& ck, const BackendOptions& opt) {
    return std::make_unique<CpuSlotBackend>(ck, opt);
}

}  // namespace markbase
