// Gemma 4 text weights as plain data: bf16 pointers into the mapped checkpoint (the CPU backend points the
// streamed ones at its own copy: cpu/resident_weights.h), with shapes in HF's [out, in] layout. Names follow
// the checkpoint; GEMMA4.md section 3.2 lists them. d is the layer's head dim, nH the query heads, nKV the
// layer's KV heads, H hidden, I the layer's MLP width, P the PLE dim, E experts, Ie the expert width.
#pragma once

#include <cstdint>
#include <vector>

#include "model/bf16.h"

namespace markbase {

// How the projections' weights are held: bf16 as published, FP8 e4m3 with a scale per row (model/fp8.h), or
// int4 with a scale (and a zero point) per group of 128 weights along K (model/int4.h).
enum class WeightFormat { kBf16, kFp8, kInt4 };

// A matrix in the model's quantised format (Weights::quant; the experts' rows are [E * rows]). q null: the
// matrix is bf16 only.
//  - kFp8: q [rows, K] e4m3 bytes, scale [rows] fp32, zero null.
//  - kInt4: q [rows, K/2] two weights a byte (k even in the low nibble, as unsigned 0..15), scale
//    [rows, K/128] fp32, zero [rows, K/128] unsigned zero points 0..15, or null when symmetric (8):
//    W[r][k] = (nibble - zero) * scale.
struct QuantMatrix {
    const uint8_t* q = nullptr;
    const float* scale = nullptr;
    const uint8_t* zero = nullptr;
};

// The matrices a decode step can read quantised. Their bf16 slots in LayerWeights hold the same values
// rounded to bf16 (dequantize_row_fp8, dequantize_row_int4), for the paths that read bf16 (the CPU backend,
// the GPU's prefill).
struct LayerQuant {
    QuantMatrix q_proj, k_proj, v_proj, o_proj;  // v_proj: none where LayerWeights has none
    QuantMatrix gate_proj, up_proj, down_proj;
    QuantMatrix experts_gate_up, experts_down;  // [E, 2*Ie, H], [E, H, Ie]
};

struct LayerWeights {
    // attention
    const bf16* q_proj = nullptr;  // [nH*d, H]
    const bf16* k_proj = nullptr;  // [nKV*d, H]; null on KV-shared layers
    const bf16* v_proj = nullptr;  // [nKV*d, H]; null on k_eq_v (full 26B/31B) and KV-shared layers
    const bf16* o_proj = nullptr;  // [H, nH*d]
    const bf16* q_norm = nullptr;  // [d]
    const bf16* k_norm = nullptr;  // [d]; null on KV-shared layers

    // the four sandwich norms, [H] each
    const bf16* input_norm = nullptr;
    const bf16* post_attn_norm = nullptr;
    const bf16* pre_ffn_norm = nullptr;
    const bf16* post_ffn_norm = nullptr;

    // dense GeGLU MLP (the "shared expert" beside the MoE on 26B)
    const bf16* gate_proj = nullptr;  // [I, H]
    const bf16* up_proj = nullptr;    // [I, H]
    const bf16* down_proj = nullptr;  // [H, I]

    const bf16* layer_scalar_raw = nullptr;  // [1]
    float layer_scalar = 1.0f;  // its value: scales the whole residual stream at the end of the layer

    // per-layer embeddings (E2B/E4B)
    const bf16* ple_gate = nullptr;       // per_layer_input_gate     [P, H]
    const bf16* ple_proj = nullptr;       // per_layer_projection     [H, P]
    const bf16* ple_post_norm = nullptr;  // post_per_layer_input_norm [H]

    // MoE (26B-A4B)
    const bf16* router_proj = nullptr;       // [E, H]
    const bf16* router_scale = nullptr;      // [H]
    const bf16* per_expert_scale = nullptr;  // [E]
    const bf16* experts_gate_up = nullptr;   // [E, 2*Ie, H]: rows [0, Ie) gate, [Ie, 2*Ie) up
    const bf16* experts_down = nullptr;      // [E, H, Ie]
    const bf16* pre_ffn_norm_2 = nullptr;    // [H] experts' input norm
    const bf16* post_ffn_norm_1 = nullptr;   // [H] dense branch output norm
    const bf16* post_ffn_norm_2 = nullptr;   // [H] experts branch output norm
};

struct Weights {
    const bf16* embed = nullptr;       // embed_tokens [V, H]; also the tied lm_head
    const bf16* final_norm = nullptr;  // norm [H]
    // per-layer embeddings (E2B/E4B)
    const bf16* ple_embed = nullptr;       // embed_tokens_per_layer [Vp, L*P]
    const bf16* ple_model_proj = nullptr;  // per_layer_model_projection [L*P, H]
    const bf16* ple_proj_norm = nullptr;   // per_layer_projection_norm [P]
    std::vector<LayerWeights> layers;      // [L]
    // [L] when the projections are quantised (WeightFormat kFp8 or kInt4, Checkpoint::format), else empty
    std::vector<LayerQuant> quant;
};

// Layer i's quantised matrices: all null for a bf16 model.
inline const LayerQuant& layer_quant(const Weights& w, int i) {
    static const LayerQuant none{};
    return w.quant.empty() ? none : w.quant[static_cast<size_t>(i)];
}

}  // namespace markbase
