// FP8 checkpoints for the loader's tests, written by hand from the compressed-tensors description (no
// quantiser runs here): a bf16 checkpoint's matrices as `<module>.weight` F8_E4M3 + `<module>.weight_scale`,
// fused experts unfused into llm-compressor's per-expert tensors, config.json's quantization_config; beside
// it the bf16 checkpoint of the dequantised values, which an FP8 load must reproduce bit for bit.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

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

// Rewrites dir/model.safetensors through `edit`, which may drop, add or replace tensors (`keep` owns the
// bytes of anything it adds).
using TensorEdit = std::function<void(std::vector<TensorToWrite>&, std::vector<std::vector<uint8_t>>& keep)>;
void rewrite_tensors(const std::filesystem::path& dir, const TensorEdit& edit);

// Rewrites dir/config.json through `edit`.
void rewrite_config(const std::filesystem::path& dir, const std::function<void(nlohmann::json&)>& edit);

}  // namespace markbase::testing
