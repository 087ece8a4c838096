// config.json -> ModelConfig (model/config.h).
#pragma once

#include <string>

#include "model/config.h"

namespace markbase {

// Parse config.json (the nested multimodal and the flat text-only layouts, released keys and the
// per_layer_config form). Throws markbase::Error naming the file and the field on anything unsupported.
ModelConfig parse_config_file(const std::string& path);
ModelConfig parse_config_text(const std::string& json_text, const std::string& source_name);

}  // namespace markbase
