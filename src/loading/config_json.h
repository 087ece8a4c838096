// config.json -> ModelConfig (model/config.h).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/config.h"

namespace markbase {

// Parse config.json (the nested multimodal and the flat text-only layouts, released keys and the
// per_layer_config form). Throws markbase::Error naming the file and the field on anything unsupported.
ModelConfig parse_config_file(const std::string& path);
ModelConfig parse_config_text(const std::string& json_text, const std::string& source_name);

// A stop-id value as config.json and generation_config.json write it (an id or a list of ids), each checked
// to be an integer in [0, vocab_size). Throws markbase::Error "<where>: field '<field>' ..." otherwise.
std::vector<int> parse_token_ids(const nlohmann::json& value, int vocab_size, const std::string& where,
                                 const std::string& field);

}  // namespace markbase
