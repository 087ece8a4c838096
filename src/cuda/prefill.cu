// Batched prefill: the prompt chunk goes through every layer at once. Projections are cuBLAS GEMMs with bf16
// weights and fp32 accumulation; the fp32 activations enter them as two bf16 halves (hi + lo), which keeps
// the result within ~2^-16 of an fp32 product, so prefill and the fp32 decode path compute the same function.
// Attention runs as GEMMs (attention_gemm.cu); batched decode, which runs these layers over one token of each
// sequence, takes the decode pieces. Norms, routing and the experts reuse the decode kernels with n tokens.
#include <algorithm>
#include <cmath>

#include "cuda/model.h"
#include "loading/memory_plan.h"

namespace markbase::cuda {

void CudaModel::prefill(const int* ids, int n, float* logits, bool all_logits) {
    if (n <= 0) return;
    if (n > chunk_)
        throw Error("internal: prefill of " + std::to_string(n) + " tokens exceeds the chunk size");
    if (n_past + n > ctx_)
        throw Error("context full: " + std::to_string(n_past + n) + " tokens do not fit in the context of " +
                    std::to_string(ctx_) + " (raise --ctx-size)");
    const int H = c_.hidden, P = c_.ple_dim, L = c_.n_layers;
    const int64_t LP = int64_t{L} * P, V = c_.vocab_size;
    const float eps = c_.rms_eps;
    const int64_t pos0 = n_past;

    std::copy(ids, ids + n, h_ids_);
    h_state_[1] = static_cast<int>(pos0);
    CUDA_CHECK(cudaMemcpyAsync(d_ids_, h_ids_, n * sizeof(int), cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaMemcpyAsync(d_state_ + 1, h_state_ + 1, sizeof(int), cudaMemcpyHostToDevice, stream_));

    Profiler* pf = prefill_pf_;  // profile_prefill: events around each phase
    run(pf, "embed", -1, 0.0, [&] {
        embed_rows(d_ids_, n, w_.embed, H, c_.embed_scale(), x_, d_argmax_, stream_, shard_.vocab_begin,
                   sharded() ? V : -1);
        all_reduce(nullptr, -1, x_, static_cast<size_t>(n) * H);
    });
    if (P) {
        run(pf, "ple_inputs", -1, 2.0 * LP * H, [&] {
            split_rows(x_, H, H, n, false, nullptr, eps, hi_, lo_at(n, H), stream_);
            gemm(w_.ple_model_proj, static_cast<int>(LP), H, n, ple_ctx_, LP);
            ple_mix(ple_ctx_, d_ids_, n, w_.ple_embed, w_.ple_proj_norm, L, P, H, eps, ple_, stream_);
        });
    }
    for (int i = 0; i < L; ++i) prefill_layer(i, n, pos0);

    // logits of the last token (its argmax becomes the next token on the device)
    GemvInput in;
    in.x = x_ + int64_t{n - 1} * H;
    in.K = H;
    in.norm = true;
    in.norm_w = w_.final_norm;
    in.eps = eps;
    run(pf, "lm_head", -1, 2.0 * V * H, [&] {
        gemv_logits(in, w_.embed, static_cast<int>(V), c_.final_softcap, logits_, d_argmax_, stream_, nullptr,
                    shard_.vocab_begin);
        all_reduce_argmax(nullptr);
    });
    if (logits && all_logits) {
        if (!all_logits_) all_logits_ = alloc<float>(static_cast<size_t>(chunk_) * V);
        split_rows(x_, H, H, n, true, w_.final_norm, eps, hi_, lo_at(n, H), stream_);
        gemm(w_.embed, static_cast<int>(V), H, n, all_logits_, V);
        if (c_.final_softcap > 0.0f) softcap_inplace(all_logits_, int64_t{n} * V, c_.final_softcap, stream_);
        logits_to_host(logits, all_logits_, n);
    } else if (logits) {
        logits_to_host(logits, logits_, 1);
    }
    finish_step(d_argmax_, d_state_, n, nullptr, 0, stream_);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    n_past += n;
}

QkvPost CudaModel::qkv_post_args(int i) const {
    const LayerWeights& lw = w_.layers[i];
    const LayerSpec& s = c_.layers[i];
    QkvPost p;
    p.q = q_;
    p.kraw = s.has_own_kv() ? k_ : nullptr;
    p.vraw = lw.v_proj ? v_ : k_;  // k_eq_v: V is the raw k projection
    p.q_norm = lw.q_norm;
    p.k_norm = lw.k_norm;
    bind_cache(i, p);
    p.nH = c_.n_heads;
    p.nKV = s.n_kv_heads;
    p.d = s.head_dim;
    p.inv_freq = s.kind == AttentionKind::Sliding ? inv_sliding_ : inv_full_;
    p.pos_base = d_state_ + 1;
    p.eps = c_.rms_eps;
    return p;
}

void CudaModel::prefill_layer(int i, int n, int64_t pos0) {
    const LayerWeights& lw = w_.layers[i];
    const LayerSpec& s = c_.layers[i];
    const int H = c_.hidden, nH = c_.n_heads, d = s.head_dim, nKV = s.n_kv_heads, I = s.mlp_width;
    const int qw = nH * d, kvw = nKV * d;
    const float eps = c_.rms_eps;
    const bool own = s.has_own_kv(), sliding = s.kind == AttentionKind::Sliding;

    Profiler* pf = prefill_pf_;
    const double wb = 2.0 * H;  // bytes per weight row of H

    // 2.5 attention
    run(pf, "qkv", i, wb * (qw + (own ? kvw * (lw.v_proj ? 2 : 1) : 0)), [&] {
        split_rows(x_, H, H, n, true, lw.input_norm, eps, hi_, lo_at(n, H), stream_);
        gemm(lw.q_proj, qw, H, n, q_, qw);
        if (own) {
            gemm(lw.k_proj, kvw, H, n, k_, kvw);
            if (lw.v_proj) gemm(lw.v_proj, kvw, H, n, v_, kvw);
        }
    });
    const QkvPost p = qkv_post_args(i);
    run(pf, "qk_norm_rope", i, 0.0, [&] { qkv_post(p, n, stream_); });

    AttnArgs a;
    attention_args(i, a);
    const int64_t range = sliding ? std::min<int64_t>(c_.sliding_window, pos0 + n) : pos0 + n;
    const int64_t want = (range + 255) / 256;
    const int64_t room = std::max<int64_t>(1, max_pieces_ / (int64_t{n} * nH));
    a.nsplit = static_cast<int>(std::clamp<int64_t>(want, 1, room));
    a.split_len = static_cast<int>((range + a.nsplit - 1) / a.nsplit);
    run(pf, "attention", i, 0.0, [&] {
        if (batch_)
            attention(a, n, stream_);
        else
            attention_gemm(a, n, pos0, attn_gemm_, stream_);
    });

    run(pf, "o_proj", i, 2.0 * qw * H, [&] {
        split_rows(attn_, qw, qw, n, false, nullptr, eps, hi_, lo_at(n, qw), stream_);
        gemm(lw.o_proj, H, qw, n, o_, H);
        all_reduce(nullptr, i, o_, static_cast<size_t>(n) * H);
        residual_add_norm(x_, o_, lw.post_attn_norm, H, n, eps, 1.0f, stream_);
    });

    // FFN
    const float ffn_scale = c_.ple_dim ? 1.0f : lw.layer_scalar;
    run(pf, "mlp", i, 3.0 * wb * I, [&] {
        split_rows(x_, H, H, n, true, lw.pre_ffn_norm, eps, hi_, lo_at(n, H), stream_);
        gemm(lw.gate_proj, I, H, n, g_, I);
        gemm(lw.up_proj, I, H, n, u_, I);
        geglu_split(g_, u_, I, I, n, hi_, lo_at(n, I), stream_);
        gemm(lw.down_proj, H, I, n, m_, H);
    });

    if (c_.moe) {
        const int E = c_.n_experts, K = c_.top_k;
        GemvInput in;
        in.x = x_;
        in.K = H;
        in.ldx = H;
        in.norm = true;
        in.norm_w = lw.router_scale;
        in.norm_scale = 1.0f / std::sqrt(static_cast<float>(H));
        in.eps = eps;
        GemvSeg seg{lw.router_proj, rlogits_, E, E};
        run(pf, "router", i, wb * E, [&] { gemv(in, &seg, 1, n, stream_); });
        run(pf, "route", i, 0.0, [&] {
            moe_route(rlogits_, n, E, K, lw.per_expert_scale, sel_id_, sel_w_, false, gexp_, goff_, gent_, x_,
                      lw.pre_ffn_norm_2, H, eps, e_in_, stream_);
            moe_bucket(sel_id_, n, E, K, gexp_, goff_, gent_, stream_, held_experts());
        });
        run(pf, "experts", i, 0.0, [&] { prefill_experts(i, n); });
        if (sharded()) {  // [n][H] dense partials, then [n][H] experts' partials: one sum over the ranks
            float* e = m_ + int64_t{n} * H;
            moe_weighted_sum(eslots_, sel_w_, K, H, n, e, stream_);
            all_reduce(nullptr, i, m_, 2 * static_cast<size_t>(n) * H);
            residual_moe_combine(x_, m_, e, d_ones_, 1, lw.post_ffn_norm_1, lw.post_ffn_norm_2,
                                 lw.post_ffn_norm, H, n, eps, ffn_scale, stream_);
        } else {
            run(pf, "ffn_combine", i, 0.0, [&] {
                residual_moe_combine(x_, m_, eslots_, sel_w_, K, lw.post_ffn_norm_1, lw.post_ffn_norm_2,
                                     lw.post_ffn_norm, H, n, eps, ffn_scale, stream_);
            });
        }
    } else {
        run(pf, "ffn_residual", i, 0.0, [&] {
            all_reduce(nullptr, i, m_, static_cast<size_t>(n) * H);
            residual_add_norm(x_, m_, lw.post_ffn_norm, H, n, eps, ffn_scale, stream_);
        });
    }

    if (c_.ple_dim) {
        const int P = c_.ple_dim;
        const int64_t LP = int64_t{c_.n_layers} * P;
        run(pf, "ple", i, 2.0 * wb * P, [&] {
            split_rows(x_, H, H, n, false, nullptr, eps, hi_, lo_at(n, H), stream_);
            gemm(lw.ple_gate, P, H, n, g_, P);
            geglu_split(g_, ple_ + int64_t{i} * P, LP, P, n, hi_, lo_at(n, P), stream_);
            gemm(lw.ple_proj, H, P, n, o_, H);
            residual_add_norm(x_, o_, lw.ple_post_norm, H, n, eps, lw.layer_scalar, stream_);
        });
    }
}

void CudaModel::prefill_experts(int i, int n) {
    const LayerWeights& lw = w_.layers[i];
    const int H = c_.hidden, E = c_.n_experts, K = c_.top_k, Ie = c_.expert_width;
    // the busiest expert sizes the batch: one small copy and a sync per MoE layer
    CUDA_CHECK(cudaMemcpyAsync(h_goff_, goff_, (E + 1) * sizeof(int), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    int max_n = 0;
    for (int e = 0; e < E; ++e) max_n = std::max(max_n, h_goff_[e + 1] - h_goff_[e]);
    moe_stats_.busiest = std::max(moe_stats_.busiest, max_n);
    if (max_n > 0 && prefill_experts_compact(i)) return;
    // (a rank holds some of the experts: the passes' batched GEMMs would stream every expert, so a rank whose
    // layer does not fit the compact pass runs the grouped GEMV kernels)
    if (max_n == 0 || sharded()) {
        moe_gate_up(e_in_, H, lw.experts_gate_up, Ie, K, gexp_, goff_, gent_, E, eh_, stream_);
        moe_down(eh_, Ie, lw.experts_down, H, gexp_, goff_, gent_, E, eslots_, stream_);
        ++moe_stats_.gemv_layers;
        return;
    }
    // Every expert's weights are read once per pass (tensor cores), instead of once per 4 of its tokens. A
    // pass takes up to moe_cap_ entries of every expert (the scratch); the busiest expert sets the number of
    // passes (random-weight models route unevenly, so a layer used to fall back to the GEMV kernels whenever
    // its busiest expert exceeded the scratch).
    ++moe_stats_.gemm_layers;
    moe_stats_.cap = moe_cap_;
    for (int first = 0; first < max_n; first += moe_cap_) {
        const int m = std::min(moe_cap_, max_n - first);
        ++moe_stats_.passes;
        const int64_t rows = int64_t{E} * m;
        const int64_t gu_stride = 2 * int64_t{Ie} * H;  // [E][gate Ie | up Ie][H]
        if (m <= kGemmStackMaxN) {
            // each expert's weights read once: its [hi; lo] rows stacked; gate and up as one GEMM
            bf16* x = static_cast<bf16*>(mx_);
            moe_gather_split(e_in_, H, K, gent_, goff_, E, first, m, x, x + int64_t{m} * H, stream_,
                             2 * int64_t{m} * H);
            gemm_batched_stacked(lw.experts_gate_up, gu_stride, 2 * Ie, H, E, m, x, ey2_);
            moe_geglu_halves(ey2_, E, m, Ie, mh_, stream_);
            gemm_batched_stacked(lw.experts_down, int64_t{H} * Ie, H, Ie, E, m, mh_, ey2_);
            moe_scatter_rows(ey2_, H, gent_, goff_, E, first, m, eslots_, stream_, true);
            continue;
        }
        bf16* x_hi = static_cast<bf16*>(mx_);
        bf16* x_lo = x_hi + rows * H;
        moe_gather_split(e_in_, H, K, gent_, goff_, E, first, m, x_hi, x_lo, stream_);
        gemm_batched(lw.experts_gate_up, gu_stride, Ie, H, E, m, x_hi, x_lo, mg_);
        gemm_batched(lw.experts_gate_up + int64_t{Ie} * H, gu_stride, Ie, H, E, m, x_hi, x_lo, mu_);
        bf16* h_hi = mh_;
        bf16* h_lo = mh_ + rows * Ie;
        geglu_split(mg_, mu_, Ie, Ie, static_cast<int>(rows), h_hi, h_lo, stream_);
        float* y = static_cast<float*>(mx_);  // the gathered inputs are consumed: reuse their bytes
        gemm_batched(lw.experts_down, int64_t{H} * Ie, H, Ie, E, m, h_hi, h_lo, y);
        moe_scatter_rows(y, H, gent_, goff_, E, first, m, eslots_, stream_);
    }
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
    const LayerWeights& lw = w_.layers[i];
    const int H = c_.hidden, E = c_.n_experts, K = c_.top_k, Ie = c_.expert_width;
    void** hp = static_cast<void**>(h_mplan_);
    int* roff = reinterpret_cast<int*>(hp + 6 * static_cast<size_t>(E));
    // a tensor-parallel rank holds experts [begin, begin + count): the others' entries get zeros here (the
    // ranks' sum adds the holder's rows)
    const ExpertRange held = held_experts();
    const int e_end = held.count < 0 ? E : held.begin + held.count;
    roff[0] = 0;
    int max_r = 0;
    moe_order_.clear();
    for (int e = 0; e < E; ++e) {
        const bool mine = e >= held.begin && e < e_end;
        const int r = mine ? padded_rows(h_goff_[e + 1] - h_goff_[e]) : 0;
        roff[e + 1] = roff[e] + r;
        max_r = std::max(max_r, r);
        if (r > 0) moe_order_.push_back(e);
    }
    if (roff[E] > moe_compact_rows_) return false;
    std::stable_sort(moe_order_.begin(), moe_order_.end(),
                     [&](int a, int b) { return roff[a + 1] - roff[a] < roff[b + 1] - roff[b]; });
    // six arrays of the active experts, in that order: gate/up A, B, C, then down A, B, C
    const size_t na = moe_order_.size();
    bf16* xs = static_cast<bf16*>(mx_);
    const int64_t gu_stride = 2 * int64_t{Ie} * H;
    for (size_t j = 0; j < na; ++j) {
        const int e = moe_order_[j];
        const int64_t row = 2 * int64_t{roff[e]};
        const int64_t w = e - held.begin;  // the expert's index among the held ones
        hp[j] = const_cast<bf16*>(lw.experts_gate_up + w * gu_stride);
        hp[na + j] = xs + row * H;
        hp[2 * na + j] = ey2_ + row * 2 * Ie;
        hp[3 * na + j] = const_cast<bf16*>(lw.experts_down + w * H * Ie);
        hp[4 * na + j] = mh_ + row * Ie;
        hp[5 * na + j] = ey2_ + row * H;
    }
    void** dp = static_cast<void**>(d_mplan_);
    const int* d_roff = reinterpret_cast<const int*>(dp + 6 * static_cast<size_t>(E));
    CUDA_CHECK(cudaMemcpyAsync(d_mplan_, h_mplan_, 6 * E * sizeof(void*) + (E + 1) * sizeof(int),
                               cudaMemcpyHostToDevice, stream_));
    moe_gather_compact(e_in_, H, K, gent_, goff_, d_roff, E, max_r, xs, stream_);
    // the experts of one padded row count r, [b, end) of the order: one batched GEMM over stacked halves (2 r
    // columns). (cublasGemmGroupedBatchedEx, all buckets in one call, returns NOT_SUPPORTED for bf16 inputs
    // with fp32 outputs in this cuBLAS.) Over kMoeCompactStreams streams the buckets take turns, so that the
    // small batches of large experts run beside others instead of alone on part of the SMs; each bucket
    // writes its own experts' rows.
    const int ns = static_cast<int>(moe_streams_.size()) + 1;
    auto buckets = [&](int which, int N, int Kd) {
        const float one = 1.0f, zero = 0.0f;
        void** a = dp + 3 * which * na;
        if (ns > 1) {
            CUDA_CHECK(cudaEventRecord(moe_events_[0], stream_));
            for (cudaStream_t st : moe_streams_) CUDA_CHECK(cudaStreamWaitEvent(st, moe_events_[0], 0));
        }
        int k = 0;
        for (size_t b = 0; b < na; ++k) {
            const int e0 = moe_order_[b], r = roff[e0 + 1] - roff[e0];
            size_t end = b + 1;
            while (end < na && roff[moe_order_[end] + 1] - roff[moe_order_[end]] == r) ++end;
            cublasHandle_t hb = k % ns == 0 ? blas_ : moe_blas_[k % ns - 1];
            CUBLAS_CHECK(cublasGemmBatchedEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, N, 2 * r, Kd, &one, a + b,
                                             CUDA_R_16BF, Kd, a + na + b, CUDA_R_16BF, Kd, &zero,
                                             a + 2 * na + b, CUDA_R_32F, N, static_cast<int>(end - b),
                                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            if (which == 0) ++moe_stats_.buckets;
            b = end;
        }
        for (size_t j = 0; j + 1 < static_cast<size_t>(ns); ++j) {
            CUDA_CHECK(cudaEventRecord(moe_events_[j + 1], moe_streams_[j]));
            CUDA_CHECK(cudaStreamWaitEvent(stream_, moe_events_[j + 1], 0));
        }
    };
    buckets(0, 2 * Ie, H);
    moe_geglu_compact(ey2_, d_roff, E, max_r, Ie, mh_, stream_);
    buckets(1, H, Ie);
    if (e_end - held.begin < E)
        CUDA_CHECK(cudaMemsetAsync(eslots_, 0, static_cast<size_t>(h_goff_[E]) * H * sizeof(float), stream_));
    moe_scatter_compact(ey2_, H, gent_, goff_, d_roff, E, max_r, eslots_, stream_);
    ++moe_stats_.gemm_layers;
    ++moe_stats_.compact_layers;
    return true;
}

}  // namespace markbase::cuda
