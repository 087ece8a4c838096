// The staged checkpoint loader's CUDA side (issue 5), callable from plain C++ (no CUDA headers):
// free-memory query for the fit check, and a one-shot timed load for `markbase bench load --device cuda`.
// The implementation is staged_load.cu: pinned staging ring, async copies on their own stream, one
// event per staging buffer. Built only when MARKBASE_HAS_CUDA is defined.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "loading/checkpoint.h"
#include "loading/staged_reader.h"
#include "model/tensor_plan.h"
#include "runtime/backend.h"
#include "runtime/tuning.h"

namespace markbase {

// Free and total bytes on device 0 (cudaMemGetInfo); false when there is no usable device.
bool cuda_memory_info(uint64_t* free_bytes, uint64_t* total_bytes);

// Staged options for the CUDA path from the tuning: load_threads (0: min(16, cores)), load_chunk_mib,
// load_direct.
StagedOptions cuda_staged_options(const Tuning& tuning);

// Loads every bound tensor of `ck` into one device allocation through the staged pipeline, waits until it
// is all on the device, frees it, and returns the pipeline's statistics (seconds include the allocation).
// For `bench load`: the model is not built.
StagedStats cuda_staged_load_once(const Checkpoint& ck, const StagedOptions& opt);

namespace cuda {
struct DeviceWeights;
// The backend's upload through the staged pipeline (one device allocation for the model, tensors as views in
// the checkpoint's layout), with a progress bar on a TTY and the summary line on stderr (upload_weights).
std::unique_ptr<DeviceWeights> upload_weights_staged(const Checkpoint& ck, const StagedOptions& opt);
// The bf16 copies a quantised model does without on the GPU (their Weights pointers then hold kDroppedBf16).
//  - experts: a MoE's, where every path reads their rows (decode's quantised GEMVs, a batched step's
//    moe_stream, a prompt chunk's moe_gemm: expert_copy_unread), for the layers whose two expert matrices
//    both have rows (experts_quantized: a published checkpoint's ignored experts keep theirs);
//  - dense: the projections (q, k, v, o, gate, up, down) of every layer all of whose projections have rows
//    (dense_quantized), where the options say so (Bf16Copy::kDrop; kAuto is the fit check's to resolve).
//    Decode reads their rows; a prompt chunk's or a batched step's product first dequantises them into
//    DeviceWeights::dequant_scratch (dequant_scratch_bytes: a layer's largest launch), then runs as over
//    the copy: the same values, more memory traffic, a fraction of the memory.
// upload_weights_from_host skips them, drop_copies frees them (after the device quantised them) and makes
// the scratch, the fit check counts them out.
struct CopyDrop {
    bool experts = false, dense = false;
};
bool expert_copy_unread(const ModelConfig& c, WeightFormat f, const Tuning& t);
CopyDrop copy_drop(const ModelConfig& c, WeightFormat f, const Tuning& t, Bf16Copy dense);
bool experts_quantized(const Weights& w, size_t layer);
bool dense_quantized(const Weights& w, size_t layer);
// A host's weights as the device will hold their rows: q cleared where attach_quant_weights does not take a
// matrix (decode_reads_quantized), so that decisions over them are the device's.
Weights rows_on_device(const ModelConfig& c, const Weights& host, WeightFormat f);
// Whether the plan's tensor p (a plan over w, w.quant sized [L]: the device's rows) is a copy d drops.
bool copy_dropped(const Weights& w, const PlannedTensor& p, CopyDrop d);
// Whether d drops any projection's copy of w (then the scratch, of dequant_scratch_bytes, is allocated).
bool dequant_scratch_needed(const Weights& w, CopyDrop d);
uint64_t dequant_scratch_bytes(const ModelConfig& c);
void drop_copies(DeviceWeights& dw, CopyDrop d);
// weights.cu: from the host's pointers, a tensor at a time (an FP8 checkpoint: its bf16 slots are the
// loader's dequantised buffers, in none of the files the staged pipeline reads).
// The copies `skip` drops (copy_dropped over the host's weights) are not uploaded.
std::unique_ptr<DeviceWeights> upload_weights_from_host(const Checkpoint& ck, CopyDrop skip);
// quant_weights.cu: w.quant filled, from the host's quantised matrices (host->quant, a checkpoint's) or, host
// null, by quantising the bf16 tensors on the device (which then hold the FP8 values rounded to bf16).
void attach_quant_weights(DeviceWeights& dw, WeightFormat f, const Weights* host);
}  // namespace cuda

}  // namespace markbase
