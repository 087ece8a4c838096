// Quantised checkpoints for the loader's tests, written by hand from the compressed-tensors description (no
// quantiser runs here): a bf16 checkpoint's matrices as FP8 (`<module>.weight` F8_E4M3 + `weight_scale`) or
// as int4 pack-quantized (`weight_packed` I32, `weight_scale`, `weight_shape`, and packed `weight_zero_point`
// when asymmetric), fused experts unfused into llm-compressor's per-expert tensors, config.json's
// quantization_config; beside it the bf16 checkpoint of the dequantised values, which a load of the quantised
// copy must reproduce bit for bit.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "loading/checkpoint.h"
#include "loading/safetensors.h"

namespace markbase::testing {

struct Fp8Layout {
    // Which planned matrices (full tensor names: "...q_proj.weight", "...experts.gate_up_proj") are FP8.
    std::function<bool(const std::string& name)> quantized;
    std::set<std::string> per_tensor;  // weights with one scale per tensor (written BF16, shape [])
    nlohmann::json ignore = nlohmann::json::array();  // quantization_config.ignore as written
    bool input_scales = false;  // also static activation scales (`<module>.input_scale`, F32 [1])
};

// Reads the bf16 checkpoint in `src` (config.json + model.safetensors) and writes `fp8_dir`
// (compressed-tensors FP8, channel strategy) and `ref_dir` (bf16, the dequantised values of every FP8 matrix,
// the rest copied).
void write_fp8_copy(const std::filesystem::path& src, const std::filesystem::path& fp8_dir,
                    const std::filesystem::path& ref_dir, const Fp8Layout& layout);

// config.json's quantization_config as write_fp8_copy writes it (one group: Linear, FP8 weights per channel,
// dynamic activations), with `ignore`.
nlohmann::json fp8_quantization_config(const nlohmann::json& ignore);

struct Int4Layout {
    // Which planned matrices (full tensor names) are int4; quantised by model/int4.h (group 128, a short
    // group where K < 128, as compressed-tensors does).
    std::function<bool(const std::string& name)> quantized;
    bool symmetric = true;
    nlohmann::json ignore = nlohmann::json::array();
    DType scale_dtype = DType::BF16;    // BF16 or F32 (the scales are bf16 values: exact in both)
    DType shape_dtype = DType::I64;     // weight_shape: torch.tensor(weight.shape) is int64; I32 also read
    bool unpacked_zero_points = false;  // I8 [out, G] as compressed-tensors wrote them before packing them
};

// As write_fp8_copy, for compressed-tensors' W4A16 pack-quantized (group 128).
void write_int4_copy(const std::filesystem::path& src, const std::filesystem::path& int4_dir,
                     const std::filesystem::path& ref_dir, const Int4Layout& layout);

// config.json's quantization_config as write_int4_copy writes it (one group: Linear, int4 weights in groups
// of 128, no activation quantization), with `ignore`.
nlohmann::json int4_quantization_config(const nlohmann::json& ignore, bool symmetric);

// compressed-tensors' pack_to_int32, written here from its description: codes (0..15, one a byte, [rows, n])
// packed eight to an int32 along a row (packed_dim 1; the row padded with 0 codes) or along the column
// (packed_dim 0, for zero points: [ceil(rows / 8), n]), code i of a word at bits 4i.
std::vector<int32_t> pack_int4_codes(const std::vector<uint8_t>& codes, int64_t rows, int64_t n,
                                     int packed_dim);

// Every planned tensor's bf16 values are the same bytes in both (gtest expectations, one per tensor).
void expect_same_bf16(const Checkpoint& a, const Checkpoint& b);

// Both checkpoints' CPU logits over 12 random ids are the same bits.
void expect_same_logits(const Checkpoint& a, const Checkpoint& b);

// A tensor's bytes as the file holds them.
std::vector<uint8_t> file_bytes(const Checkpoint& ck, const std::string& name);

// Rewrites dir/model.safetensors through `edit`, which may drop, add or replace tensors (`keep` owns the
// bytes of anything it adds).
using TensorEdit = std::function<void(std::vector<TensorToWrite>&, std::vector<std::vector<uint8_t>>& keep)>;
void rewrite_tensors(const std::filesystem::path& dir, const TensorEdit& edit);

// Rewrites dir/config.json through `edit`.
void rewrite_config(const std::filesystem::path& dir, const std::function<void(nlohmann::json&)>& edit);

}  // namespace markbase::testing
