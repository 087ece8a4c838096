#include "support/tiny_models.h"

#include <unistd.h>

#include <atomic>
#include <cctype>

#include "model/variants.h"

namespace markbase::testing {

nlohmann::json tiny_config(const std::string& family, int layers) {
    if (layers == 0) layers = family == "e2b" ? 10 : 12;
    nlohmann::json c = variant_config(family, layers);
    c["hidden_size"] = 64;
    c["vocab_size"] = 256;
    c["vocab_size_per_layer_input"] = 256;
    c["head_dim"] = 16;
    c["global_head_dim"] = 32;
    c["sliding_window"] = 4;
    c["max_position_embeddings"] = 512;
    c["num_attention_heads"] = 4;
    c["num_key_value_heads"] = family == "e2b" ? 1 : 2;
    if (c.contains("num_global_key_value_heads")) c["num_global_key_value_heads"] = 1;
    c["intermediate_size"] = family == "26b-a4b" ? 48 : 96;
    if (c.value("hidden_size_per_layer_input", 0) > 0) c["hidden_size_per_layer_input"] = 16;
    if (c.value("enable_moe_block", false)) {
        c["num_experts"] = 8;
        c["top_k_experts"] = 3;
        c["moe_intermediate_size"] = 24;
    }
    return c;
}

nlohmann::json tiny_int4_config(const std::string& family, int layers) {
    nlohmann::json c = tiny_config(family, layers);
    c["hidden_size"] = 128;
    c["head_dim"] = 32;
    c["global_head_dim"] = 64;
    c["intermediate_size"] = 128;
    if (c.value("enable_moe_block", false)) c["moe_intermediate_size"] = 128;
    return c;
}

TempDir::TempDir(const std::string& tag) {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("markbase-test-" + tag + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
}

std::string test_name(std::string s) {
    for (char& ch : s)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    return s;
}

}  // namespace markbase::testing
