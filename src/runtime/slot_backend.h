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
// decode_batch: the weights read once for all of them. The paged cache (runtime/kv_blocks.h) is the engine's
// accounting today; on the GPU each slot still holds ctx positions, so max_sequences * ctx bounds the memory.
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
};

// Where the last eval_slots call's time went, in seconds of wall time: its prompt chunks (prefill) and its
// rows of one id each (the batched decode). What a serving profile splits a step into (GET /metrics).
struct StepSeconds {
    double prefill = 0.0;
    double decode = 0.0;
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
};

// BackendOptions::slots caches of ctx_size positions each (slots >= 1).
std::unique_ptr<SlotBackend> make_cpu_slot_backend(const Checkpoint& ck, const BackendOptions& opt);

// Throws markbase::Error unless `work` is a valid step for `be` (the checks eval_slots promises).
void check_slot_work(const SlotBackend& be, const std::vector<SlotWork>& work);

}  // namespace markbase
