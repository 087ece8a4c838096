// The 26B's experts at prefill, after moe_route and moe_bucket grouped the chunk's entries by expert: the
// compact pass over each expert's own rows (batched GEMMs over pointer arrays, bucketed by padded row count),
// else batched GEMMs in passes of at most moe_.cap rows per expert, else (a layer whose busiest expert holds
// more) the grouped GEMV kernels.
#include <algorithm>

#include "cuda/model.h"
#include "loading/memory_plan.h"

namespace markbase::cuda {

void CudaModel::prefill_experts(int i, int n) {
    const LayerWeights& lw = w_.layers[i];
    const int H = c_.hidden, E = c_.n_experts, K = c_.top_k, Ie = c_.expert_width;
    if (plan_.moe_gemm > 0 && moe_gemm_fits(H, Ie, E)) {  // grouped on the device: no plan, no sync
        const bool fp8 = fp8_experts();
        const LayerQuant& lq = layer_quant(w_, i);
        ExpertRows gate_up, down;
        gate_up.w = lw.experts_gate_up;
        down.w = lw.experts_down;
        if (fp8) gate_up.fp8 = lq.experts_gate_up, down.fp8 = lq.experts_down;
        moe_gemm_experts(moe_.e_in, H, K, n, gate_up, down, Ie, moe_.gexp, moe_.goff, moe_.gent, E,
                         plan_.moe_gemm, static_cast<bf16*>(moe_.mx), moe_.mh, moe_.eslots, stream_);
        ++moe_.stats.moe_gemm_layers;
        moe_.stats.moe_gemm_fp8_layers += fp8 && gate_up.fp8.q && down.fp8.q;
        return;
    }
    // the busiest expert sizes the batch: one small copy and a sync per MoE layer
    CUDA_CHECK(
        cudaMemcpyAsync(moe_.h_goff, moe_.goff, (E + 1) * sizeof(int), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    int max_n = 0;
    for (int e = 0; e < E; ++e) max_n = std::max(max_n, moe_.h_goff[e + 1] - moe_.h_goff[e]);
    moe_.stats.busiest = std::max(moe_.stats.busiest, max_n);
    if (max_n > 0 && prefill_experts_compact(i)) return;
    // (a rank holds some of the experts: the passes' batched GEMMs would stream every expert, so a rank whose
    // layer does not fit the compact pass runs the grouped GEMV kernels)
    if (max_n == 0 || sharded()) {
        moe_gate_up(moe_.e_in, H, lw.experts_gate_up, Ie, K, moe_.gexp, moe_.goff, moe_.gent, E, moe_.eh,
                    stream_);
        moe_down(moe_.eh, Ie, lw.experts_down, H, moe_.gexp, moe_.goff, moe_.gent, E, moe_.eslots, stream_);
        ++moe_.stats.gemv_layers;
        return;
    }
    // Every expert's weights are read once per pass (tensor cores), instead of once per 4 of its tokens. A
    // pass takes up to moe_.cap entries of every expert (the scratch); the busiest expert sets the number of
    // passes (random-weight models route unevenly, so a layer used to fall back to the GEMV kernels whenever
    // its busiest expert exceeded the scratch).
    ++moe_.stats.gemm_layers;
    moe_.stats.cap = moe_.cap;
    for (int first = 0; first < max_n; first += moe_.cap) {
        const int m = std::min(moe_.cap, max_n - first);
        ++moe_.stats.passes;
        const int64_t rows = int64_t{E} * m;
        const int64_t gu_stride = 2 * int64_t{Ie} * H;  // [E][gate Ie | up Ie][H]
        if (m <= kGemmStackMaxN) {
            // each expert's weights read once: its [hi; lo] rows stacked; gate and up as one GEMM
            bf16* x = static_cast<bf16*>(moe_.mx);
            moe_gather_split(moe_.e_in, H, K, moe_.gent, moe_.goff, E, first, m, x, x + int64_t{m} * H,
                             stream_, 2 * int64_t{m} * H);
            gemm_batched_stacked(lw.experts_gate_up, gu_stride, 2 * Ie, H, E, m, x, moe_.ey2);
            moe_geglu_halves(moe_.ey2, E, m, Ie, moe_.mh, stream_);
            gemm_batched_stacked(lw.experts_down, int64_t{H} * Ie, H, Ie, E, m, moe_.mh, moe_.ey2);
            moe_scatter_rows(moe_.ey2, H, moe_.gent, moe_.goff, E, first, m, moe_.eslots, stream_, true);
            continue;
        }
        bf16* x_hi = static_cast<bf16*>(moe_.mx);
        bf16* x_lo = x_hi + rows * H;
        moe_gather_split(moe_.e_in, H, K, moe_.gent, moe_.goff, E, first, m, x_hi, x_lo, stream_);
        gemm_batched(lw.experts_gate_up, gu_stride, Ie, H, E, m, x_hi, x_lo, moe_.mg);
        gemm_batched(lw.experts_gate_up + int64_t{Ie} * H, gu_stride, Ie, H, E, m, x_hi, x_lo, moe_.mu);
        bf16* h_hi = moe_.mh;
        bf16* h_lo = moe_.mh + rows * Ie;
        geglu_split(moe_.mg, moe_.mu, Ie, Ie, static_cast<int>(rows), h_hi, h_lo, stream_);
        float* y = static_cast<float*>(moe_.mx);  // the gathered inputs are consumed: reuse their bytes
        gemm_batched(lw.experts_down, int64_t{H} * Ie, H, Ie, E, m, h_hi, h_lo, y);
        moe_scatter_rows(y, H, moe_.gent, moe_.goff, E, first, m, moe_.eslots, stream_);
    }
}

// A batched step's experts on the device (moe_stream.cu): the experts' input as halves (FP8: one f16),
// then the gate/up pass (GeGLU in its store) and the down pass over each touched expert's rows. The scratch
// is the passes' (moe_.mx holds 2 x [n][H] halves, moe_.mh 2 x [n K][Ie]: the memory plan's rows are >= n
// K). A model with FP8 experts streams them (half the bytes of the bf16 copy; the input then f16), where
// moe_stream takes their widths; int4 experts read the bf16 copy.
void CudaModel::batch_experts(int i, int n, cudaStream_t s) {
    const LayerWeights& lw = w_.layers[i];
    const int H = c_.hidden, E = c_.n_experts, K = c_.top_k, Ie = c_.expert_width;
    const bool fp8 = fp8_experts();  // an FP8 model at widths moe_stream's FP8 rows take
    const auto rows = [&](const bf16* w, const QuantMatrix& q) {
        ExpertRows r;
        r.w = w;
        if (fp8 && q.q) r.fp8 = q;  // (a published checkpoint's ignored experts have none: bf16)
        return r;
    };
    const LayerQuant& lq = layer_quant(w_, i);
    const ExpertRows gate_up = rows(lw.experts_gate_up, lq.experts_gate_up);
    const ExpertRows down = rows(lw.experts_down, lq.experts_down);
    bf16* x_hi = static_cast<bf16*>(moe_.mx);
    bf16* x_lo = x_hi + int64_t{n} * H;
    if (gate_up.fp8.q)
        f16_rows(moe_.e_in, H, H, n, false, nullptr, c_.rms_eps, x_hi, s);  // x_lo unused
    else
        split_rows(moe_.e_in, H, H, n, false, nullptr, c_.rms_eps, x_hi, x_lo, s);
    bf16* h_hi = moe_.mh;
    bf16* h_lo = h_hi + int64_t{n} * K * Ie;
    moe_stream_gate_up(x_hi, x_lo, H, K, gate_up, Ie, moe_.goff, moe_.gent, E, n, h_hi, h_lo,
                       down.fp8.q != nullptr, s);
    moe_stream_down(h_hi, h_lo, Ie, down, H, K, moe_.goff, moe_.gent, E, n, moe_.eslots, s);
    ++moe_.stats.stream_layers;
    moe_.stats.stream_fp8_layers += gate_up.fp8.q != nullptr;
}

namespace {
// An expert's entries padded for the compact pass: few distinct row counts (each is one batched GEMM), at
// most 15 / 31 / 63 rows of padding per expert.
// (Padding every active expert to >= 64 rows measured the same prefill, 1401 GEMMs instead of 2551, and
// batched decode of 64 sequences +13%.)
int padded_rows(int entries) {
    if (entries <= 0) return 0;
    const int unit = entries <= 64 ? 16 : entries <= 256 ? 32 : 64;
    return (entries + unit - 1) / unit * unit;
}
}  // namespace

// One pass over each expert's own rows. The passes above run every expert at the
// pass's row count, set by the busiest expert: with random routing's 4096 entries over 128 experts (mean 32,
// busiest ~500) a 512-token chunk took ~4 passes whose GEMMs were ~3/4 padding. Here expert e's entries are
// padded to r_e rows (padded_rows), and the experts with the same r_e are one batched GEMM over pointer
// arrays: each expert's weights are read once and its products cover its own rows. The plan is made on the
// host from the entry counts prefill_experts has already copied back.
bool CudaModel::prefill_experts_compact(int i) {
    const int H = c_.hidden, E = c_.n_experts, K = c_.top_k, Ie = c_.expert_width;
    int max_r = 0;
    if (!compact_plan(i, &max_r)) return false;
    const int* roff =
        reinterpret_cast<const int*>(static_cast<void**>(moe_.h_mplan) + 6 * static_cast<size_t>(E));
    const ExpertRange held = held_experts();
    const int e_end = held.count < 0 ? E : held.begin + held.count;
    void** dp = static_cast<void**>(moe_.d_mplan);
    const int* d_roff = reinterpret_cast<const int*>(dp + 6 * static_cast<size_t>(E));
    CUDA_CHECK(cudaMemcpyAsync(moe_.d_mplan, moe_.h_mplan, 6 * E * sizeof(void*) + (E + 1) * sizeof(int),
                               cudaMemcpyHostToDevice, stream_));
    moe_gather_compact(moe_.e_in, H, K, moe_.gent, moe_.goff, d_roff, E, max_r, static_cast<bf16*>(moe_.mx),
                       stream_);
    compact_buckets(0, 2 * Ie, H, roff);
    moe_geglu_compact(moe_.ey2, d_roff, E, max_r, Ie, moe_.mh, stream_);
    compact_buckets(1, H, Ie, roff);
    if (e_end - held.begin < E)
        CUDA_CHECK(cudaMemsetAsync(moe_.eslots, 0, static_cast<size_t>(moe_.h_goff[E]) * H * sizeof(float),
                                   stream_));
    moe_scatter_compact(moe_.ey2, H, moe_.gent, moe_.goff, d_roff, E, max_r, moe_.eslots, stream_);
    ++moe_.stats.gemm_layers;
    ++moe_.stats.compact_layers;
    return true;
}

// The compact pass's plan on the host (moe_.h_mplan): the padded row offsets, the active experts by padded
// rows (moe_.order), and six pointer arrays of them; false when the rows exceed the scratch.
bool CudaModel::compact_plan(int i, int* max_r_out) {
    const LayerWeights& lw = w_.layers[i];
    const int H = c_.hidden, E = c_.n_experts, Ie = c_.expert_width;
    void** hp = static_cast<void**>(moe_.h_mplan);
    int* roff = reinterpret_cast<int*>(hp + 6 * static_cast<size_t>(E));
    // a tensor-parallel rank holds experts [begin, begin + count): the others' entries get zeros here (the
    // ranks' sum adds the holder's rows)
    const ExpertRange held = held_experts();
    const int e_end = held.count < 0 ? E : held.begin + held.count;
    roff[0] = 0;
    int max_r = 0;
    moe_.order.clear();
    for (int e = 0; e < E; ++e) {
        const bool mine = e >= held.begin && e < e_end;
        const int r = mine ? padded_rows(moe_.h_goff[e + 1] - moe_.h_goff[e]) : 0;
        roff[e + 1] = roff[e] + r;
        max_r = std::max(max_r, r);
        if (r > 0) moe_.order.push_back(e);
    }
    if (roff[E] > moe_.compact_rows) return false;
    *max_r_out = max_r;
    std::stable_sort(moe_.order.begin(), moe_.order.end(),
                     [&](int a, int b) { return roff[a + 1] - roff[a] < roff[b + 1] - roff[b]; });
    // six arrays of the active experts, in that order: gate/up A, B, C, then down A, B, C
    const size_t na = moe_.order.size();
    bf16* xs = static_cast<bf16*>(moe_.mx);
    const int64_t gu_stride = 2 * int64_t{Ie} * H;
    for (size_t j = 0; j < na; ++j) {
        const int e = moe_.order[j];
        const int64_t row = 2 * int64_t{roff[e]};
        const int64_t w = e - held.begin;  // the expert's index among the held ones
        hp[j] = const_cast<bf16*>(lw.experts_gate_up + w * gu_stride);
        hp[na + j] = xs + row * H;
        hp[2 * na + j] = moe_.ey2 + row * 2 * Ie;
        hp[3 * na + j] = const_cast<bf16*>(lw.experts_down + w * H * Ie);
        hp[4 * na + j] = moe_.mh + row * Ie;
        hp[5 * na + j] = moe_.ey2 + row * H;
    }
    return true;
}

// The experts of one padded row count r, [b, end) of the order: one batched GEMM over stacked halves (2 r
// columns). (cublasGemmGroupedBatchedEx, all buckets in one call, returns NOT_SUPPORTED for bf16 inputs
// with fp32 outputs in this cuBLAS.) Over kMoeCompactStreams streams the buckets take turns, so that the
// small batches of large experts run beside others instead of alone on part of the SMs; each bucket
// writes its own experts' rows. which: 0 the gate/up GEMMs, 1 the down GEMMs.
void CudaModel::compact_buckets(int which, int N, int Kd, const int* roff) {
    const size_t na = moe_.order.size();
    void** dp = static_cast<void**>(moe_.d_mplan);
    const int ns = static_cast<int>(moe_.streams.size()) + 1;
    const float one = 1.0f, zero = 0.0f;
    void** a = dp + 3 * which * na;
    if (ns > 1) {
        CUDA_CHECK(cudaEventRecord(moe_.events[0], stream_));
        for (cudaStream_t st : moe_.streams) CUDA_CHECK(cudaStreamWaitEvent(st, moe_.events[0], 0));
    }
    int k = 0;
    for (size_t b = 0; b < na; ++k) {
        const int e0 = moe_.order[b], r = roff[e0 + 1] - roff[e0];
        size_t end = b + 1;
        while (end < na && roff[moe_.order[end] + 1] - roff[moe_.order[end]] == r) ++end;
        cublasHandle_t hb = k % ns == 0 ? blas_ : moe_.blas[k % ns - 1];
        CUBLAS_CHECK(cublasGemmBatchedEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, N, 2 * r, Kd, &one, a + b, CUDA_R_16BF,
                                         Kd, a + na + b, CUDA_R_16BF, Kd, &zero, a + 2 * na + b, CUDA_R_32F,
                                         N, static_cast<int>(end - b), CUBLAS_COMPUTE_32F,
                                         CUBLAS_GEMM_DEFAULT));
        if (which == 0) ++moe_.stats.buckets;
        b = end;
    }
    for (size_t j = 0; j + 1 < static_cast<size_t>(ns); ++j) {
        CUDA_CHECK(cudaEventRecord(moe_.events[j + 1], moe_.streams[j]));
        CUDA_CHECK(cudaStreamWaitEvent(stream_, moe_.events[j + 1], 0));
    }
}

}  // namespace markbase::cuda
