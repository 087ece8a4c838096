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
    const int H = c_.hidden, L = c_.n_layers;
    const int64_t V = c_.vocab_size;
    const float eps = c_.rms_eps;
    const int64_t pos0 = n_past;

    std::copy(ids, ids + n, st_.h_ids);
    st_.h_state[1] = static_cast<int>(pos0);
    CUDA_CHECK(cudaMemcpyAsync(st_.d_ids, st_.h_ids, n * sizeof(int), cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(
        cudaMemcpyAsync(st_.d_state + 1, st_.h_state + 1, sizeof(int), cudaMemcpyHostToDevice, stream_));

    Profiler* pf = prefill_pf_;  // profile_prefill: events around each phase
    embed_chunk(pf, n);
    for (int i = 0; i < L; ++i) prefill_layer(i, n, pos0);

    // logits of the last token (its argmax becomes the next token on the device)
    GemvInput in;
    in.x = act_.x + int64_t{n - 1} * H;
    in.K = H;
    in.norm = true;
    in.norm_w = w_.final_norm;
    in.eps = eps;
    run(pf, "lm_head", -1, 2.0 * V * H, [&] {
        gemv_logits(in, w_.embed, static_cast<int>(V), c_.final_softcap, act_.logits, st_.d_argmax, stream_,
                    nullptr, shard_.vocab_begin);
        all_reduce_argmax(nullptr);
    });
    if (logits && all_logits) {
        ensure_all_logits();
        split_rows(act_.x, H, H, n, true, w_.final_norm, eps, act_.hi, lo_at(n, H), stream_);
        gemm(w_.embed, static_cast<int>(V), H, n, act_.all_logits, V);
        if (c_.final_softcap > 0.0f)
            softcap_inplace(act_.all_logits, int64_t{n} * V, c_.final_softcap, stream_);
        logits_to_host(logits, act_.all_logits, n);
    } else if (logits) {
        logits_to_host(logits, act_.logits, 1);
    }
    finish_step(st_.d_argmax, st_.d_state, n, nullptr, 0, stream_);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    n_past += n;
}

// 2.2 and 2.3 for the chunk's n ids (st_.d_ids): x = the scaled embeddings (sharded: the owners' rows
// summed), and with PLE the per-layer inputs.
void CudaModel::embed_chunk(Profiler* pf, int n) {
    const int H = c_.hidden, P = c_.ple_dim, L = c_.n_layers;
    const int64_t LP = int64_t{L} * P, V = c_.vocab_size;
    const float eps = c_.rms_eps;
    x_split_ = {};  // a new x: no update's rows stand (also after a pass that threw while being recorded)
    run(pf, "embed", -1, 0.0, [&] {
        embed_rows(st_.d_ids, n, w_.embed, H, c_.embed_scale(), act_.x, st_.d_argmax, stream_,
                   shard_.vocab_begin, sharded() ? V : -1);
        all_reduce(nullptr, -1, act_.x, static_cast<size_t>(n) * H);
    });
    if (!P) return;
    run(pf, "ple_inputs", -1, 2.0 * LP * H, [&] {
        split_rows(act_.x, H, H, n, false, nullptr, eps, act_.hi, lo_at(n, H), stream_);
        gemm(w_.ple_model_proj, static_cast<int>(LP), H, n, act_.ple_ctx, LP);
        ple_mix(act_.ple_ctx, st_.d_ids, n, w_.ple_embed, w_.ple_proj_norm, L, P, H, eps, act_.ple, stream_);
    });
}

QkvPost CudaModel::qkv_post_args(int i) const {
    const LayerWeights& lw = w_.layers[i];
    const LayerSpec& s = c_.layers[i];
    QkvPost p;
    p.q = act_.q;
    p.kraw = s.has_own_kv() ? act_.k : nullptr;
    p.vraw = lw.v_proj ? act_.v : act_.k;  // k_eq_v: V is the raw k projection
    p.q_norm = lw.q_norm;
    p.k_norm = lw.k_norm;
    bind_cache(i, p);
    p.nH = c_.n_heads;
    p.nKV = s.n_kv_heads;
    p.d = s.head_dim;
    p.inv_freq = s.kind == AttentionKind::Sliding ? kv_.inv_sliding : kv_.inv_full;
    p.pos_base = st_.d_state + 1;
    p.eps = c_.rms_eps;
    return p;
}

// One layer over the chunk's n tokens at positions pos0.., as cpu/forward.cpp's layer: attention, the FFN
// (the MoE's routed experts beside the dense MLP), the per-layer input.
void CudaModel::prefill_layer(int i, int n, int64_t pos0) {
    prefill_attention(i, n, pos0);      // 2.5
    prefill_ffn(i, n);                  // FFN; 2.6 on the MoE
    if (c_.ple_dim) prefill_ple(i, n);  // 2.4
}

// 2.5: q, k, v from input_layernorm(x), q/k norms + RoPE + the cache write, attention, then x += o_proj's
// update.
void CudaModel::prefill_attention(int i, int n, int64_t pos0) {
    const LayerWeights& lw = w_.layers[i];
    const LayerSpec& s = c_.layers[i];
    const int H = c_.hidden, nH = c_.n_heads, d = s.head_dim, nKV = s.n_kv_heads;
    const int qw = nH * d, kvw = nKV * d;
    const float eps = c_.rms_eps;
    const bool own = s.has_own_kv(), sliding = s.kind == AttentionKind::Sliding;
    Profiler* pf = prefill_pf_;
    const double wb = 2.0 * H;  // bytes per weight row of H

    run(pf, "qkv", i, wb * (qw + (own ? kvw * (lw.v_proj ? 2 : 1) : 0)), [&] {
        split_x({true, true, lw.input_norm}, n);
        const LayerQuant& lq = layer_quant(w_, i);
        const GemvSeg segs[3] = {{lw.q_proj, act_.q, qw, qw, lq.q_proj},
                                 {lw.k_proj, act_.k, kvw, kvw, lq.k_proj},
                                 {lw.v_proj, act_.v, kvw, kvw, lq.v_proj}};
        gemm_many(segs, own ? (lw.v_proj ? 3 : 2) : 1, H, n);
    });
    const QkvPost p = qkv_post_args(i);
    run(pf, "qk_norm_rope", i, 0.0, [&] { qkv_post(p, n, stream_); });

    AttnArgs a;
    attention_args(i, a);
    // a mixed step's pieces are its leading one-id rows' (mixed_attention runs its chunks apart)
    const int nb = mixed_.on ? std::max(1, mixed_.decode_rows) : n;
    const int64_t top = mixed_.on ? mixed_.decode_range : pos0 + n;
    const int64_t range = sliding ? std::min<int64_t>(c_.sliding_window, top) : top;
    int64_t want = (range + 255) / 256;
    // batched decode, one query per sequence: shorter pieces (Tuning::batch_attn_keys), or the 256-key
    // pieces of a few sequences at a short range leave most SMs idle (E2B at 8 sequences: 37% of the step);
    // pieces of at most 32 keys where those would give the layer fewer than kMinPieceWarps per SM (the
    // H200, tensor-core pieces: 64 keys won at 768-position steps of 64-96 sequences, 1-4%, where a layer
    // has >= 5.8 pieces per SM; 32 won by 2-4% at 128 positions with 8-32 sequences, <= 1.5 per SM, and
    // tied at 11.6)
    if (batch_) {
        constexpr int64_t kMinPieceWarps = 4;
        int64_t keys = plan_.batch_attn_keys;
        if (int64_t{nb} * nKV * ((range + keys - 1) / keys) < kMinPieceWarps * plan_.sms)
            keys = std::min<int64_t>(keys, 32);
        want = std::max(want, (range + keys - 1) / keys);
    }
    const int64_t room = std::max<int64_t>(1, act_.max_pieces / (int64_t{nb} * nH));
    a.nsplit = static_cast<int>(std::clamp<int64_t>(want, 1, room));
    a.split_len = static_cast<int>((range + a.nsplit - 1) / a.nsplit);
    a.max_heads = plan_.batch_attn_heads;
    a.mma = plan_.batch_attn_mma;
    // a batched step's merge writes o_proj's input rows too (as the residual updates write theirs, split_for)
    const bool merged_rows = batch_;
    if (merged_rows) {
        a.out_hi = act_.hi;
        a.out_lo = lo_at(n, qw);
    }
    run(pf, "attention", i, 0.0, [&] {
        if (mixed_.on)
            mixed_attention(i, a, n);
        else if (batch_)
            attention(a, n, stream_);
        else
            attention_gemm(a, n, pos0, attn_gemm_, stream_);
    });

    run(pf, "o_proj", i, 2.0 * qw * H, [&] {
        if (!merged_rows)
            split_rows(act_.attn, qw, qw, n, false, nullptr, eps, act_.hi, lo_at(n, qw), stream_);
        gemm(lw.o_proj, H, qw, n, act_.o, H, 1.0f, layer_quant(w_, i).o_proj);
        all_reduce(nullptr, i, act_.o, static_cast<size_t>(n) * H);
        residual_add_norm(act_.x, act_.o, lw.post_attn_norm, H, n, eps, 1.0f, stream_, nullptr, nullptr, {},
                          split_for({true, true, lw.pre_ffn_norm}, n));  // the MLP's input
    });
}

// FFN: m = down(gelu(gate(xn)) * up(xn)), xn = pre_feedforward_layernorm(x), then x's update; the MoE
// combines m with its experts' weighted sum first. A batched step of at most stream_gemm_max (16) sequences
// whose experts run on the device (and is not profiled) forks them onto moe_.stream2 beside the dense MLP, as
// the decode graph does (record_ffn): both read x, which neither changes, and the combine joins them. The
// H200 (26B-A4B after 128 tokens, be5d937 against a0b7a3f): 8 sequences 9.25 -> 8.80 ms per step, 16 12.22
// -> 11.60; but beside the dense MLP's cuBLAS GEMMs (more than 16 rows) 32 went 16.10 -> 18.07 and 64 19.62
// -> 20.22, so those stay in one stream.
void CudaModel::prefill_ffn(int i, int n) {
    const LayerWeights& lw = w_.layers[i];
    const int H = c_.hidden, I = c_.layers[i].mlp_width;
    const float eps = c_.rms_eps;
    Profiler* pf = prefill_pf_;
    const double wb = 2.0 * H;  // bytes per weight row of H
    const bool fork = c_.moe && batch_ && batch_on_device(n) && n <= plan_.stream_gemm_max && !pf;
    if (fork) {
        CUDA_CHECK(cudaEventRecord(moe_.fork, stream_));
        CUDA_CHECK(cudaStreamWaitEvent(moe_.stream2, moe_.fork, 0));
        prefill_experts_of(i, n, moe_.stream2);
        CUDA_CHECK(cudaEventRecord(moe_.join, moe_.stream2));
    }

    run(pf, "mlp", i, 3.0 * wb * I, [&] {
        split_x({true, true, lw.pre_ffn_norm}, n);
        const LayerQuant& lq = layer_quant(w_, i);
        const GemvSeg segs[2] = {{lw.gate_proj, act_.g, I, I, lq.gate_proj},
                                 {lw.up_proj, act_.u, I, I, lq.up_proj}};
        gemm_many(segs, 2, H, n);
        geglu_split(act_.g, act_.u, I, I, n, act_.hi, lo_at(n, I), stream_);
        gemm(lw.down_proj, H, I, n, act_.m, H, 1.0f, lq.down_proj);
    });

    if (c_.moe) {
        if (fork)
            CUDA_CHECK(cudaStreamWaitEvent(stream_, moe_.join, 0));
        else
            prefill_experts_of(i, n, stream_);
        prefill_moe_combine(i, n);
    } else {
        run(pf, "ffn_residual", i, 0.0, [&] {
            all_reduce(nullptr, i, act_.m, static_cast<size_t>(n) * H);
            residual_add_norm(act_.x, act_.m, lw.post_ffn_norm, H, n, eps, ffn_scale(i), stream_, nullptr,
                              nullptr, {}, split_for(after_ffn(i), n));
        });
    }
}

// 2.6's experts on stream s: router logits (input norm per token), softmax / top-k / the experts' input norm,
// the entries bucketed by expert, the experts into moe_.eslots (a batched step's on the device: moe_stream;
// otherwise the host-planned passes, which run on stream_ only).
void CudaModel::prefill_experts_of(int i, int n, cudaStream_t s) {
    const LayerWeights& lw = w_.layers[i];
    const int H = c_.hidden, E = c_.n_experts, K = c_.top_k;
    const float eps = c_.rms_eps;
    Profiler* pf = prefill_pf_;
    const double wb = 2.0 * H;  // bytes per weight row of H
    const bool on_device = batch_ && batch_on_device(n);
    if (!on_device && s != stream_) throw Error("internal: the host-planned experts run on the main stream");

    GemvInput in;
    in.x = act_.x;
    in.K = H;
    in.ldx = H;
    in.norm = true;
    in.norm_w = lw.router_scale;
    in.norm_scale = 1.0f / std::sqrt(static_cast<float>(H));
    in.eps = eps;
    GemvSeg seg{lw.router_proj, moe_.rlogits, E, E};
    // The router logits of more tokens than stream_gemm takes (a prompt chunk, a batched step of 17 or more
    // sequences, which then runs on stream_) as a GEMM over the normed input's halves: the GEMV kernels, made
    // for a few tokens, took 87 us a layer at 512 tokens on the H200 (2.6 of a 26B-A4B prefill's 37.9 ms)
    // and 0.83 ms of a 96-sequence step.
    const bool as_gemm = n > plan_.stream_gemm_max;
    run(pf, "router", i, wb * E, [&] {
        if (as_gemm) {
            split_rows(act_.x, H, H, n, true, lw.router_scale, eps, act_.hi, lo_at(n, H), s);
            gemm(lw.router_proj, E, H, n, moe_.rlogits, E, in.norm_scale);
        } else {
            gemv(in, &seg, 1, n, s);
        }
    });
    run(pf, "route", i, 0.0, [&] {
        moe_route(moe_.rlogits, n, E, K, lw.per_expert_scale, moe_.sel_id, moe_.sel_w, false, moe_.gexp,
                  moe_.goff, moe_.gent, act_.x, lw.pre_ffn_norm_2, H, eps, moe_.e_in, s);
        moe_bucket(moe_.sel_id, n, E, K, moe_.gexp, moe_.goff, moe_.gent, s, held_experts());
    });
    run(pf, "experts", i, 0.0, [&] {
        if (on_device)
            batch_experts(i, n, s);
        else
            prefill_experts(i, n);
    });
}

// 2.6's end: x's update from the dense MLP's m and the experts' weighted sum.
void CudaModel::prefill_moe_combine(int i, int n) {
    const LayerWeights& lw = w_.layers[i];
    const float scale = ffn_scale(i);
    const int H = c_.hidden, K = c_.top_k;
    const float eps = c_.rms_eps;
    if (sharded()) {  // [n][H] dense partials, then [n][H] experts' partials: one sum over the ranks
        float* e = act_.m + int64_t{n} * H;
        moe_weighted_sum(moe_.eslots, moe_.sel_w, K, H, n, e, stream_);
        all_reduce(nullptr, i, act_.m, 2 * static_cast<size_t>(n) * H);
        residual_moe_combine(act_.x, act_.m, e, moe_.ones, 1, lw.post_ffn_norm_1, lw.post_ffn_norm_2,
                             lw.post_ffn_norm, H, n, eps, scale, stream_, false, nullptr, nullptr,
                             split_for(after_ffn(i), n));
    } else {
        run(prefill_pf_, "ffn_combine", i, 0.0, [&] {
            residual_moe_combine(act_.x, act_.m, moe_.eslots, moe_.sel_w, K, lw.post_ffn_norm_1,
                                 lw.post_ffn_norm_2, lw.post_ffn_norm, H, n, eps, scale, stream_, false,
                                 nullptr, nullptr, split_for(after_ffn(i), n));
        });
    }
}

// 2.4: x += post_per_layer_input_norm(proj(gelu(gate(x)) * PLE_i)), then * layer_scalar.
void CudaModel::prefill_ple(int i, int n) {
    const LayerWeights& lw = w_.layers[i];
    const int H = c_.hidden, P = c_.ple_dim;
    const int64_t LP = int64_t{c_.n_layers} * P;
    const float eps = c_.rms_eps;
    const double wb = 2.0 * H;  // bytes per weight row of H
    run(prefill_pf_, "ple", i, 2.0 * wb * P, [&] {
        split_x({true, false, nullptr}, n);
        gemm(lw.ple_gate, P, H, n, act_.g, P);
        geglu_split(act_.g, act_.ple + int64_t{i} * P, LP, P, n, act_.hi, lo_at(n, P), stream_);
        gemm(lw.ple_proj, H, P, n, act_.o, H);
        residual_add_norm(act_.x, act_.o, lw.ple_post_norm, H, n, eps, lw.layer_scalar, stream_, nullptr,
                          nullptr, {}, split_for(layer_input(i + 1), n));
    });
}

// x's input rows for the product that follows an update of n rows (prompt chunks, batched steps): the update
// writes them (RowSplit), and split_x then launches nothing: split_rows' values bit for bit, three or four
// launches a layer fewer (the H200, against split_rows launches in one call: E2B 96 sequences 5.318 -> 5.035
// ms a step, 32 4.124 -> 3.883, E4B 96 7.827 -> 7.519, 26B-A4B FP8 96 16.798 -> 16.383; E2B prefill of 512
// 52.3k -> 54.2k tok/s; the same ids). Each update names the split its next product takes (the same norm,
// the same rows), and nothing else writes act_.hi between the two, so the rows are split_rows' own.
RowSplit CudaModel::split_for(const XSplit& next, int n) {
    x_split_ = next;
    x_split_n_ = n;
    if (!x_split_.on) return {};
    return {next.norm, next.w, act_.hi, lo_at(n, c_.hidden)};
}

void CudaModel::split_x(const XSplit& want, int n) {
    const bool ready = x_split_.on && x_split_.norm == want.norm && x_split_.w == want.w && x_split_n_ == n;
    x_split_ = {};
    if (!ready)
        split_rows(act_.x, c_.hidden, c_.hidden, n, want.norm, want.w, c_.rms_eps, act_.hi,
                   lo_at(n, c_.hidden), stream_);
}

// After layer i's FFN update: the PLE's gate reads x as it is; else the next layer's q/k/v.
CudaModel::XSplit CudaModel::after_ffn(int i) const {
    return c_.ple_dim ? XSplit{true, false, nullptr} : layer_input(i + 1);
}

// Layer i's q/k/v input; past the last layer a batched step's lm_head (the prompt's takes one row's GEMV).
CudaModel::XSplit CudaModel::layer_input(int i) const {
    if (i < c_.n_layers) return {true, true, w_.layers[i].input_norm};
    return batch_ ? XSplit{true, true, w_.final_norm} : XSplit{};
}

// The prefill's GEMMs (and batched decode's): stream_gemm for a few tokens where it pays, else cuBLAS; the
// fp32 activations rounded to bf16 (hi), or as two bf16 halves (hi + lo, Tuning::gemm_inputs=halves).
// Where the dense projections' copy was not kept (--bf16-copy drop), each product first rewrites its rows as
// the copy's values into the scratch: the same products, 1 (FP8) or 0.5 (int4) + 2 more bytes a weight moved.
const bf16* CudaModel::bf16_weights(const bf16* w, const QuantMatrix& q, int rows, int K, bf16*& at) {
    if (w != kDroppedBf16) return w;
    const int64_t used = at - dw_->dequant_scratch, elems = int64_t{rows} * K;
    if (!q.q || !dw_->dequant_scratch || 2 * static_cast<uint64_t>(used + elems) > dw_->dequant_scratch_bytes)
        throw Error("internal: a product of " + std::to_string(rows) + " x " + std::to_string(K) +
                    " weights with neither their bf16 copy nor room to dequantise their rows");
    dequantize_rows(q.q, q.scale, q.zero, rows, K, dw_->quant_format == WeightFormat::kInt4, at, stream_);
    at += elems;
    return at - elems;
}

// stream_gemm and tile_gemm start loading their weights before the PDL wait (weights no kernel of a step
// writes): over the scratch, which the kernel before them wrote, the products are cuBLAS's.
void CudaModel::gemm(const bf16* W, int N, int K, int n, float* Y, int64_t ldy, float alpha,
                     const QuantMatrix& q) {
    bf16* at = dw_->dequant_scratch;
    const bool scratch = W == kDroppedBf16;
    W = bf16_weights(W, q, N, K, at);
    const GemvSeg seg{W, Y, N, ldy};
    if (alpha == 1.0f && !scratch && own_product(&seg, 1, K, n)) return;
    gemm_cublas(W, N, K, n, Y, ldy, alpha);
}

void CudaModel::gemm_cublas(const bf16* W, int N, int K, int n, float* Y, int64_t ldy, float alpha) {
    // Row-major Y[n][N] = X[n][K] W[N][K]^T is column-major Y^T = W^T(op) X^T.
    const float zero = 0.0f, one = 1.0f;
    const bool halves = !plan_.gemm_bf16;
    // the halves over at most kGemmStackMaxN rows: one pass over W, [hi; lo] as 2n columns, then the sum
    if (halves && n <= kGemmStackMaxN && N <= act_.y2_cols) {
        CUBLAS_CHECK(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, N, 2 * n, K, &alpha, W, CUDA_R_16BF, K,
                                  act_.hi, CUDA_R_16BF, K, &zero, act_.y2, CUDA_R_32F, N, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
        sum_halves(act_.y2, n, N, Y, ldy, stream_);
        return;
    }
    CUBLAS_CHECK(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, N, n, K, &alpha, W, CUDA_R_16BF, K, act_.hi,
                              CUDA_R_16BF, K, &zero, Y, CUDA_R_32F, static_cast<int>(ldy), CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
    if (halves)
        CUBLAS_CHECK(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, N, n, K, &alpha, W, CUDA_R_16BF, K,
                                  lo_at(n, K), CUDA_R_16BF, K, &one, Y, CUDA_R_32F, static_cast<int>(ldy),
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// These matrices of one input at n tokens through stream_gemm (up to stream_gemm_max tokens) or tile_gemm
// (the bf16 operand, up to tile_gemm_max) where the kernel takes them and beats cuBLAS (the kernel labs'
// rules); false where cuBLAS should run them. Both halves: stream_gemm also where cuBLAS would read a matrix
// twice (wider than the stacked scratch: lm_head).
bool CudaModel::own_product(const GemvSeg* segs, int nseg, int K, int n) {
    const bool one = plan_.gemm_bf16;
    int64_t bytes = 0;
    bool wide = false, stream_fits = true, tile_fits = true;
    for (int i = 0; i < nseg; ++i) {
        stream_fits = stream_fits && stream_gemm_fits(segs[i].rows, K, n);
        tile_fits = tile_fits && tile_gemm_fits(segs[i].rows, K, n);
        bytes += 2 * int64_t{segs[i].rows} * K;
        wide = wide || segs[i].rows > act_.y2_cols;
    }
    if (n <= plan_.stream_gemm_max && stream_fits &&
        ((!one && wide) || stream_gemm_pays(bytes, nseg, n, one))) {
        stream_gemm(segs, nseg, act_.hi, one ? nullptr : lo_at(n, K), n, K,
                    stream_gemm_shape(segs, nseg, K, n, plan_.sms), stream_);
        return true;
    }
    // Not beside the MoE's experts: a batched step of up to stream_gemm_max sequences runs them on a second
    // stream during the dense MLP (prefill_ffn), and tile_gemm's blocks (up to 114 KB of shared memory,
    // clusters of 8) took the SMs they stream on: the 26B-A4B's 8 sequences 8.93 -> 9.88 ms per step.
    const bool beside_experts = c_.moe && n <= plan_.stream_gemm_max;
    if (!one || beside_experts || n > plan_.tile_gemm_max || !tile_fits ||
        !tile_gemm_pays(bytes, nseg, n, plan_.sms, segs))
        return false;
    tile_gemm(segs, nseg, act_.hi, n, K, tile_gemm_shape(segs, nseg, K, n, plan_.sms), stream_);
    return true;
}

void CudaModel::gemm_many(const GemvSeg* segs, int nseg, int K, int n) {
    if (nseg > kStreamGemmMaxSegs)
        throw Error("internal: gemm_many of " + std::to_string(nseg) + " matrices");
    GemvSeg in[kStreamGemmMaxSegs];
    bf16* at = dw_->dequant_scratch;
    bool scratch = false;
    for (int i = 0; i < nseg; ++i) {
        scratch = scratch || segs[i].w == kDroppedBf16;
        in[i] = {bf16_weights(segs[i].w, segs[i].q, segs[i].rows, K, at), segs[i].y, segs[i].rows,
                 segs[i].ldy};
    }
    if (scratch) {  // (cuBLAS only: gemm's comment)
        for (int i = 0; i < nseg; ++i) gemm_cublas(in[i].w, in[i].rows, K, n, in[i].y, in[i].ldy, 1.0f);
        return;
    }
    if (own_product(in, nseg, K, n)) return;
    for (int i = 0; i < nseg; ++i) gemm(in[i].w, in[i].rows, K, n, in[i].y, in[i].ldy);
}

}  // namespace markbase::cuda
