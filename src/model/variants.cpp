#include "model/variants.h"

#include <algorithm>
#include <cmath>

#include "model/error.h"

namespace markbase {

std::string variant_names() {
    return "e2b, e4b, 12b, 26b-a4b, 26b-standard or 31b";
}

nlohmann::json variant_config(const std::string& variant, int layers) {
    using nlohmann::json;
    json s;
    int period = 6;
    if (variant == "e2b") {
        s = {{"hidden_size", 1536},        {"num_hidden_layers", 35},
             {"num_attention_heads", 8},   {"num_key_value_heads", 1},
             {"intermediate_size", 6144},  {"use_double_wide_mlp", true},
             {"num_kv_shared_layers", 20}, {"hidden_size_per_layer_input", 256},
             {"sliding_window", 512},      {"max_position_embeddings", 131072}};
        period = 5;
    } else if (variant == "e4b") {
        s = {{"hidden_size", 2560},
             {"num_hidden_layers", 42},
             {"num_attention_heads", 8},
             {"num_key_value_heads", 2},
             {"intermediate_size", 10240},
             {"num_kv_shared_layers", 18},
             {"hidden_size_per_layer_input", 256},
             {"sliding_window", 512},
             {"max_position_embeddings", 131072}};
    } else if (variant == "26b-a4b") {
        s = {{"hidden_size", 2816},
             {"num_hidden_layers", 30},
             {"num_attention_heads", 16},
             {"num_key_value_heads", 8},
             {"num_global_key_value_heads", 2},
             {"attention_k_eq_v", true},
             {"intermediate_size", 2112},
             {"enable_moe_block", true},
             {"num_experts", 128},
             {"top_k_experts", 8},
             {"moe_intermediate_size", 704},
             {"hidden_size_per_layer_input", 0},
             {"sliding_window", 1024},
             {"max_position_embeddings", 262144}};
    } else if (variant == "12b") {
        // the text decoder of Gemma 4 12B (Gemma4UnifiedForConditionalGeneration), in the flat text layout
        s = {{"hidden_size", 3840},
             {"num_hidden_layers", 48},
             {"num_attention_heads", 16},
             {"num_key_value_heads", 8},
             {"num_global_key_value_heads", 1},
             {"attention_k_eq_v", true},
             {"intermediate_size", 15360},
             {"hidden_size_per_layer_input", 0},
             {"sliding_window", 1024},
             {"max_position_embeddings", 262144}};
    } else if (variant == "26b-standard") {
        // the baseline for the 26B-A4B: its 30 layers with a dense MLP as wide as its active MoE path
        // (2112 + 8 x 704 = 7744) and no experts, so both read the same bytes per token and only routing
        // differs
        s = {{"hidden_size", 2816},
             {"num_hidden_layers", 30},
             {"num_attention_heads", 16},
             {"num_key_value_heads", 8},
             {"num_global_key_value_heads", 2},
             {"attention_k_eq_v", true},
             {"intermediate_size", 7744},
             {"hidden_size_per_layer_input", 0},
             {"sliding_window", 1024},
             {"max_position_embeddings", 262144}};
    } else if (variant == "31b") {
        s = {{"hidden_size", 5376},
             {"num_hidden_layers", 60},
             {"num_attention_heads", 32},
             {"num_key_value_heads", 16},
             {"num_global_key_value_heads", 4},
             {"attention_k_eq_v", true},
             {"intermediate_size", 21504},
             {"hidden_size_per_layer_input", 0},
             {"sliding_window", 1024},
             {"max_position_embeddings", 262144}};
    } else {
        throw Error("unknown variant '" + variant + "' (expected " + variant_names() + ")");
    }
    if (layers < 0) throw Error("--layers must be >= 0");
    if (layers) {
        const int full_layers = s["num_hidden_layers"].get<int>();
        if (s.contains("num_kv_shared_layers")) {
            const int shared = s["num_kv_shared_layers"].get<int>();
            const int scaled =
                static_cast<int>(std::lround(static_cast<double>(layers) * shared / full_layers));
            s["num_kv_shared_layers"] = std::max(0, std::min(scaled, layers - period));
        }
        s["num_hidden_layers"] = layers;
    }
    const int L = s["num_hidden_layers"].get<int>();
    json types = json::array();
    for (int i = 0; i < L; ++i)
        types.push_back((i + 1) % period == 0 || i == L - 1 ? "full_attention" : "sliding_attention");
    json c = {
        {"model_type", "gemma4_text"},
        {"architectures", {"Gemma4ForCausalLM"}},
        {"vocab_size", 262144},
        {"vocab_size_per_layer_input", 262144},
        {"head_dim", 256},
        {"global_head_dim", 512},
        {"hidden_activation", "gelu_pytorch_tanh"},
        {"rms_norm_eps", 1e-6},
        {"attention_bias", false},
        {"final_logit_softcapping", 30.0},
        {"tie_word_embeddings", true},
        {"pad_token_id", 0},
        {"eos_token_id", 1},
        {"bos_token_id", 2},
        {"layer_types", types},
        {"dtype", "bfloat16"},
        {"attention_k_eq_v", false},
        {"num_kv_shared_layers", 0},
        {"enable_moe_block", false},
        {"use_double_wide_mlp", false},
        {"rope_parameters",
         {{"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}},
          {"full_attention",
           {{"rope_type", "proportional"}, {"partial_rotary_factor", 0.25}, {"rope_theta", 1000000.0}}}}}};
    for (auto it = s.begin(); it != s.end(); ++it) c[it.key()] = it.value();
    return c;
}

}  // namespace markbase
