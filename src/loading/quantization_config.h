// config.json's quantization_config for compressed-tensors checkpoints (what llm-compressor writes and vLLM
// reads): which modules hold quantised weights, and how. Two weight schemes:
//  - FP8 (llm-compressor's FP8 and FP8_DYNAMIC; format float-quantized or naive-quantized): float8 e4m3
//    (num_bits 8, type float, symmetric, static) with a scale per output channel or one per tensor.
//    Activation quantization (input_activations, dynamic or static) is read and set aside: the path is
//    weights-only, activations stay bf16/fp32.
//  - int4 (W4A16 and W4A16_ASYM; format pack-quantized): num_bits 4, type int, strategy group, group_size
//  128,
//    symmetric or not, static, no input_activations; actorder null, false, weight or static (those keep the
//    groups in order; "group" ordering stores a g_idx permutation and is refused).
// Every group must use the same scheme (one format per checkpoint). The groups' targets choose the modules
// ("Linear", module names, re:PATTERN) and `ignore` keeps some bf16. Everything else (other widths, group
// sizes, strategies, a KV-cache scheme, sparse formats) is refused naming the field, what was expected and
// what was found.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "loading/module_pattern.h"
#include "model/weights.h"

namespace markbase {

struct QuantizationConfig {
    std::string file;                          // config.json, named in errors
    WeightFormat format = WeightFormat::kFp8;  // kFp8 or kInt4: every group's scheme
    bool symmetric = true;                     // kInt4: false stores a zero point per group
    std::vector<ModulePattern> targets;        // every config group's targets
    std::vector<ModulePattern> ignore;
    std::string activations;  // "": none; "dynamic" or "static" (input_scale tensors): set aside

    // Whether a linear layer's weight is quantised by the config: a group targets it and no ignore entry
    // names it.
    bool quantizes(const std::string& module) const;
    bool ignores(const std::string& module) const;
};

// nullopt where config.json has no quantization_config (or null). Throws markbase::Error
// "<file>: field 'quantization_config.<path>' ..." for a scheme other than the two above.
std::optional<QuantizationConfig> read_quantization_config(const std::filesystem::path& config_json);
std::optional<QuantizationConfig> parse_quantization_config(const std::string& json_text,
                                                            const std::string& file);

}  // namespace markbase
