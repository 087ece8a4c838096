// generation_config.json: the checkpoint's own sampling defaults and stop ids, used when the command line
// does not say otherwise (as vLLM does with --generation-config auto).
#pragma once

#include <filesystem>
#include <optional>
#include <vector>

namespace markbase {

struct GenerationDefaults {
    std::optional<float> temperature, top_p, min_p, repetition_penalty;
    std::optional<int> top_k;
    bool do_sample = true;
    std::vector<int> stop_ids;  // eos_token_id (int or list)
};

// Reads dir/generation_config.json; a missing file gives empty defaults, a malformed one a markbase::Error.
GenerationDefaults read_generation_config(const std::filesystem::path& dir);

}  // namespace markbase
