// What the serving engine needs from a backend: several independent sequences ("slots"), each with its own
// KV cache, advanced together one step at a time. A step lists, per slot, the ids to append (a prompt chunk
// or one decode token) and whether the logits of its last position are wanted; a slot appears at most once
// per step.
//
// CPU (make_cpu_slot_backend, src/cpu/cpu_slots.cpp): one KV cache per slot over one shared CpuModel. A
// step runs each prompt chunk through the same forward() as Backend::eval, one slot after another, and all
// its one-token items as one forward_decode pass over those rows (every weight read once per step, attention
// per row against its slot's cache). Every slot's logits are bit-identical to that sequence run alone through
// make_cpu_backend with the same chunk size: the decode pass's products give each row the bits of that row
// alone (matmul_bf16_rowwise).
//
// CUDA (make_cuda_slot_backend, src/cuda/cuda_slots.cpp): BackendOptions::slots caches of CudaBackend (the
// ones `bench -np` decodes together). A step runs every prompt chunk through slot_eval, less its last id
// where logits are wanted, then every wanted row (decode tokens and those held-back last ids) through
// decode_batch: the weights read once for all of them. Its full-attention layers' K and V are paged
// (cuda/kv_cache.h): the engine's block tables (runtime/kv_blocks.h) say where each position lives in a
// pool sized to the GPU's memory, so the memory bounds the positions held, not max_sequences * ctx; its
// sliding layers keep a ring of window + chunk positions per slot. The CPU's caches are per slot, the
// engine's tables their accounting only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "loading/checkpoint.h"
#include "runtime/backend.h"

namespace markbase {

struct SlotWork {
    int slot = 0;
    std::span<const int> ids;  // appended at the slot's n_past(); not empty
    bool logits = false;       // the last id's row is wanted: its logits, and its argmax in `next`
    bool argmax_only = false;  // (with logits) only the argmax is read: a GPU backend leaves the row's logits
                               // on the device (no copy) and takes the argmax there
    // (with logits, not argmax_only) the row's select->k best candidates after select's penalties, chosen
    // by the backend as Backend::eval_select does (1 <= k <= max_select_k(), at most
    // max_select_penalty_ids() penalty ids): it fills *selection and sets selection->ok, leaving the logits
    // row unwritten; where it cannot (NaN or +inf in the row) ok is false and the row is written.
    const DeviceSelect* select = nullptr;
    DeviceSelection* selection = nullptr;
};

// Where the last eval_slots call's time went, in seconds of wall time: its prompt chunks (prefill), its
// rows of one id each (the batched decode), or both in one pass (mixed: the CUDA backend's step of prompt
// chunks beside decode rows). What a serving profile splits a step into (GET /metrics).
struct StepSeconds {
    double prefill = 0.0;
    double decode = 0.0;
    double mixed = 0.0;
};

class SlotBackend {
  public:
    virtual ~SlotBackend() = default;
    virtual const ModelConfig& config() const = 0;
    virtual std::string name() const = 0;
    virtual int slots() const = 0;
    virtual int64_t ctx_size() const = 0;  // positions each slot holds
    virtual int64_t n_past(int slot) const = 0;
    virtual void reset_slot(int slot) = 0;  // empty the slot's cache
    // Runs one step. logits: [k][V], one row per work item with logits set, in work order (nullptr when no
    // item wants any; an argmax_only item's row may be left unwritten). next: [k], each wanted row's argmax
    // (ties: the lowest id, as the greedy sampler), or nullptr. Throws markbase::Error for a slot out of
    // range, a slot listed twice, empty ids or a slot whose context would overflow; nothing is evaluated
    // then.
    virtual void eval_slots(const std::vector<SlotWork>& work, float* logits, int* next = nullptr) = 0;
    virtual StepSeconds last_step_seconds() const = 0;
    // A paged backend: the pool's blocks of kv_block_size() positions that the full-attention layers' K and V
    // live in (0: not paged), and a slot's block table for them (block number i at blocks[i]), set before
    // each step whose positions it covers.
    virtual int64_t kv_pool_blocks() const { return 0; }
    virtual int kv_block_size() const { return 0; }
    virtual void set_kv_blocks(int slot, std::span<const int32_t> blocks) { (void)slot, (void)blocks; }
    // SlotWork::select: the largest k and the most penalty ids it takes (0: none; the engine sends rows).
    virtual int max_select_k() const { return 0; }
    virtual int max_select_penalty_ids() const { return 0; }
    // The most ids a step runs as one pass over the weights, prompt chunks and decode tokens together (the
    // CUDA backend's mixed steps); 0: each prompt chunk is a pass of its own (the scheduler's
    // one_pass_steps).
    virtual int one_pass_rows() const { return 0; }
};

// BackendOptions::slots caches of ctx_size positions each (slots >= 1).
std::unique_ptr<SlotBackend> make_cpu_slot_backend(const Checkpoint& ck, const BackendOptions& opt);

// Throws markbase::Error unless `work` is a valid step for `be` (the checks eval_slots promises).
void check_slot_work(const SlotBackend& be, const std::vector<SlotWork>& work);

}  // namespace markbase
