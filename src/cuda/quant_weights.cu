// The decode step's quantised weights (model/weights.h LayerQuant, FP8 or int4) in one device allocation
// beside the bf16 tensors: a checkpoint's bytes, scales and zero points copied from the host (loading/ made
// them, as published or by --quantize), or random bf16 weights quantised on the device (bench at real
// widths). The bf16 tensors hold the same values rounded to bf16 (the loader's dequantised copy, or
// quantize_rows.cu's rewrite), for the prefill's and the batched step's dense products, which read bf16, but
// the copies a model does without (loader.h CopyDrop: the experts' where every path reads their rows, the
// projections' under --bf16-copy drop).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "cuda/check.h"
#include "cuda/kernels/moe_kernels.h"
#include "cuda/loader.h"
#include "cuda/model.h"
#include "loading/checkpoint.h"
#include "model/error.h"
#include "model/int4.h"
#include "model/tensor_plan.h"

namespace markbase::cuda {

namespace {

struct QuantSlot {
    QuantMatrix* dst;
    const bf16* bf16_weights;  // device
    bool from_host;            // false: quantise on the device
    QuantMatrix host;  // the host's matrix (a copy: the plan it came from is gone when the slots are used)
    int64_t rows;
    int K;
};

// Every LayerQuant matrix the decode step reads quantised (decode_reads_quantized: the rule the byte counts
// and the fit check use), with its [rows, K] (the experts' [E * rows, K]); host's matching matrix where
// given.
std::vector<QuantSlot> quant_slots(DeviceWeights& dw, WeightFormat f, const Weights* host) {
    const ModelConfig& c = dw.config;
    std::vector<QuantSlot> out;
    dw.w.quant.assign(dw.w.layers.size(), LayerQuant{});
    const std::vector<PlannedTensor> dev = plan_bound_tensors(c, dw.w);
    Weights host_view;  // a copy of the host's pointers to plan over (the plan wants them writable)
    std::vector<PlannedTensor> hp;
    if (host) {
        host_view = *host;
        hp = plan_bound_tensors(c, host_view);
        if (hp.size() != dev.size()) throw Error("internal: the checkpoint's plan differs from the model's");
    }
    for (size_t i = 0; i < dev.size(); ++i) {
        const PlannedTensor& p = dev[i];
        if (!p.quant || !*p.slot || !decode_reads_quantized(p, f)) continue;
        const QuantMatrix* hs = host ? hp[i].quant : nullptr;
        if (host && (!hs || !hs->q)) continue;  // kept bf16 (a published checkpoint's ignored module)
        int64_t rows = 1;
        for (size_t d = 0; d + 1 < p.shape.size(); ++d) rows *= p.shape[d];
        out.push_back({p.quant, *p.slot, hs != nullptr, hs ? *hs : QuantMatrix{}, rows,
                       static_cast<int>(p.shape.back())});
    }
    return out;
}

uint64_t align256(uint64_t v) {
    return (v + 255) & ~uint64_t{255};
}

// A slot's sizes in the format: bytes of q, scales, zero points (int4: a group of 128 along K, the last one
// possibly short; zero points only where the host's matrix has them).
struct SlotSizes {
    uint64_t q = 0, scales = 0, zeros = 0;
};
SlotSizes sizes_of(WeightFormat f, const QuantSlot& s) {
    const uint64_t rows = static_cast<uint64_t>(s.rows), K = static_cast<uint64_t>(s.K);
    if (f == WeightFormat::kFp8) return {rows * K, rows, 0};
    const uint64_t G = static_cast<uint64_t>(int4_groups(s.K));
    return {rows * K / 2, rows * G, s.from_host && s.host.zero ? rows * G : 0};
}

}  // namespace

void attach_quant_weights(DeviceWeights& dw, WeightFormat f, const Weights* host) {
    if (f != WeightFormat::kFp8 && f != WeightFormat::kInt4)
        throw Error("internal: attach_quant_weights takes FP8 or int4");
    if (host && host->quant.size() != dw.w.layers.size())
        throw Error("internal: the checkpoint's quantised layers do not match the model's");
    const std::vector<QuantSlot> slots = quant_slots(dw, f, host);
    uint64_t bytes = 0;
    for (const QuantSlot& s : slots) {
        const SlotSizes z = sizes_of(f, s);
        bytes += align256(z.q) + align256(4 * z.scales) + align256(z.zeros);
    }
    uint8_t* base = reinterpret_cast<uint8_t*>(device_alloc(bytes, "the quantised weights"));
    dw.quant_arena = base;
    dw.quant_bytes = bytes;
    dw.quant_format = f;
    uint64_t at = 0;
    for (const QuantSlot& s : slots) {
        const SlotSizes z = sizes_of(f, s);
        uint8_t* q = base + at;
        at += align256(z.q);
        float* scale = reinterpret_cast<float*>(base + at);
        at += align256(4 * z.scales);
        uint8_t* zero = z.zeros ? base + at : nullptr;
        at += align256(z.zeros);
        if (s.from_host) {
            CUDA_CHECK(cudaMemcpy(q, s.host.q, z.q, cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemcpy(scale, s.host.scale, 4 * z.scales, cudaMemcpyHostToDevice));
            if (zero) CUDA_CHECK(cudaMemcpy(zero, s.host.zero, z.zeros, cudaMemcpyHostToDevice));
        } else if (f == WeightFormat::kFp8) {
            quantize_rows_fp8(const_cast<bf16*>(s.bf16_weights), s.rows, s.K, q, scale, nullptr);
        } else {
            quantize_rows_int4(const_cast<bf16*>(s.bf16_weights), s.rows, s.K, q, scale, nullptr);
        }
        *s.dst = {q, scale, zero};
    }
    CUDA_CHECK(cudaDeviceSynchronize());
}

bool expert_copy_unread(const ModelConfig& c, WeightFormat f, const Tuning& t) {
    if (!c.moe || (f != WeightFormat::kFp8 && f != WeightFormat::kInt4)) return false;
    const int H = c.hidden, Ie = c.expert_width;
    // decode reads the rows (the quantised GEMVs); a prompt chunk's experts, and a batched step's past
    // batch_experts, go through moe_gemm, which reads FP8 and int4 rows (prefill_experts; its grouped-GEMV
    // fallback reads bf16); a batched step's moe_stream reads them at the widths it takes for the format
    const bool stream = f == WeightFormat::kFp8 ? moe_stream_fits_fp8(H, Ie) : moe_stream_fits(H, Ie);
    return t.moe_gemm && moe_gemm_fits(H, Ie, c.n_experts) && stream;
}

CopyDrop copy_drop(const ModelConfig& c, WeightFormat f, const Tuning& t, Bf16Copy dense) {
    if (dense == Bf16Copy::kAuto) throw Error("internal: --bf16-copy auto is the fit check's to resolve");
    const bool quant = f == WeightFormat::kFp8 || f == WeightFormat::kInt4;
    return {expert_copy_unread(c, f, t), quant && dense == Bf16Copy::kDrop};
}

Weights rows_on_device(const ModelConfig& c, const Weights& host, WeightFormat f) {
    Weights w = host;
    for (const PlannedTensor& p : plan_bound_tensors(c, w))
        if (p.quant && !decode_reads_quantized(p, f)) *p.quant = {};  // attach_quant_weights skips it
    return w;
}

bool experts_quantized(const Weights& w, size_t l) {
    if (l >= w.quant.size() || l >= w.layers.size() || !w.layers[l].experts_gate_up) return false;
    return w.quant[l].experts_gate_up.q && w.quant[l].experts_down.q;
}

// Whether all of layer l's projections (q, k and v where present, o, gate, up, down) have rows: then each of
// the decode step's launches reads them quantised (it reads a group quantised only where all of it is), and
// the layer's copy can go whole.
bool dense_quantized(const Weights& w, size_t l) {
    if (l >= w.quant.size() || l >= w.layers.size()) return false;
    const LayerWeights& lw = w.layers[l];
    const LayerQuant& q = w.quant[l];
    const std::pair<const bf16*, const QuantMatrix*> m[] = {
        {lw.q_proj, &q.q_proj},      {lw.k_proj, &q.k_proj},       {lw.v_proj, &q.v_proj},
        {lw.o_proj, &q.o_proj},      {lw.gate_proj, &q.gate_proj}, {lw.up_proj, &q.up_proj},
        {lw.down_proj, &q.down_proj}};
    bool any = false;
    for (const auto& [bf, rows] : m) {
        if (!bf) continue;
        if (!rows->q) return false;
        any = true;
    }
    return any;
}

bool copy_dropped(const Weights& w, const PlannedTensor& p, CopyDrop d) {
    for (size_t l = 0; l < w.layers.size(); ++l) {
        const LayerWeights& lw = w.layers[l];
        if (p.slot == &lw.experts_gate_up || p.slot == &lw.experts_down)
            return d.experts && experts_quantized(w, l);
        const bf16* const* dense[] = {&lw.q_proj,    &lw.k_proj,  &lw.v_proj,   &lw.o_proj,
                                      &lw.gate_proj, &lw.up_proj, &lw.down_proj};
        for (const bf16* const* slot : dense)
            if (p.slot == slot) return d.dense && dense_quantized(w, l);
    }
    return false;
}

bool dequant_scratch_needed(const Weights& w, CopyDrop d) {
    for (size_t l = 0; d.dense && l < w.layers.size(); ++l)
        if (dense_quantized(w, l)) return true;
    return false;
}

uint64_t dequant_scratch_bytes(const ModelConfig& c) {
    uint64_t most = 0;
    const uint64_t H = static_cast<uint64_t>(c.hidden);
    for (const LayerSpec& s : c.layers) {
        const uint64_t qw = static_cast<uint64_t>(c.n_heads) * s.head_dim;
        const uint64_t kvw = static_cast<uint64_t>(s.n_kv_heads) * s.head_dim;
        const uint64_t I = static_cast<uint64_t>(s.mlp_width);
        // one launch's matrices: q/k/v, o_proj, gate/up, down
        most = std::max({most, (qw + 2 * kvw) * H, H * qw, 2 * I * H, H * I});
    }
    return 2 * most;
}

void drop_copies(DeviceWeights& dw, CopyDrop d) {
    if (!d.experts && !d.dense) return;
    if (dw.arena) throw Error("internal: a bf16 copy in a staged arena (bf16 checkpoints only)");
    const std::vector<PlannedTensor> plan = plan_bound_tensors(dw.config, dw.w);  // slots into dw.w
    if (plan.size() != dw.tensors.size()) throw Error("internal: the tensor plan changed");
    std::vector<bool> drop(plan.size());
    for (size_t j = 0; j < plan.size(); ++j) drop[j] = copy_dropped(dw.w, plan[j], d);
    for (size_t j = 0; j < plan.size(); ++j) {
        if (!drop[j]) continue;
        if (dw.tensors[j].ptr) {  // (a checkpoint's was never uploaded)
            CUDA_CHECK(cudaFree(const_cast<bf16*>(dw.tensors[j].ptr)));
            dw.bytes -= dw.tensors[j].bytes;
            dw.tensors[j].ptr = nullptr;
            dw.tensors[j].bytes = 0;
        }
        *plan[j].slot = kDroppedBf16;
    }
    if (dequant_scratch_needed(dw.w, d) && !dw.dequant_scratch) {
        dw.dequant_scratch_bytes = dequant_scratch_bytes(dw.config);
        dw.dequant_scratch = device_alloc(dw.dequant_scratch_bytes, "the dequantised weights' scratch");
    }
}

}  // namespace markbase::cuda
