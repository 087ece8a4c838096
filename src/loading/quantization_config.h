// config.json's quantization_config for compressed-tensors checkpoints (what llm-compressor writes for its
// FP8 and FP8_DYNAMIC schemes, and what vLLM reads): which modules hold FP8 weights. The weights of a group
// are float8 e4m3 (num_bits 8, type float, symmetric, static) with a scale per output channel or one per
// tensor; the groups' targets choose the modules ("Linear", module names, re:PATTERN) and `ignore` keeps some
// bf16. Activation quantization (input_activations, dynamic or static) is read and set aside: the FP8 path
// here is weights-only, activations stay bf16/fp32. Every other scheme (int4 pack-quantized, group or block
// strategy, asymmetric, a KV-cache scheme) is refused naming the field, what was expected and what was found.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "loading/module_pattern.h"

namespace markbase {

struct QuantizationConfig {
    std::string file;                    // config.json, named in errors
    std::vector<ModulePattern> targets;  // every config group's targets
    std::vector<ModulePattern> ignore;
    std::string activations;  // "": none; "dynamic" or "static" (input_scale tensors): set aside

    // Whether a linear layer's weight is FP8 by the config: a group targets it and no ignore entry names it.
    bool quantizes(const std::string& module) const;
    bool ignores(const std::string& module) const;
};

// nullopt where config.json has no quantization_config (or null). Throws markbase::Error
// "<file>: field 'quantization_config.<path>' ..." for a scheme other than FP8 weights.
std::optional<QuantizationConfig> read_quantization_config(const std::filesystem::path& config_json);
std::optional<QuantizationConfig> parse_quantization_config(const std::string& json_text,
                                                            const std::string& file);

}  // namespace markbase
