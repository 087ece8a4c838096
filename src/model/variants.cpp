#include "model/variants.h"

#include <algorithm>
#include <cmath>

#include "model/error.h"

namespace markbase {

std::string variant_names() {
    return "e2b, e4b, 12b, 26b-a4b, 26b-standard or 31b";
}

namespace {

using nlohmann::json;

// The E models: per-layer inputs, and the last layers reuse earlier layers' KV caches.
json edge_sizes(const std::string& variant) {
    if (variant == "e2b")
        return {{"hidden_size", 1536},        {"num_hidden_layers", 35},
                {"num_attention_heads", 8},   {"num_key_value_heads", 1},
                {"intermediate_size", 6144},  {"use_double_wide_mlp", true},
                {"num_kv_shared_layers", 20}, {"hidden_size_per_layer_input", 256},
                {"sliding_window", 512},      {"max_position_embeddings", 131072}};
    if (variant == "e4b")
        return {{"hidden_size", 2560},
                {"num_hidden_layers", 42},
                {"num_attention_heads", 8},
                {"num_key_value_heads", 2},
                {"intermediate_size", 10240},
                {"num_kv_shared_layers", 18},
                {"hidden_size_per_layer_input", 256},
                {"sliding_window", 512},
                {"max_position_embeddings", 131072}};
    return nullptr;
}

// The larger models: no per-layer inputs; their full-attention layers have fewer KV heads, K doubling as V.
json large_sizes(const std::string& variant) {
    if (variant == "26b-a4b")
        return {{"hidden_size", 2816},
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
    // the text decoder of Gemma 4 12B (Gemma4UnifiedForConditionalGeneration), in the flat text layout
    if (variant == "12b")
        return {{"hidden_size", 3840},
                {"num_hidden_layers", 48},
                {"num_attention_heads", 16},
                {"num_key_value_heads", 8},
                {"num_global_key_value_heads", 1},
                {"attention_k_eq_v", true},
                {"intermediate_size", 15360},
                {"hidden_size_per_layer_input", 0},
                {"sliding_window", 1024},
                {"max_position_embeddings", 262144}};
    // the baseline for the 26B-A4B: its 30 layers with a dense MLP as wide as its active MoE path
    // (2112 + 8 x 704 = 7744) and no experts, so both read the same bytes per token and only routing
    // differs
    if (variant == "26b-standard")
        return {{"hidden_size", 2816},
                {"num_hidden_layers", 30},
                {"num_attention_heads", 16},
                {"num_key_value_heads", 8},
                {"num_global_key_value_heads", 2},
                {"attention_k_eq_v", true},
                {"intermediate_size", 7744},
                {"hidden_size_per_layer_input", 0},
                {"sliding_window", 1024},
                {"max_position_embeddings", 262144}};
    if (variant == "31b")
        return {{"hidden_size", 5376},
                {"num_hidden_layers", 60},
                {"num_attention_heads", 32},
                {"num_key_value_heads", 16},
                {"num_global_key_value_heads", 4},
                {"attention_k_eq_v", true},
                {"intermediate_size", 21504},
                {"hidden_size_per_layer_input", 0},
                {"sliding_window", 1024},
                {"max_position_embeddings", 262144}};
    return nullptr;
}

// Cuts the depth to `layers`; KV sharing keeps its proportion and at least one attention period unshared.
void cut_layers(json& s, int layers, int period) {
    const int full_layers = s["num_hidden_layers"].get<int>();
    if (s.contains("num_kv_shared_layers")) {
        const int shared = s["num_kv_shared_layers"].get<int>();
        const int scaled = static_cast<int>(std::lround(static_cast<double>(layers) * shared / full_layers));
        s["num_kv_shared_layers"] = std::max(0, std::min(scaled, layers - period));
    }
    s["num_hidden_layers"] = layers;
}

// What every variant shares, with its layer pattern: every period-th layer and the last attend globally.
json common_config(int n_layers, int period) {
    json types = json::array();
    for (int i = 0; i < n_layers; ++i)
        types.push_back((i + 1) % period == 0 || i == n_layers - 1 ? "full_attention" : "sliding_attention");
    return {
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
}

}  // namespace

nlohmann::json variant_config(const std::string& variant, int layers) {
    json s = edge_sizes(variant);
    if (s.is_null()) s = large_sizes(variant);
    if (s.is_null()) throw Error("unknown variant '" + variant + "' (expected " + variant_names() + ")");
    // E2B has a full-attention layer every 5 layers, the others every 6.
    const int period = variant == "e2b" ? 5 : 6;
    if (layers < 0) throw Error("--layers must be >= 0");
    if (layers) cut_layers(s, layers, period);
    json c = common_config(s["num_hidden_layers"].get<int>(), period);
    for (auto it = s.begin(); it != s.end(); ++it) c[it.key()] = it.value();
    return c;
}

}  // namespace markbase
