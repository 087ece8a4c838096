// The 26B's experts at prefill and in batched steps, after moe_route and moe_bucket grouped the entries by
// expert on the device: moe_gemm (a prompt chunk: tensor-core tiles of each expert's entries), moe_stream (a
// batched step of a few sequences: each touched expert's rows streamed once), else the grouped GEMV kernels
// (widths moe_gemm does not tile). No host in the loop.
#include "cuda/model.h"
#include "loading/memory_plan.h"

namespace markbase::cuda {

// The experts' bf16 copy, where a path is about to read it: expert_copy_unread promised none would.
static void require_copy(const bf16* w) {
    if (w == kDroppedBf16)
        throw Error("internal: a path reads the experts' bf16 copy, which expert_copy_unread did not keep");
}

// A layer's experts as ExpertRows: FP8 or int4 rows where the model streams them (fp8_experts,
// int4_experts), else bf16 (a published checkpoint's ignored experts read the bf16 copy).
static ExpertRows expert_rows(const bf16* w, const QuantMatrix& q, bool fp8, bool int4 = false) {
    ExpertRows r;
    r.w = w;
    if (fp8 && q.q) r.fp8 = q;
    if (int4 && q.q) r.int4 = q;
    if (!r.fp8.q && !r.int4.q) require_copy(w);
    return r;
}

// moe_gemm against the compact cuBLAS pass it replaced (one batched GEMM per padded row count, planned on the
// host after a sync per layer; H200, 26B-A4B prefill of 512): bf16 experts 19.96 -> 14.67 ms (16.46 while the
// inputs were first gathered in entry order; tiles of 64 entries 18.38), FP8 experts (the compact pass read
// the bf16 copy) 35.0 -> 26.8 ms for the whole prefill.
void CudaModel::prefill_experts(int i, int n) {
    const LayerWeights& lw = w_.layers[i];
    const int H = c_.hidden, E = c_.n_experts, K = c_.top_k, Ie = c_.expert_width;
    if (plan_.moe_gemm && moe_gemm_fits(H, Ie, E)) {
        const LayerQuant& lq = layer_quant(w_, i);
        const ExpertRows gate_up =
            expert_rows(lw.experts_gate_up, lq.experts_gate_up, fp8_experts(), int4_experts());
        const ExpertRows down = expert_rows(lw.experts_down, lq.experts_down, fp8_experts(), int4_experts());
        moe_gemm_experts(moe_.e_in, H, K, n, gate_up, down, Ie, moe_.gexp, moe_.goff, moe_.gent, E,
                         static_cast<bf16*>(moe_.mx), moe_.mh, moe_.eslots, stream_);
        ++moe_.stats.moe_gemm_layers;
        moe_.stats.moe_gemm_fp8_layers += gate_up.fp8.q && down.fp8.q;
        moe_.stats.moe_gemm_int4_layers += gate_up.int4.q && down.int4.q;
        return;
    }
    require_copy(lw.experts_gate_up);
    require_copy(lw.experts_down);
    moe_gate_up(moe_.e_in, H, lw.experts_gate_up, Ie, K, moe_.gexp, moe_.goff, moe_.gent, E, moe_.eh,
                stream_);
    moe_down(moe_.eh, Ie, lw.experts_down, H, moe_.gexp, moe_.goff, moe_.gent, E, moe_.eslots, stream_);
    ++moe_.stats.gemv_layers;
}

// A batched step's experts on the device (moe_stream.cu): the experts' input as halves (quantised rows: one
// f16), then the gate/up pass (GeGLU in its store) and the down pass over each touched expert's rows. The
// scratch is the passes' (moe_.mx holds 2 x [n][H] halves, moe_.mh 2 x [n K][Ie]: the memory plan's rows are
// >= n K). A model with FP8 or int4 experts streams them (a half or a quarter of the bf16 copy's bytes; the
// input then f16), where moe_stream takes their widths.
void CudaModel::batch_experts(int i, int n, cudaStream_t s) {
    const LayerWeights& lw = w_.layers[i];
    const int H = c_.hidden, E = c_.n_experts, K = c_.top_k, Ie = c_.expert_width;
    const bool fp8 = fp8_experts(), int4 = int4_experts();  // at widths moe_stream's rows take
    const LayerQuant& lq = layer_quant(w_, i);
    const ExpertRows gate_up = expert_rows(lw.experts_gate_up, lq.experts_gate_up, fp8, int4);
    const ExpertRows down = expert_rows(lw.experts_down, lq.experts_down, fp8, int4);
    bf16* x_hi = static_cast<bf16*>(moe_.mx);
    bf16* x_lo = x_hi + int64_t{n} * H;
    if (gate_up.fp8.q || gate_up.int4.q)
        f16_rows(moe_.e_in, H, H, n, false, nullptr, c_.rms_eps, x_hi, s);  // x_lo unused
    else
        split_rows(moe_.e_in, H, H, n, false, nullptr, c_.rms_eps, x_hi, x_lo, s);
    bf16* h_hi = moe_.mh;
    bf16* h_lo = h_hi + int64_t{n} * K * Ie;
    moe_stream_gate_up(x_hi, x_lo, H, K, gate_up, Ie, moe_.goff, moe_.gent, E, n, h_hi, h_lo,
                       down.fp8.q != nullptr || down.int4.q != nullptr, s);
    moe_stream_down(h_hi, h_lo, Ie, down, H, K, moe_.goff, moe_.gent, E, n, moe_.eslots, s);
    ++moe_.stats.stream_layers;
    moe_.stats.stream_fp8_layers += gate_up.fp8.q != nullptr;
    moe_.stats.stream_int4_layers += gate_up.int4.q != nullptr;
}

}  // namespace markbase::cuda
