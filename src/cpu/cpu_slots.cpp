// The CPU SlotBackend: one KV cache per slot over one CpuModel (weights and scratch shared). A step runs its
// prompt chunks slot by slot through the same forward() calls as CpuBackend::eval, then all its one-token
// items together through CpuModel::forward_decode: one pass over those rows, each weight read once, attention
// per row against its own cache. Either way every slot's logits are bit-identical to its sequence run alone.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "cpu/forward.h"
#include "model/error.h"
#include "runtime/slot_backend.h"

namespace markbase {

namespace {

class CpuSlotBackend final : public SlotBackend {
  public:
    CpuSlotBackend(const Checkpoint& ck, const BackendOptions& opt)
        : pool_(opt.threads),
          chunk_(std::max(1, opt.chunk)),
          model_(ck, pool_, chunk_, cpu::prompt_products(opt.tuning)) {
        if (opt.slots < 1) throw Error("slots must be at least 1, found " + std::to_string(opt.slots));
        if (opt.ctx_size <= 0)
            throw Error("--ctx-size must be positive, found " + std::to_string(opt.ctx_size));
        const int64_t ctx = std::min<int64_t>(opt.ctx_size, ck.config.max_positions);
        caches_.reserve(static_cast<size_t>(opt.slots));
        for (int s = 0; s < opt.slots; ++s) {
            caches_.emplace_back(ck.config, ctx, chunk_);
            caches_.back().values = cpu_kv_dtype(opt.kv_dtype);
        }
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
        const auto t0 = std::chrono::steady_clock::now();
        // A decode row wanting logits is listed first, so that each batch's wanted rows are its first ones.
        decode_.clear();
        int row = 0;  // the output row of a work item that wants logits, in work order
        for (const SlotWork& w : work) {
            const int out = w.logits ? row++ : -1;
            if (w.ids.size() > 1)
                run_prompt(w, out, logits, next);
            else
                decode_.push_back({&caches_[static_cast<size_t>(w.slot)], w.ids[0], out});
        }
        const auto t1 = std::chrono::steady_clock::now();
        std::stable_partition(decode_.begin(), decode_.end(), [](const DecodeRow& r) { return r.out >= 0; });
        for (size_t b = 0; b < decode_.size(); b += static_cast<size_t>(chunk_))
            run_decode(b, std::min(decode_.size(), b + static_cast<size_t>(chunk_)), logits, next);
        last_.prefill = std::chrono::duration<double>(t1 - t0).count();
        last_.decode = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    }
    StepSeconds last_step_seconds() const override { return last_; }

  private:
    StepSeconds last_;
    struct DecodeRow {
        cpu::KvCache* cache;
        int id;
        int out;  // output row, or -1: no logits wanted
    };

    // A prompt chunk (or a whole prompt) of one slot, split as CpuBackend::eval splits it.
    void run_prompt(const SlotWork& w, int out_row, float* logits, int* next) {
        cpu::KvCache& cache = caches_[static_cast<size_t>(w.slot)];
        const int64_t V = config().vocab_size;
        const int64_t n = static_cast<int64_t>(w.ids.size());
        if (out_row >= 0 && !logits && next) row_.resize(static_cast<size_t>(V));  // argmax without a row
        float* out = out_row < 0 ? nullptr : logits ? logits + out_row * V : next ? row_.data() : nullptr;
        for (int64_t b = 0; b < n; b += chunk_) {
            const int m = static_cast<int>(std::min<int64_t>(chunk_, n - b));
            model_.forward(w.ids.data() + b, m, cache, b + m == n ? out : nullptr, false);
        }
        if (out_row >= 0 && next) next[out_row] = static_cast<int>(std::max_element(out, out + V) - out);
    }

    // decode_[b, e) (at most chunk_ rows) as one forward_decode; its rows' logits land in rows_ and are
    // copied to their places in the output.
    void run_decode(size_t b, size_t e, float* logits, int* next) {
        const int n = static_cast<int>(e - b);
        ids_.clear();
        caches_of_.clear();
        int wanted = 0;
        for (size_t k = b; k < e; ++k) {
            ids_.push_back(decode_[k].id);
            caches_of_.push_back(decode_[k].cache);
            if (decode_[k].out >= 0) ++wanted;
        }
        if (!logits && !next) wanted = 0;
        const int64_t V = config().vocab_size;
        rows_.resize(static_cast<size_t>(wanted) * V);
        model_.forward_decode(ids_.data(), n, caches_of_.data(), wanted ? rows_.data() : nullptr, wanted);
        for (int r = 0; r < wanted; ++r) {
            const float* src = rows_.data() + int64_t{r} * V;
            const int out = decode_[b + static_cast<size_t>(r)].out;
            if (logits) std::memcpy(logits + int64_t{out} * V, src, sizeof(float) * static_cast<size_t>(V));
            if (next) next[out] = static_cast<int>(std::max_element(src, src + V) - src);
        }
    }

    cpu::ThreadPool pool_;
    int chunk_;
    cpu::CpuModel model_;
    std::vector<cpu::KvCache> caches_;
    std::vector<float> row_;  // a prompt's wanted row when the caller takes only its argmax
    // one step's decode rows, and one batch's inputs and logits (kept to reuse their allocations)
    std::vector<DecodeRow> decode_;
    std::vector<int> ids_;
    std::vector<cpu::KvCache*> caches_of_;
    std::vector<float> rows_;
};

}  // namespace

std::unique_ptr<SlotBackend> make_cpu_slot_backend(const Checkpoint& ck, const BackendOptions& opt) {
    return std::make_unique<CpuSlotBackend>(ck, opt);
}

}  // namespace markbase
