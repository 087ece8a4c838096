// What the generation loop needs from a backend (CPU and CUDA): feed tokens, get logits, keep a cache.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loading/checkpoint.h"
#include "model/weights.h"
#include "runtime/kv_dtype.h"
#include "runtime/sampler.h"
#include "runtime/tuning.h"

namespace markbase {

// One decode step's token choice made next to the logits (a GPU backend): the k largest logits after the
// penalties instead of the whole row. pen_ids/pen_counts: the distinct ids of the penalty window and their
// counts, applied as apply_penalties does.
struct DeviceSelect {
    int k = 1;
    std::vector<int> pen_ids, pen_counts;
    float repeat_penalty = 1.0f, presence_penalty = 0.0f, frequency_penalty = 0.0f;
};
struct DeviceSelection {
    std::vector<Sampler::Top> top;  // min(k, n_finite) candidates, logit descending, id ascending
    int64_t n_finite = 0;           // logits that are not -inf after the penalties
    bool ok = false;                // SlotBackend::eval_slots: selected (false: the row came back instead)
};

// A quantised model's bf16 copy of its dense projections on the GPU (--bf16-copy), which the prefill's and
// the batched step's products read (decode reads the quantised rows): kKeep holds it (the fastest prefill and
// batched steps); kDrop does without it, those products first dequantising their rows into a scratch (the
// memory of the quantised rows, slower prompts and batched steps); kAuto keeps it where the model then
// fits the GPU and drops it where only that makes it fit (the fit check decides; with no fit check, keep).
enum class Bf16Copy { kAuto, kKeep, kDrop };

struct BackendOptions {
    int64_t ctx_size = 4096;  // positions the KV cache holds (capped at max_position_embeddings)
    int threads = 0;          // CPU threads; 0 = all cores
    int chunk = 256;          // prompt tokens per batched forward pass
    int tensor_parallel = 1;  // GPUs one model is split over (CUDA; --tensor-parallel-size)
    int slots = 1;            // sequences with their own cache for batched decode (CUDA; --parallel)
    KvDtype kv_dtype = KvDtype::kAuto;  // the cache's element type (--kv-cache-dtype; runtime/kv_dtype.h)
    // CUDA with slots > 1: the paged KV cache's pool of blocks (loading/memory_plan.h kKvBlock positions
    // each). kv_blocks > 0: that many. Else gpu_memory_utilization > 0: what that share of the GPU's memory
    // leaves after the weights and buffers (serve --gpu-memory-utilization). Else every slot's whole context.
    int64_t kv_blocks = 0;
    double gpu_memory_utilization = 0;
    // Random weights (CUDA bench at real widths): kFp8 quantises them on the device (model/fp8.h), as
    // --quantize fp8 does a checkpoint's at load. A checkpoint's own format comes from the checkpoint.
    WeightFormat weights = WeightFormat::kBf16;
    Bf16Copy bf16_copy = Bf16Copy::kAuto;
    Tuning tuning;  // runtime/tuning.h: --tuning / $MARKBASE_TUNING
};

class Backend {
  public:
    virtual ~Backend() = default;
    virtual const ModelConfig& config() const = 0;
    virtual std::string name() const = 0;
    virtual int64_t n_past() const = 0;  // positions in the cache
    virtual int64_t ctx_size() const = 0;
    virtual void reset() = 0;  // empty the cache
    // Drops positions >= n_keep so the sequence can continue differently from there. Returns false (and
    // changes nothing) when the cache cannot do it, e.g. a sliding ring already overwrote what position
    // n_keep still needs; the caller then resets and prefills again.
    virtual bool truncate(int64_t n_keep) { return n_keep == n_past(); }
    // Appends ids to the sequence (split into batched chunks internally). logits: [ids.size()][V] when
    // all_logits, else [V] for the last id; nullptr computes none. Throws markbase::Error when the context is
    // full.
    virtual void eval(const int* ids, int64_t n, float* logits, bool all_logits) = 0;
    virtual uint64_t cache_bytes() const = 0;
    // MoE models: the smallest gap between the K-th and (K+1)-th expert's router logit, relative to the
    // token's largest |router logit|, over every token routed since reset(). Comparisons between backends
    // read it: within rounding's reach an expert choice may differ, and the outputs with it. Infinity where
    // not tracked (and on dense models).
    virtual float router_margin() const { return INFINITY; }

    // The largest k eval_select serves and the most penalty ids it takes (0: no device-side selection).
    virtual int max_select_k() const { return 0; }
    virtual int max_select_penalty_ids() const { return 0; }
    // Appends `id` like eval(&id, 1, logits, false) and selects on the device. Returns false when it could
    // not select (no device path, or NaN/+inf in the logits); then the full row is in `logits` for the host
    // sampler, which reports the problem. Requires 1 <= req.k <= max_select_k().
    virtual bool eval_select(int id, const DeviceSelect& req, DeviceSelection* out, float* logits) {
        (void)req;
        (void)out;
        eval(&id, 1, logits, false);
        return false;
    }
};

std::unique_ptr<Backend> make_cpu_backend(const Checkpoint& ck, const BackendOptions& opt);

}  // namespace markbase
