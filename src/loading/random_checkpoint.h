// Writes a random-weight checkpoint for any Gemma 4 config in the Hugging Face layout (config.json, bf16
// safetensors, sharded with an index past shard_bytes). For tests and for benchmarks at real widths where no
// weights can be downloaded. Same seed, same bytes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>

namespace markbase {

// Returns the bytes of tensor data written.
uint64_t write_random_checkpoint(const std::filesystem::path& dir, const nlohmann::json& config,
                                 uint64_t seed, uint64_t shard_bytes = uint64_t{4} << 30);

}  // namespace markbase
