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

// Reads dir/generation_config.json; a missing file gives empty defaults. A malformed file, a value of the
// wrong type or out of range (temperature < 0, top_p outside (0, 1], a top_k that does not fit an int, a stop
// id outside [0, vocab_size)) is a markbase::Error naming the file and the field. vocab_size <= 0: unknown
// (ids are only checked to be >= 0).
GenerationDefaults read_generation_config(const std::filesystem::path& dir, int vocab_size);
// The same, with vocab_size read from dir/config.json when there is one.
GenerationDefaults read_generation_config(const std::filesystem::path& dir);

}  // namespace markbase
