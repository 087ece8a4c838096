// The CUDA SlotBackend: the serving engine's steps (runtime/slot_backend.h) over CudaBackend's sequence slots
// (the caches `bench -np` decodes together). A step runs in two phases:
//   1. every prompt chunk through slot_eval (the prefill path, one slot at a time), less its last id when the
//      chunk's logits are wanted;
//   2. every item that wants logits, now one id each (a decode token, or a chunk's held-back last id), in
//      decode_batch: one pass over the weights for all of them, their logits rows in work order.
// Each row's argmax is taken on the device; a group whose items all want only that copies no logits (a
// 262,144-float row is 1 MB: at 64 sequences a copy and a host pass per row would cost more than the step's
// own weight reads).
// The engine asks logits only of an item's last id, so phase 2 covers every wanted row and a prompt's last
// position is computed exactly as a decode token at that position would be.
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
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<int> dslots, dids;  // phase 2's items, in work order
        std::vector<char> copy;         // whether the item's logits row is wanted on the host
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
                copy.push_back(logits && !w.argmax_only);
            }
        }
        const auto t1 = std::chrono::steady_clock::now();  // slot_eval returns once its chunk has run
        const int64_t V = config().vocab_size;
        const int group = std::max(1, std::min(be_->slots(), be_->batch_rows()));
        for (size_t b = 0; b < dslots.size(); b += static_cast<size_t>(group)) {
            const int n = static_cast<int>(std::min(dslots.size() - b, static_cast<size_t>(group)));
            const auto first = copy.begin() + static_cast<std::ptrdiff_t>(b);
            const bool rows = std::any_of(first, first + n, [](char c) { return c != 0; });
            const std::vector<int> ids = be_->decode_batch(
                dslots.data() + b, dids.data() + b, n, rows ? logits + static_cast<int64_t>(b) * V : nullptr);
            if (next) std::copy(ids.begin(), ids.end(), next + b);
            for (int t = 0; t < n; ++t) ++past_[static_cast<size_t>(dslots[b + static_cast<size_t>(t)])];
        }
        const auto t2 = std::chrono::steady_clock::now();  // decode_batch returns with its ids on the host
        last_.prefill = std::chrono::duration<double>(t1 - t0).count();
        last_.decode = std::chrono::duration<double>(t2 - t1).count();
    }
    StepSeconds last_step_seconds() const override { return last_; }
    int64_t kv_pool_blocks() const override { return be_->kv_pool_blocks(); }
    int kv_block_size() const override { return kKvBlock; }
    void set_kv_blocks(int slot, std::span<const int32_t> blocks) override {
        be_->slot_set_blocks(slot, blocks.data(), static_cast<int64_t>(blocks.size()));
    }

  private:
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
