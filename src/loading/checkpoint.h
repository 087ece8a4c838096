// A Gemma 4 checkpoint folder opened for inference: the parsed config, the mapped safetensors and the weights
// bound to them. Every tensor the config implies is checked (present, bf16, exact shape) before anything
// runs; vision/audio tensors and the unused K/V tensors of KV-shared layers are skipped.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loading/safetensors.h"
#include "model/config.h"
#include "model/weights.h"

namespace markbase {

// Weights the loader made rather than mapped (loading/quant_checkpoint.h): published checkpoints' scales (as
// fp32), int4 zero points and gathered experts, the FP8 or int4 bytes --quantize makes, and the bf16 values
// (dequantize_row_fp8, dequantize_row_int4) that the bf16 slots of quantised matrices point at. Each inner
// vector's buffer stays where it is as the lists grow.
struct OwnedWeights {
    std::vector<std::unique_ptr<uint8_t[]>> quant;
    std::vector<std::unique_ptr<float[]>> scales;
    std::vector<std::unique_ptr<bf16[]>> dequantized;
    uint64_t bytes = 0;  // all of them

    // Uninitialised buffers of n values: the threads that fill their rows touch their pages first.
    uint8_t* new_quant(int64_t n);
    float* new_scales(int64_t n);
    bf16* new_bf16(int64_t n);
    // Whether p is the start of one of the dequantized buffers (a tensor that is not in the mapping).
    bool holds(const void* p) const;
};

struct Checkpoint {
    std::filesystem::path dir;
    ModelConfig config;
    SafetensorsSet files;
    Weights weights;
    uint64_t bound_bytes = 0;          // bytes of the tensors the text model uses, as the files store them
    std::vector<std::string> skipped;  // tensors present but deliberately unused
    // kFp8, kInt4: weights.quant holds the projections' quantised form (published, or made by
    // LoadOptions::quantize) and their bf16 slots point into owned.dequantized.
    WeightFormat format = WeightFormat::kBf16;
    OwnedWeights owned;
    std::vector<std::string>
        notes;  // what the loader decided that the user should hear (the CLI prints them)
};

struct LoadOptions {
    // Scan every tensor for NaN and Inf (reads the whole checkpoint once, on several threads). Without it
    // only the small tensors are scanned (norm weights, layer_scalar, router scales: up to 64 Ki elements).
    bool check_weights = false;
    // kFp8 (--quantize fp8), kInt4 (--quantize int4): a bf16 checkpoint's projections (LayerQuant's matrices)
    // are quantised at load, FP8 per row, int4 per group of 128 (symmetric); a checkpoint that is quantised
    // already loads as published, with a note.
    WeightFormat quantize = WeightFormat::kBf16;
};

// Opens config.json + safetensors in `dir`; a compressed-tensors FP8 or int4 checkpoint (quantization_config
// in config.json) loads through loading/published_quant.h. Throws markbase::Error listing every problem found
// (missing tensors, wrong shapes or dtypes, unexpected text tensors, bad scales), each with file, tensor,
// expected, found; then one listing the tensors that hold NaN or Inf (see LoadOptions::check_weights).
std::unique_ptr<Checkpoint> load_checkpoint(const std::filesystem::path& dir,
                                            const LoadOptions& options = {});

// The skipped tensors by kind ("vision tower", "encoder-free audio embedder", ...) with their counts, in the
// order first met.
std::vector<std::pair<std::string, size_t>> skipped_groups(const Checkpoint& ck);

// Parameter and traffic accounting for `inspect` and benchmark receipts (GEMMA4.md 1.2, PERFORMANCE.md).
struct ModelCounts {
    double total_params = 0;     // every text parameter in the model as loaded (PLE table included)
    double active_params = 0;    // read per decoded token: PLE rows and unselected experts excluded
    double bytes_per_token = 0;  // bytes of active_params (bf16, or quantised where count_params says)
};
// f = kFp8 or kInt4: bytes_per_token with the matrices the decode step reads quantised
// (decode_reads_quantized) at their bytes: FP8 a byte a weight and a float a row; int4 half a byte a weight
// and a float a group of 128 (the last one of a row possibly short), and a byte a group more with zero points
// (asymmetric checkpoints).
ModelCounts count_params(const ModelConfig& c, WeightFormat f = WeightFormat::kBf16,
                         bool zero_points = false);
// Whether the GPU's decode step reads this planned tensor quantised in a model of format f: the layers'
// projections and experts (not the router, the PLE matrices, embeddings or norms), at its kernels' shapes
// (cuda/kernels/gemv_quant.cu): rows in multiples of 16, K a multiple of 64 (int4: a row's last group of 128
// may be half one; published int4 checkpoints hold only whole groups). The GPU's quantised upload takes the
// same rule.
struct PlannedTensor;
bool decode_reads_quantized(const PlannedTensor& p, WeightFormat f);
// The bytes a weight of p costs the decode step in format f (its scales and zero points included), 0 where
// it reads p in bf16.
double quantized_bytes_per_weight(const PlannedTensor& p, WeightFormat f, bool zero_points);

// The bytes a batched decode step of `seqs` sequences must read at least, each sequence's query seeing `keys`
// positions (a sliding layer at most its window; KV-shared layers read their source's rows): every weight
// once (bf16; PLE rows are lookups), each MoE layer's experts as expected touched by seqs x top_k choices
// drawn uniformly, n_experts (1 - (1 - top_k / n_experts)^seqs) (random weights route near uniformly; a
// trained router's skew touches fewer), and the K/V rows of kv_elem_bytes per value; the experts at
// expert_weight_bytes a weight (1: FP8 experts, their row scales aside). The batched-step issue's roofline
// column.
struct StepBytes {
    double weights = 0;
    double kv = 0;
    double experts_touched = 0;  // per MoE layer, expected (0 for a dense model)
};
StepBytes batched_step_bytes(const ModelConfig& c, int seqs, int64_t keys, int kv_elem_bytes,
                             double expert_weight_bytes = 2.0);

}  // namespace markbase
