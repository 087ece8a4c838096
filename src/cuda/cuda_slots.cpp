// The CUDA SlotBackend: the serving engine's steps (runtime/slot_backend.h) over CudaBackend's sequence slots
// (the caches `bench -np` decodes together). A step with prompt chunks whose ids fit mixed_rows() (the
// scheduler's budget, -b, counts the decodes too) is one mixed_batch: one pass over the weights for every
// row, prompt and decode, the wanted rows' logits in work order. Otherwise (a backend without mixed steps:
// tensor parallel; or too many rows) it runs in two phases:
//   1. every prompt chunk through slot_eval (the prefill path, one slot at a time), less its last id when the
//      chunk's logits are wanted;
//   2. every item that wants logits, now one id each (a decode token, or a chunk's held-back last id), in
//      decode_batch: one pass over the weights for all of them, their logits rows in work order.
// A step of decode tokens only is phase 2 alone (decode_batch replays its graph).
// Each row's argmax is taken on the device; a group whose items all want only that copies no logits (a
// 262,144-float row is 1 MB: at 64 sequences a copy and a host pass per row would cost more than the step's
// own weight reads), and a sampled row the engine lets the backend select (SlotWork::select) comes back as
// its k best candidates after the penalties (CudaModel::batch_select), the rows staying on the device.
// The engine asks logits only of an item's last id, so phase 2 covers every wanted row.
#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "cuda/backend.h"
#include "loading/memory_plan.h"
#include "model/error.h"

namespace markbase {

namespace {

class CudaSlotBackend final : public SlotBackend {
  public:
    CudaSlotBackend(std::unique_ptr<CudaBackend> be, int slots)
        : be_(std::move(be)), slots_(slots), past_(static_cast<size_t>(slots), 0) {
        if (slots < 1) throw Error("slots must be at least 1, found " + std::to_string(slots));
        if (be_->slots() < std::max(2, slots))
            throw Error("internal: the CUDA backend holds " + std::to_string(be_->slots()) +
                        " slots; serving " + std::to_string(slots) + " needs " +
                        std::to_string(std::max(2, slots)));
    }

    const ModelConfig& config() const override { return be_->config(); }
    std::string name() const override { return be_->name() + ", " + std::to_string(slots_) + " slots"; }
    int slots() const override { return slots_; }
    int64_t ctx_size() const override { return be_->ctx_size(); }
    int64_t n_past(int slot) const override { return past_.at(static_cast<size_t>(slot)); }
    void reset_slot(int slot) override {
        be_->slot_reset(slot);
        past_.at(static_cast<size_t>(slot)) = 0;
    }

    void eval_slots(const std::vector<SlotWork>& work, float* logits, int* next) override {
        check_slot_work(*this, work);
        if (mixed(work, logits, next)) return;
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<int> dslots, dids;  // phase 2's items, in work order
        std::vector<const SlotWork*> items;
        for (const SlotWork& w : work) {
            const int64_t n = static_cast<int64_t>(w.ids.size());
            const int64_t prefill = w.logits ? n - 1 : n;
            if (prefill > 0) {
                be_->slot_eval(w.slot, w.ids.data(), prefill);
                past_[static_cast<size_t>(w.slot)] += prefill;
            }
            if (w.logits) {
                dslots.push_back(w.slot);
                dids.push_back(w.ids.back());
                items.push_back(&w);
            }
        }
        const auto t1 = std::chrono::steady_clock::now();  // slot_eval returns once its chunk has run
        for (size_t b = 0; b < dslots.size(); b += static_cast<size_t>(group())) {
            const int n = static_cast<int>(std::min(dslots.size() - b, static_cast<size_t>(group())));
            decode_group(items.data() + b, dslots.data() + b, dids.data() + b, n, logits, next, b);
        }
        const auto t2 = std::chrono::steady_clock::now();  // decode_batch returns with its ids on the host
        last_ = {std::chrono::duration<double>(t1 - t0).count(),
                 std::chrono::duration<double>(t2 - t1).count(), 0.0};
    }
    StepSeconds last_step_seconds() const override { return last_; }
    int64_t kv_pool_blocks() const override { return be_->kv_pool_blocks(); }
    int kv_block_size() const override { return kKvBlock; }
    void set_kv_blocks(int slot, std::span<const int32_t> blocks) override {
        be_->slot_set_blocks(slot, blocks.data(), static_cast<int64_t>(blocks.size()));
    }
    // Sampled rows cut on the device where every row of a step's decode_batch fits its selection buffers.
    int max_select_k() const override {
        return be_->batch_select_rows() >= group() ? be_->max_select_k() : 0;
    }
    int max_select_penalty_ids() const override { return be_->max_select_penalty_ids(); }
    int one_pass_rows() const override { return be_->mixed_rows(); }

  private:
    int group() const { return std::max(1, std::min(be_->slots(), be_->batch_rows())); }

    // The step as one mixed_batch where it carries a prompt chunk and its ids fit; false (nothing run) else.
    bool mixed(const std::vector<SlotWork>& work, float* logits, int* next) {
        int64_t rows = 0;
        bool prompt = false;
        std::vector<SlotItem> items;
        std::vector<const SlotWork*> wanted;
        for (const SlotWork& w : work) {
            const int n = static_cast<int>(w.ids.size());
            rows += n;
            prompt = prompt || n > 1;
            items.push_back({w.slot, w.ids.data(), n, w.logits});
            if (w.logits) wanted.push_back(&w);
        }
        if (!prompt || rows > be_->mixed_rows() || static_cast<int>(wanted.size()) > group()) return false;
        const auto t0 = std::chrono::steady_clock::now();
        finish_rows(wanted.data(), static_cast<int>(wanted.size()), logits, next, 0, [&](float* rows_out) {
            return be_->mixed_batch(items.data(), static_cast<int>(items.size()), rows_out);
        });
        for (const SlotWork& w : work)
            past_[static_cast<size_t>(w.slot)] += static_cast<int64_t>(w.ids.size());
        last_ = {0.0, 0.0, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
        return true;
    }

    // One decode_batch over n items (rows b.. of the step's logits).
    void decode_group(const SlotWork* const* items, const int* slots, const int* ids, int n, float* logits,
                      int* next, size_t b) {
        finish_rows(items, n, logits, next, b,
                    [&](float* rows) { return be_->decode_batch(slots, ids, n, rows); });
        for (int t = 0; t < n; ++t) ++past_[static_cast<size_t>(slots[t])];
    }

    // A pass over n wanted items (rows b.. of the step's logits; pass(rows) runs it, copying its logits to
    // rows when not null): its argmax ids to next; the rows the engine reads to logits, all in one copy
    // where none selects; else the pass's rows stay on the device, each selecting row gets its candidates
    // and each other wanted row its own copy.
    template <class Pass>
    void finish_rows(const SlotWork* const* items, int n, float* logits, int* next, size_t b, Pass&& pass) {
        const int64_t V = config().vocab_size;
        bool copy = false, select = false;
        for (int t = 0; t < n; ++t) {
            select = select || items[t]->select;
            copy = copy || (!items[t]->argmax_only && !items[t]->select);
        }
        float* rows = logits ? logits + static_cast<int64_t>(b) * V : nullptr;
        const std::vector<int> out = pass(copy && !select ? rows : nullptr);
        if (next) std::copy(out.begin(), out.end(), next + b);
        if (!select) return;
        std::vector<BatchRowSelect> sel;
        for (int t = 0; t < n; ++t) {
            if (items[t]->select)
                sel.push_back({t, items[t]->select, items[t]->selection, rows + static_cast<int64_t>(t) * V});
            else if (!items[t]->argmax_only)
                be_->batch_row_logits(t, rows + static_cast<int64_t>(t) * V);
        }
        be_->batch_select(sel.data(), static_cast<int>(sel.size()));
    }

    std::unique_ptr<CudaBackend> be_;
    int slots_;
    std::vector<int64_t> past_;
    StepSeconds last_;
};

}  // namespace

std::unique_ptr<SlotBackend> make_cuda_slot_backend(std::unique_ptr<CudaBackend> be, int slots) {
    return std::make_unique<CudaSlotBackend>(std::move(be), slots);
}

}  // namespace markbase
