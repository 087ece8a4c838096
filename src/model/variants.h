// The four released Gemma 4 text configurations (GEMMA4.md 1.2) as flat Gemma4ForCausalLM config.json
// objects, optionally cut to fewer layers (widths kept; KV sharing keeps its proportion), as
// ../shared/tools/make_random_ckpt.py writes them. For random-weight benchmarks and tests at real widths.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace markbase {

// variant: "e2b", "e4b", "26b-a4b", "31b". layers == 0 keeps the real depth. Throws markbase::Error
// otherwise.
nlohmann::json variant_config(const std::string& variant, int layers = 0);

}  // namespace markbase
