// The released Gemma 4 text configurations (GEMMA4.md 1.2: E2B, E4B, 26B-A4B, 31B; the 12B's text decoder)
// and the 26B-Standard baseline (the 26B-A4B with a dense MLP as wide as its active MoE path) as flat
// Gemma4ForCausalLM config.json objects, optionally cut to fewer layers (widths kept; KV sharing keeps its
// proportion), as
// ../shared/tools/make_random_ckpt.py writes them. For random-weight benchmarks and tests at real widths.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace markbase {

// variant: "e2b", "e4b", "12b", "26b-a4b", "26b-standard", "31b". layers == 0 keeps the real depth. Throws
// markbase::Error otherwise.
nlohmann::json variant_config(const std::string& variant, int layers = 0);

// The variant names variant_config knows, for help and error texts.
std::string variant_names();

}  // namespace markbase
