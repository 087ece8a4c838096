// The Gemma 4 text-decoder configuration, resolved to one plain struct.
// Every value here is final: defaults, per-layer overrides and KV-sharing sources are worked out at parse
// time (loading/config_json.cpp) so the forward passes never look at JSON. See ../shared/GEMMA4.md section 1.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "model/bf16.h"

namespace markbase {

enum class AttentionKind { Sliding, Full };

struct RopeParams {
    double theta = 10000.0;
    // Fraction of the head's pairs that rotate. 1.0 for "default"; 0.25 for the "proportional" full layers,
    // where the inverse frequencies still divide by the whole head dim (GEMMA4.md 2.5.5).
    double partial_rotary_factor = 1.0;
    bool proportional = false;

    // inv_freq[j] for j in [0, d/2): theta^(-2j/d) for the rotated pairs, 0 for the pairs that pass through.
    // "proportional" (full layers): only int(factor * d / 2) pairs rotate, and the exponent still divides by
    // d.
    std::vector<float> inverse_frequencies(int d) const {
        const int half = d / 2;
        const int n_rot = proportional ? static_cast<int>(partial_rotary_factor * d / 2) : half;
        std::vector<float> inv(half, 0.0f);
        for (int j = 0; j < n_rot; ++j)
            inv[j] = static_cast<float>(1.0 / std::pow(theta, static_cast<double>(2 * j) / d));
        return inv;
    }
};

struct LayerSpec {
    AttentionKind kind = AttentionKind::Sliding;
    int head_dim = 256;   // d: 256 on sliding layers, 512 on full layers
    int n_kv_heads = 1;   // per-layer-type KV head count
    bool k_eq_v = false;  // full layers of 26B/31B: no v_proj, V from the raw k projection
    int kv_source = -1;   // KV-shared layers: index of the layer whose cache they read; -1 = own cache
    int mlp_width = 0;    // dense MLP intermediate size (E2B doubles it on shared layers)
    bool has_own_kv() const { return kv_source < 0; }
};

struct ModelConfig {
    // Where the text weights live: "model.language_model." (nested multimodal) or "model." (flat CausalLM).
    std::string weight_prefix;
    std::string architecture;  // as written in config.json (for `inspect`)
    // Gemma 4 12B (model_type gemma4_unified / gemma4_unified_text): the text decoder of the encoder-free
    // multimodal model. Its math is the dense Gemma 4 layer's; only the config's defaults and the names of
    // the multimodal tensors it carries differ.
    bool unified = false;

    int64_t vocab_size = 262144;
    int hidden = 0;    // H
    int n_layers = 0;  // L
    int n_heads = 0;
    int sliding_window = 512;  // W: a sliding query sees the last W positions including itself
    int64_t max_positions = 131072;
    float rms_eps = 1e-6f;
    float final_softcap = 0.0f;  // 0 = none; Gemma 4 ships 30

    // Per-layer embeddings (E2B/E4B); ple_dim == 0 means off.
    int ple_dim = 0;  // P
    int64_t ple_vocab = 262144;

    // MoE (26B-A4B)
    bool moe = false;
    int n_experts = 0;
    int top_k = 0;
    int expert_width = 0;  // moe_intermediate_size / expert_intermediate_size

    int n_kv_shared = 0;  // the last n layers read another layer's cache
    RopeParams rope_sliding{10000.0, 1.0, false};
    RopeParams rope_full{1e6, 0.25, true};

    std::vector<LayerSpec> layers;  // [L]

    int bos_id = 2, eos_id = 1, pad_id = 0;
    std::vector<int> stop_ids;  // eos ids from the config (top-level list wins)

    int first_shared_layer() const { return n_layers - n_kv_shared; }
    // sqrt(H) rounded to the checkpoint dtype (bf16), as HF multiplies the bf16 embedding by it.
    float embed_scale() const { return round_to_bf16(std::sqrt(static_cast<float>(hidden))); }
};

}  // namespace markbase
