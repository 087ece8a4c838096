#include "model/tensor_plan.h"

#include <cmath>

namespace markbase {

namespace {

std::vector<PlannedTensor> plan(const ModelConfig& c, Weights* w, bool keep) {
    std::vector<PlannedTensor> out;
    const int64_t H = c.hidden, L = c.n_layers, P = c.ple_dim, V = c.vocab_size;
    Weights dummy;
    Weights& ww = w ? *w : dummy;
    if (!keep || static_cast<int64_t>(ww.layers.size()) != L) ww.layers.assign(L, LayerWeights{});
    const bool quant = w && static_cast<int64_t>(ww.quant.size()) == L;
    LayerQuant no_quant;
    auto add = [&](std::string name, std::vector<int64_t> shape, TensorRole role, const bf16** slot,
                   QuantMatrix* quant_slot = nullptr) {
        out.push_back({std::move(name), std::move(shape), role, w ? slot : nullptr, quant_slot != nullptr,
                       quant ? quant_slot : nullptr});
    };
    using R = TensorRole;
    add("embed_tokens.weight", {V, H}, R::Embedding, &ww.embed);
    add("norm.weight", {H}, R::Norm, &ww.final_norm);
    if (P) {
        add("embed_tokens_per_layer.weight", {c.ple_vocab, L * P}, R::Embedding, &ww.ple_embed);
        add("per_layer_model_projection.weight", {L * P, H}, R::Matrix, &ww.ple_model_proj);
        add("per_layer_projection_norm.weight", {P}, R::Norm, &ww.ple_proj_norm);
    }
    for (int i = 0; i < L; ++i) {
        const LayerSpec& s = c.layers[i];
        LayerWeights& l = ww.layers[i];
        LayerQuant& f = quant ? ww.quant[i] : no_quant;
        const std::string p = "layers." + std::to_string(i) + ".";
        const int64_t d = s.head_dim, nq = int64_t{c.n_heads} * d, nkv = int64_t{s.n_kv_heads} * d,
                      I = s.mlp_width;
        add(p + "self_attn.q_proj.weight", {nq, H}, R::Matrix, &l.q_proj, &f.q_proj);
        add(p + "self_attn.q_norm.weight", {d}, R::QkNorm, &l.q_norm);
        if (s.has_own_kv()) {
            add(p + "self_attn.k_proj.weight", {nkv, H}, R::Matrix, &l.k_proj, &f.k_proj);
            add(p + "self_attn.k_norm.weight", {d}, R::QkNorm, &l.k_norm);
            if (!s.k_eq_v) add(p + "self_attn.v_proj.weight", {nkv, H}, R::Matrix, &l.v_proj, &f.v_proj);
        }
        add(p + "self_attn.o_proj.weight", {H, nq}, R::Matrix, &l.o_proj, &f.o_proj);
        add(p + "input_layernorm.weight", {H}, R::Norm, &l.input_norm);
        add(p + "post_attention_layernorm.weight", {H}, R::Norm, &l.post_attn_norm);
        add(p + "pre_feedforward_layernorm.weight", {H}, R::Norm, &l.pre_ffn_norm);
        add(p + "post_feedforward_layernorm.weight", {H}, R::Norm, &l.post_ffn_norm);
        add(p + "mlp.gate_proj.weight", {I, H}, R::Matrix, &l.gate_proj, &f.gate_proj);
        add(p + "mlp.up_proj.weight", {I, H}, R::Matrix, &l.up_proj, &f.up_proj);
        add(p + "mlp.down_proj.weight", {H, I}, R::Matrix, &l.down_proj, &f.down_proj);
        add(p + "layer_scalar", {1}, R::Scalar, &l.layer_scalar_raw);
        if (P) {
            add(p + "per_layer_input_gate.weight", {P, H}, R::Matrix, &l.ple_gate);
            add(p + "per_layer_projection.weight", {H, P}, R::Matrix, &l.ple_proj);
            add(p + "post_per_layer_input_norm.weight", {H}, R::Norm, &l.ple_post_norm);
        }
        if (c.moe) {
            const int64_t E = c.n_experts, Ie = c.expert_width;
            add(p + "router.proj.weight", {E, H}, R::Matrix, &l.router_proj);
            add(p + "router.scale", {H}, R::Norm, &l.router_scale);
            add(p + "router.per_expert_scale", {E}, R::Norm, &l.per_expert_scale);
            add(p + "experts.gate_up_proj", {E, 2 * Ie, H}, R::Matrix, &l.experts_gate_up,
                &f.experts_gate_up);
            add(p + "experts.down_proj", {E, H, Ie}, R::Matrix, &l.experts_down, &f.experts_down);
            add(p + "pre_feedforward_layernorm_2.weight", {H}, R::Norm, &l.pre_ffn_norm_2);
            add(p + "post_feedforward_layernorm_1.weight", {H}, R::Norm, &l.post_ffn_norm_1);
            add(p + "post_feedforward_layernorm_2.weight", {H}, R::Norm, &l.post_ffn_norm_2);
        }
    }
    return out;
}

}  // namespace

std::vector<PlannedTensor> plan_tensors(const ModelConfig& c, Weights* w) {
    return plan(c, w, false);
}

std::vector<PlannedTensor> plan_bound_tensors(const ModelConfig& c, Weights& w) {
    return plan(c, &w, true);
}

void random_init_bounds(const PlannedTensor& p, float& lo, float& hi) {
    switch (p.role) {
        case TensorRole::Matrix:
        case TensorRole::Embedding: {
            const float b =
                std::sqrt(3.0f / static_cast<float>(p.shape.back()));  // uniform(-b, b) has variance 1/fan_in
            lo = -b;
            hi = b;
            return;
        }
        case TensorRole::Norm:
            lo = 0.5f;
            hi = 1.5f;
            return;
        case TensorRole::QkNorm:
            lo = 0.1f;
            hi = 0.35f;
            return;
        case TensorRole::Scalar:
            lo = 0.6f;
            hi = 1.2f;
            return;
    }
}

std::vector<std::string> unused_tensor_names(const ModelConfig& c) {
    std::vector<std::string> out;
    for (int i = 0; i < c.n_layers; ++i) {
        if (c.layers[i].has_own_kv()) continue;
        const std::string p = "layers." + std::to_string(i) + ".self_attn.";
        for (const char* n : {"k_proj.weight", "v_proj.weight", "k_norm.weight"}) out.push_back(p + n);
    }
    return out;
}

}  // namespace markbase
