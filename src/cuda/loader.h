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
// weights.cu: from the host's pointers, a tensor at a time (an FP8 checkpoint: its bf16 slots are the
// loader's dequantised buffers, in none of the files the staged pipeline reads).
// skip_expert_copies: the experts' copy of every layer experts_quantized names is not uploaded.
std::unique_ptr<DeviceWeights> upload_weights_from_host(const Checkpoint& ck, bool skip_expert_copies);
// quant_weights.cu: w.quant filled, from the host's quantised matrices (host->quant, a checkpoint's) or, host
// null, by quantising the bf16 tensors on the device (which then hold the FP8 values rounded to bf16).
void attach_quant_weights(DeviceWeights& dw, WeightFormat f, const Weights* host);
// A quantised MoE's bf16 copy of its experts goes unread where every path takes their rows (decode's
// quantised GEMVs, a batched step's moe_stream, a prompt chunk's moe_gemm): true where that holds for c under
// t. The copy is then never kept, layer by layer where both expert matrices have rows (experts_quantized: a
// published checkpoint's ignored experts keep theirs): upload_weights_from_host skips it, drop_expert_copies
// frees it after the device quantised it. Its Weights pointers hold kDroppedBf16.
bool expert_copy_unread(const ModelConfig& c, WeightFormat f, const Tuning& t);
bool experts_quantized(const Weights& w, size_t layer);
void drop_expert_copies(DeviceWeights& dw);
}  // namespace cuda

}  // namespace markbase
