// `--save DIR`: a quantised model (Checkpoint::format kFp8 or kInt4: made by --quantize, or a published
// checkpoint as loaded) written as a compressed-tensors checkpoint folder, the layout llm-compressor writes,
// vLLM reads and loading/published_quant.h loads back as published:
//  - config.json: the source's, with a `quantization_config` (quant_method compressed-tensors, one group
//    targeting Linear): FP8 `float-quantized`, weights num_bits 8, type float, strategy channel; int4
//    `pack-quantized`, num_bits 4, type int, strategy group, group_size 128, symmetric as the weights are
//    (llm-compressor's W4A16 / W4A16_ASYM). FP8 is llm-compressor's FP8_DYNAMIC: activations quantised per
//    token at run time, which vLLM needs for FP8 experts (its fused MoE has no FP8 weights-only path) and
//    MarkBase sets aside as for any published FP8_DYNAMIC checkpoint. `ignore` lists lm_head and every Linear
//    written bf16.
//  - the tensors (loading/saved_tensors.h), one model.safetensors or HF's shards
//    (model-00001-of-0000N.safetensors, at most max_shard_bytes of tensors each) with
//    model.safetensors.index.json;
//  - the tokenizer, chat template, generation config and processor files the source folder has.
// Everything is written into a hidden folder beside DIR, which is renamed to DIR at the end: a failed save
// leaves nothing behind.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "loading/checkpoint.h"
#include "model/error.h"

namespace markbase {

struct SaveOptions {
    uint64_t max_shard_bytes = 5'000'000'000;  // transformers' default shard size, "5GB"
};

struct SaveResult {
    std::filesystem::path dir;
    WeightFormat format = WeightFormat::kFp8;
    bool symmetric = true;  // int4: no zero points
    int shards = 1;
    uint64_t bytes = 0;  // every file written
    std::vector<std::string> notes;
};

// Throws markbase::Error, before writing anything, where ck is not quantised (nothing to save) or `dir` is
// not a place to save to (an existing file, a folder that is not empty, the source folder); a write that
// fails is an Error naming the file, with the partial folder removed.
SaveResult save_quantized(const Checkpoint& ck, const std::filesystem::path& dir,
                          const SaveOptions& options = {});

// The checks on `dir` alone (the CLI makes them before loading): refused when it is an existing file, an
// existing folder that is not empty, or the folder `source` itself.
void check_save_target(const std::filesystem::path& dir, const std::filesystem::path& source);

// The refusal for a bf16 model, which has nothing quantised to save.
Error nothing_to_save(const std::filesystem::path& source);

// One line for the CLI: "saved an int4 compressed-tensors checkpoint (pack-quantized, symmetric, group 128)
// to DIR: 3 files, 9876543 bytes".
std::string save_summary(const SaveResult& r);

}  // namespace markbase
