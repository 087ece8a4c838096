// The CUDA backend's public face (plain C++, no CUDA headers): device discovery, the backend factories for a
// loaded checkpoint and for random weights generated directly in GPU memory, and the extras that only a GPU
// backend has (device-side greedy decoding, a per-kernel profile of one decode step).
// Built only when MARKBASE_HAS_CUDA is defined; callers guard their includes with it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loading/checkpoint.h"
#include "model/error.h"
#include "runtime/backend.h"
#include "runtime/graph_timeline.h"
#include "runtime/slot_backend.h"

namespace markbase {

struct CudaDeviceInfo {
    bool available = false;
    std::string why_not;  // when not available: what the runtime said
    std::string name;
    int sm_count = 0;
    int cc_major = 0, cc_minor = 0;
    double memory_gib = 0;
};
// Cheap and never throws; the first call initialises the CUDA runtime.
CudaDeviceInfo cuda_device_info();

struct CudaProfileEntry {
    std::string kernel;  // "qkv", "attention", "experts_gate_up", ...
    int layer = -1;      // -1: outside the layers (embedding, lm_head, ...)
    double ms = 0;
    double bytes = 0;  // weight bytes the kernel streams (0 where not counted)
};

// One row of the last batched step cut to its best candidates on the device (CudaBackend::batch_select).
struct BatchRowSelect {
    int row = 0;                        // in the step's order
    const DeviceSelect* req = nullptr;  // k, the penalty window and the penalties
    DeviceSelection* out = nullptr;     // the candidates; ok false where the row held NaN or +inf
    float* fallback = nullptr;          // [V]: then the row goes here
};

// One sequence's share of a mixed step (CudaBackend::mixed_batch): n ids appended to its slot (one decode
// token, or a prompt chunk); logits: its last id's row is wanted.
struct SlotItem {
    int slot = 0;
    const int* ids = nullptr;
    int n = 0;
    bool logits = false;
};

class CudaBackend : public Backend {
  public:
    // Decodes `steps` tokens greedily on the device, starting from the argmax of the last evaluated position
    // (prefill or decode); one graph launch per token, one copy back at the end. Returns the ids; the logits
    // of the final step go to last_logits ([V]) when given.
    virtual std::vector<int> decode_greedy(int steps, float* last_logits) = 0;
    // Runs one decode step (of the device-held next token) kernel by kernel, timing each with CUDA events.
    // It is a real step: the position advances.
    virtual std::vector<CudaProfileEntry> profile_step() = 0;
    // Whether the last profile_step ran gated (the whole step enqueued before the GPU started it, so the
    // events time the GPU and the gaps between kernels, not the host's launch rate).
    virtual bool profile_gated() const = 0;
    // Where the graph step's time goes (graph_timeline.h, `bench --timeline`): the decode graph replayed
    // under CUPTI's kernel activity, each record charged to the launch that created its node. Real steps (up
    // to timeline_positions(replays) tokens from the device-held next token). Never throws: ok = false and
    // why_not say what stopped it (no CUPTI, tensor parallelism, a full context, a CUPTI error).
    virtual GraphTimeline decode_timeline(int replays) {
        (void)replays;
        GraphTimeline t;
        t.why_not = "the timeline runs on one GPU: use --tensor-parallel-size 1";
        return t;
    }
    // The batched step of the slots (n >= 2; ids: each slot's next token) the same way: its graph replayed
    // as it is, the same step every replay (the slots' positions do not move). Never throws.
    virtual GraphTimeline batch_timeline(const int* slots, const int* ids, int n, int replays) {
        (void)slots, (void)ids, (void)n;
        return decode_timeline(replays);
    }
    // A prefill of ids (n <= the chunk size) from an empty cache, with events around each phase of each layer
    // (no graph; the prompt stays in the cache).
    virtual std::vector<CudaProfileEntry> profile_prefill(const int* ids, int n) = 0;
    virtual CudaDeviceInfo device() const = 0;
    // Batched decode (docs/batched-decode.md; BackendOptions::slots sequences, each with its own cache). Use
    // either these or the single-sequence calls on one backend, not both.
    virtual int slots() const { return 1; }
    virtual void slot_reset(int slot) { (void)slot; }
    // Appends ids to the slot's sequence (batched prefill, chunked).
    virtual void slot_eval(int slot, const int* ids, int64_t n) = 0;
    // One token for each of n distinct slots in one pass; returns each slot's greedy next id; logits [n][V]
    // when given.
    virtual std::vector<int> decode_batch(const int* slots, const int* ids, int n, float* logits) = 0;
    // decode_batch's step without its graph, with events around each phase of each layer (the slots
    // advance): where a batched step's time goes. One GPU only.
    virtual std::vector<CudaProfileEntry> profile_batch(const int* slots, const int* ids, int n) = 0;
    // The most sequences one decode_batch takes besides the slots: the prefill chunk (-b) bounds its rows.
    virtual int batch_rows() const { return 1; }
    // A mixed step (CudaModel::mixed_batch): items of distinct slots, each appending its ids, in one pass
    // over the weights of at most mixed_rows() rows in all (0: this backend has none). Returns the greedy
    // next id of each item with logits set, in item order; logits [k][V] of those rows when given. The rows
    // stay on the device for batch_row_logits / batch_select as decode_batch's do.
    virtual int mixed_rows() const { return 0; }
    virtual std::vector<int> mixed_batch(const SlotItem* items, int n, float* logits) {
        (void)items, (void)n, (void)logits;
        throw Error("internal: this backend runs no mixed steps");
    }
    // mixed_batch's step with events around each phase of each layer (the slots advance). One GPU only.
    virtual std::vector<CudaProfileEntry> profile_mixed(const SlotItem* items, int n) {
        (void)items, (void)n;
        throw Error("internal: this backend runs no mixed steps");
    }
    // After a decode_batch that copied no logits, whose rows stay on the device until the next call: the
    // most rows batch_select takes at once (0: none), row r's logits to the host, and each listed row's best
    // candidates as eval_select chooses them (the engine's sampled rows: k pairs cross the bus, not a row).
    virtual int batch_select_rows() const { return 0; }
    virtual void batch_row_logits(int row, float* out) {
        (void)row, (void)out;
        throw Error("internal: this backend keeps no batched rows on the device");
    }
    virtual void batch_select(BatchRowSelect* rows, int m) {
        (void)rows, (void)m;
        throw Error("internal: this backend selects no batched rows on the device");
    }
    // The bytes a weight of the MoE's experts a batched step of n sequences reads: 1 (moe_stream's FP8 rows)
    // or 0.5 (int4) where it reads them quantised, else 2 (bf16): what its byte roofline counts.
    virtual double batch_expert_weight_bytes(int n) const {
        (void)n;
        return 2.0;
    }
    // The paged KV cache (slots > 1; cuda/kv_cache.h): its pool of blocks of kKvBlock positions (0: none),
    // and a slot's block table, block numbers [0, n) (slot_eval / decode_batch use it from then on; by
    // default slot s holds blocks [s * ctx / kKvBlock, ...) where the pool has them).
    virtual int64_t kv_pool_blocks() const { return 0; }
    virtual void slot_set_blocks(int slot, const int* blocks, int64_t n) {
        (void)slot, (void)blocks, (void)n;
        throw Error("internal: this backend has no paged KV cache");
    }
    // How the prefill ran where it has choices (the 26B's experts: GEMM passes or GEMV kernels); "" if none.
    virtual std::string prefill_note() const { return {}; }
    virtual uint64_t weight_bytes() const = 0;  // bytes of weights resident on the GPU
};

std::unique_ptr<CudaBackend> make_cuda_backend(const Checkpoint& ck, const BackendOptions& opt);

// The serving engine's view of a CUDA backend built with max(2, slots) slots (cuda_slots.cpp): a step with
// prompt chunks as one mixed_batch where the backend has them, else its chunks through slot_eval and every
// wanted logits row through decode_batch. The backend's own single-sequence calls are not used alongside.
std::unique_ptr<SlotBackend> make_cuda_slot_backend(std::unique_ptr<CudaBackend> be, int slots);

// Random bf16 weights for a released variant ("e2b", "e4b", "26b-a4b", "31b"; layers 0 = real depth), drawn
// on the GPU with loading/random_checkpoint.cpp's distributions (uniform, variance 1/fan_in for matrices;
// norms in [0.5, 1.5), q/k norms in [0.1, 0.35), layer scalars in [0.6, 1.2)). No files are involved.
std::unique_ptr<CudaBackend> make_synthetic_cuda_backend(const std::string& variant, int layers,
                                                         const BackendOptions& opt, uint64_t seed = 1234);

// A host copy of a CUDA backend's weights as a Checkpoint (no files), so the CPU backend can run the very
// same model: the check of synthetic models at real widths.
struct HostWeights {
    Checkpoint checkpoint;
    std::vector<std::vector<bf16>> storage;
};
std::unique_ptr<HostWeights> copy_weights_to_host(const CudaBackend& be);

}  // namespace markbase
