// The decode step's FP8 weights (model/weights.h LayerQuant) in one device allocation beside the bf16 tensors:
// a checkpoint's FP8 bytes and scales copied from the host (loading/ made them, as published or by
// --quantize fp8), or random bf16 weights quantised on the device (bench at real widths). The bf16 tensors
// stay resident and hold the same values rounded to bf16 (the loader's dequantised copy, or fp8_quant.cu's
// rewrite), for the prefill and the batched step, which read bf16.
#include <string>
#include <vector>

#include "cuda/check.h"
#include "cuda/loader.h"
#include "cuda/model.h"
#include "model/error.h"

namespace markbase::cuda {

namespace {

struct Fp8Slot {
    QuantMatrix* dst;
    const bf16* bf16_weights;  // device
    const QuantMatrix* host;     // null: quantise on the device
    int64_t rows;
    int K;
};

// Every LayerQuant matrix the model has, with its [rows, K] (the experts' [E * rows, K]).
std::vector<Fp8Slot> fp8_slots(DeviceWeights& dw, const Weights* host) {
    const ModelConfig& c = dw.config;
    std::vector<Fp8Slot> out;
    dw.w.quant.assign(dw.w.layers.size(), LayerQuant{});
    const int H = c.hidden;
    for (size_t i = 0; i < dw.w.layers.size(); ++i) {
        const LayerWeights& l = dw.w.layers[i];
        LayerQuant& f = dw.w.quant[i];
        const LayerQuant* h = host ? &host->quant[i] : nullptr;
        const LayerSpec& s = c.layers[i];
        const int64_t q = int64_t{c.n_heads} * s.head_dim, kv = int64_t{s.n_kv_heads} * s.head_dim,
                      I = s.mlp_width;
        auto add = [&](QuantMatrix& d, const bf16* w, const QuantMatrix* hs, int64_t rows, int64_t K,
                       int64_t per_expert = 0) {
            if (!w) return;
            if (host && !hs->q) return;  // kept bf16 (a published checkpoint's ignored module)
            // gemv_fp8.cu's shapes (K a multiple of 64; a tile's 8 rows, an expert's rows per slot): the
            // others stay bf16 (tiny test models)
            const int64_t tile_rows = per_expert ? per_expert : rows;
            if (K % 64 || tile_rows % 8) return;
            out.push_back({&d, w, hs, rows, static_cast<int>(K)});
        };
        add(f.q_proj, l.q_proj, h ? &h->q_proj : nullptr, q, H);
        add(f.k_proj, l.k_proj, h ? &h->k_proj : nullptr, kv, H);
        add(f.v_proj, l.v_proj, h ? &h->v_proj : nullptr, kv, H);
        add(f.o_proj, l.o_proj, h ? &h->o_proj : nullptr, H, q);
        add(f.gate_proj, l.gate_proj, h ? &h->gate_proj : nullptr, I, H);
        add(f.up_proj, l.up_proj, h ? &h->up_proj : nullptr, I, H);
        add(f.down_proj, l.down_proj, h ? &h->down_proj : nullptr, H, I);
        if (c.moe) {
            const int64_t E = c.n_experts, Ie = c.expert_width;
            add(f.experts_gate_up, l.experts_gate_up, h ? &h->experts_gate_up : nullptr, E * 2 * Ie, H, Ie);
            add(f.experts_down, l.experts_down, h ? &h->experts_down : nullptr, E * H, Ie, H);
        }
    }
    return out;
}

uint64_t align256(uint64_t v) {
    return (v + 255) & ~uint64_t{255};
}

}  // namespace

void attach_fp8_weights(DeviceWeights& dw, const Weights* host) {
    if (host && host->quant.size() != dw.w.layers.size())
        throw Error("internal: the checkpoint's FP8 layers do not match the model's");
    const std::vector<Fp8Slot> slots = fp8_slots(dw, host);
    uint64_t bytes = 0;
    for (const Fp8Slot& s : slots)
        bytes += align256(static_cast<uint64_t>(s.rows) * s.K) + align256(4 * s.rows);
    uint8_t* base = reinterpret_cast<uint8_t*>(device_alloc(bytes, "the FP8 weights"));
    dw.fp8_arena = base;
    dw.fp8_bytes = bytes;
    uint64_t at = 0;
    for (const Fp8Slot& s : slots) {
        const uint64_t n = static_cast<uint64_t>(s.rows) * s.K;
        uint8_t* q = base + at;
        at += align256(n);
        float* scale = reinterpret_cast<float*>(base + at);
        at += align256(4 * s.rows);
        if (s.host) {
            CUDA_CHECK(cudaMemcpy(q, s.host->q, n, cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemcpy(scale, s.host->scale, 4 * s.rows, cudaMemcpyHostToDevice));
        } else {
            quantize_rows_fp8(const_cast<bf16*>(s.bf16_weights), s.rows, s.K, q, scale, nullptr);
        }
        *s.dst = {q, scale};
    }
    CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace markbase::cuda
