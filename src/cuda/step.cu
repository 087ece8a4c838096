// The decode step (one token), as cpu/forward.cpp computes it, launched kernel by kernel on one stream.
// Nothing here reads host state that changes between tokens: the token id and its position are read by the
// kernels from st_.d_state, so the same launches captured once as a CUDA graph serve every step. With a
// Profiler each launch is bracketed by events instead (the profile mode). The attention pieces are merged by
// the last piece of each head and sampling runs in lm_head's last block; the sandwich-norm residual updates
// run as one-block launches (1024 threads, loads batched) after the GEMV that produces them, launched by
// their consumer on the dense models (plan_.prenorm). (As the producing GEMV's last-block tail, every block
// fencing and taking a ticket, they cost the 31B +10.9%, E4B +11.4%, E2B +5.7%, the 26B-A4B +0.9%; as a
// prologue redone by every block of the next GEMV, +27..+42%.)
#include <cmath>

#include "cuda/model.h"

namespace markbase::cuda {

namespace {
// The bytes a product reads: bf16, or the quantised form's (its scales aside).
double step_wbytes(int64_t rows, int64_t cols, WeightFormat f = WeightFormat::kBf16) {
    const double per = f == WeightFormat::kInt4 ? 0.5 : f == WeightFormat::kFp8 ? 1.0 : 2.0;
    return per * static_cast<double>(rows) * static_cast<double>(cols);
}
}  // namespace

// A product's segment: its quantised form where the model has one.
GemvSeg CudaModel::seg_of(const bf16* w, const QuantMatrix& q, float* y, int rows) const {
    GemvSeg s{w, y, rows, 0};
    if (q.q) {
        s.w = nullptr;
        s.q = q;
        s.format = dw_->quant_format;
    }
    return s;
}

// The format a product reads m in.
WeightFormat CudaModel::format_of(const QuantMatrix& m) const {
    return m.q ? dw_->quant_format : WeightFormat::kBf16;
}

// The GEMV settings of this model (the kernel and the warp-per-row rules), for an input of width K.
GemvInput CudaModel::gemv_input(const float* x, int K) const {
    GemvInput in;
    in.kernel = plan_.gemv_kernel;
    in.stream = plan_.gemv_stream;
    in.geglu_split = plan_.geglu_split;
    in.min_waves = plan_.min_waves;
    in.fp8_long_buffers = plan_.fp8_long_buffers;
    in.x = x;
    in.K = K;
    return in;
}

GemvInput CudaModel::x_input(Profiler* pf, int layer, bool norm, const bf16* norm_w) {
    // act_.xn already holds RMSNorm(x) * norm_w (written by the update that made this x)
    if (norm && norm_w && norm_w == xn_for_ && !pending_.y) return gemv_input(act_.xn, c_.hidden);
    if (pending_.y) {  // a deferred update: its own launch, writing this GEMV's normalised input too
        const PendingResidual p = pending_;
        pending_ = {};
        const bool pre = norm && norm_w;
        xn_for_ = pre ? norm_w : nullptr;
        run(pf, p.name, layer, 0.0, [&] {
            residual_add_norm(act_.x, p.y, p.w, c_.hidden, 1, c_.rms_eps, p.scale, stream_,
                              pre ? norm_w : nullptr, pre ? act_.xn : nullptr);
        });
        if (pre) {
            GemvInput in = gemv_input(act_.xn, c_.hidden);
            in.eps = c_.rms_eps;
            return in;
        }
    }
    GemvInput in = gemv_input(act_.x, c_.hidden);
    in.eps = c_.rms_eps;
    in.norm = norm;
    in.norm_w = norm_w;
    return in;
}

void CudaModel::residual(Profiler* pf, const char* name, int layer, const float* y, const bf16* w,
                         float scale, const bf16* next_w) {
    if (plan_.prenorm && !c_.moe) {  // deferred to its consumer (the MoE's overlap wants none pending)
        pending_ = {y, w, scale, name};
        return;
    }
    // launched now (the MoE model, whose expert fork wants nothing pending): with plan_.prenorm, it also
    // writes the normalised input of the GEMV named by next_w (the 26B's dense MLP after o_proj)
    const bool pre = plan_.prenorm && next_w;
    // the MoE's post-attention update (whose consumer is the dense MLP): with plan_.moe_prenorm, also the
    // router's and the experts' inputs, which the router GEMV and route would otherwise normalise themselves
    NormCopies more;
    if (pre && plan_.moe_prenorm && layer >= 0 && next_w == w_.layers[layer].pre_ffn_norm) {
        const LayerWeights& lw = w_.layers[layer];
        more.w[0] = lw.router_scale;
        more.out[0] = act_.xr;
        more.scale[0] = 1.0f / std::sqrt(static_cast<float>(c_.hidden));
        more.w[1] = lw.pre_ffn_norm_2;
        more.out[1] = moe_.e_in;
    }
    run(pf, name, layer, 0.0, [&] {
        residual_add_norm(act_.x, y, w, c_.hidden, 1, c_.rms_eps, scale, stream_, pre ? next_w : nullptr,
                          pre ? act_.xn : nullptr, more);
    });
    xn_for_ = pre ? next_w : nullptr;
}

void CudaModel::project_residual(Profiler* pf, const char* name, const char* res_name, int layer,
                                 const bf16* W, const QuantMatrix& W8, int rows, const float* xin, int K,
                                 float* y, const bf16* res_w, float scale, bool reduce, const bf16* next_w) {
    const GemvInput in = gemv_input(xin, K);
    const GemvSeg seg = seg_of(W, W8, y, rows);
    const double bytes = step_wbytes(rows, K, format_of(W8));
    if (!res_w) {  // a plain product
        run(pf, name, layer, bytes, [&] { gemv(in, &seg, 1, 1, stream_); });
        return;
    }
    if (reduce && sharded()) {  // the ranks' partial sums first, then the update
        flush_residual(pf, layer);
        xn_for_ = nullptr;
        run(pf, name, layer, bytes, [&] { gemv(in, &seg, 1, 1, stream_); });
        if (peer_ready(static_cast<size_t>(rows))) {  // the sum and the update in one kernel
            const ResidualTail t{act_.x, res_w, scale, c_.rms_eps};
            run(pf, res_name, layer, 0.0, [&] { peer_sum(ps_, y, rows, &t, stream_); });
            return;
        }
        all_reduce(pf, layer, y, static_cast<size_t>(rows));
        run(pf, res_name, layer, 0.0,
            [&] { residual_add_norm(act_.x, y, res_w, c_.hidden, 1, c_.rms_eps, scale, stream_); });
        return;
    }
    run(pf, name, layer, bytes, [&] { gemv(in, &seg, 1, 1, stream_); });
    residual(pf, res_name, layer, y, res_w, scale, next_w);
}

// For kernels that read x directly rather than through a GEMV input.
void CudaModel::flush_residual(Profiler* pf, int layer) {
    if (!pending_.y) return;
    const PendingResidual p = pending_;
    pending_ = {};
    xn_for_ = nullptr;
    run(pf, p.name, layer, 0.0,
        [&] { residual_add_norm(act_.x, p.y, p.w, c_.hidden, 1, c_.rms_eps, p.scale, stream_); });
}

void CudaModel::record_step(Profiler* pf) {
    const int H = c_.hidden, P = c_.ple_dim, L = c_.n_layers;
    const int64_t LP = int64_t{L} * P, V = c_.vocab_size;
    const float eps = c_.rms_eps;
    const int* tok = st_.d_state;
    pending_ = {};
    xn_for_ = nullptr;
    struct DecodeScope {  // in_decode_ while this step is recorded, also when it throws
        bool& flag;
        explicit DecodeScope(bool& f) : flag(f) { flag = true; }
        ~DecodeScope() { flag = false; }
    } scope(in_decode_);

    // 2.2: x = embed[tok] * bf16(sqrt(H)); also clears the argmax for this step
    run(pf, "embed", -1, 2.0 * H, [&] {
        embed_rows(tok, 1, w_.embed, H, c_.embed_scale(), act_.x, st_.d_argmax, stream_, shard_.vocab_begin,
                   sharded() ? V : -1);
    });
    all_reduce(pf, -1, act_.x, static_cast<size_t>(H));  // sharded: the owner's row, zeros from the others

    // 2.3: per-layer inputs from the scaled embedding
    if (P) {
        run(pf, "ple_model_proj", -1, step_wbytes(LP, H), [&] {
            GemvInput in = gemv_input(act_.x, H);
            GemvSeg seg{w_.ple_model_proj, act_.ple_ctx, static_cast<int>(LP), 0};
            gemv(in, &seg, 1, 1, stream_);
        });
        run(pf, "ple_mix", -1, 2.0 * LP, [&] {
            ple_mix(act_.ple_ctx, tok, 1, w_.ple_embed, w_.ple_proj_norm, L, P, H, eps, act_.ple, stream_);
        });
    }

    for (int i = 0; i < L; ++i) record_layer(i, pf);

    // 2.7: logits = softcap(norm(x) @ embed^T), argmax folded in, then the next token
    const GemvInput in = x_input(pf, -1, true, w_.final_norm);
    StepFinish fin;
    fin.state = st_.d_state;
    fin.advance = 1;
    fin.out_ids = st_.d_out_ids;
    fin.out_cap = static_cast<int>(ctx_);
    fin.counter = st_.d_counter;
    // sharded: each rank scores its vocabulary rows; the largest key over the ranks is the token
    const bool fused_finish = !sharded();
    run(pf, "lm_head", -1, step_wbytes(V, H), [&] {
        gemv_logits(in, w_.embed, static_cast<int>(V), c_.final_softcap, act_.logits, st_.d_argmax, stream_,
                    fused_finish ? &fin : nullptr, shard_.vocab_begin);
    });
    all_reduce_argmax(pf);
    if (!fused_finish)
        run(pf, "sample", -1, 0.0, [&] {
            finish_step(st_.d_argmax, st_.d_state, 1, st_.d_out_ids, static_cast<int>(ctx_), stream_);
        });
}

// One layer at one token, as cpu/forward.cpp's layer: attention, the FFN (the MoE's routed experts beside
// the dense MLP, then their combine), the per-layer input.
void CudaModel::record_layer(int i, Profiler* pf) {
    record_attention(i, pf);  // 2.5
    const bool overlap = record_ffn(i, pf);
    if (c_.moe) record_moe_combine(i, pf, overlap);  // 2.6
    if (c_.ple_dim) record_ple(i, pf);               // 2.4
}

// 2.5: q (and own k, v) from input_layernorm(x) in one launch, q/k norms + RoPE + the cache write, the
// attention pieces (merged by each head's last piece, or inside a cluster on the short-range graph), then
// o_proj and its residual update.
void CudaModel::record_attention(int i, Profiler* pf) {
    const LayerWeights& lw = w_.layers[i];
    const LayerQuant& lq = layer_quant(w_, i);
    const LayerSpec& s = c_.layers[i];
    const int H = c_.hidden, nH = c_.n_heads, d = s.head_dim, nKV = s.n_kv_heads;
    const int qw = nH * d, kvw = nKV * d;
    const bool own = s.has_own_kv();
    {
        const GemvInput in = x_input(pf, i, true, lw.input_norm);
        run(pf, "qkv", i, step_wbytes(qw + (own ? kvw * (lw.v_proj ? 2 : 1) : 0), H, format_of(lq.q_proj)),
            [&] {
                GemvSeg segs[3];
                int ns = 0;
                // one launch reads one format: quantised only where all of q, k, v are
                const bool all_quant = lq.q_proj.q && (!own || (lq.k_proj.q && (!lw.v_proj || lq.v_proj.q)));
                const QuantMatrix none{};
                segs[ns++] = seg_of(lw.q_proj, all_quant ? lq.q_proj : none, act_.q, qw);
                if (own) {
                    segs[ns++] = seg_of(lw.k_proj, all_quant ? lq.k_proj : none, act_.k, kvw);
                    if (lw.v_proj) segs[ns++] = seg_of(lw.v_proj, all_quant ? lq.v_proj : none, act_.v, kvw);
                }
                gemv(in, segs, ns, 1, stream_);
            });
    }
    run(pf, "qk_norm_rope", i, 0.0, [&] {
        const QkvPost p = qkv_post_args(i);
        qkv_post(p, 1, stream_);
    });
    AttnArgs a;
    attention_args(i, a);
    if (record_attention_mma(i, a, pf)) {
        project_residual(pf, "o_proj", "post_attn_norm", i, lw.o_proj, lq.o_proj, H, act_.attn, qw, act_.o,
                         lw.post_attn_norm, 1.0f, true, lw.pre_ffn_norm);
        return;
    }
    a.nsplit = plan_.decode_splits[i];
    a.split_len = 0;  // an even share of the current range per piece
    a.min_split = kAttnMinKeys;
    a.merge_counters = st_.d_attn_counters;  // the last piece of each head merges
    // the short-range graph (Tuning::attn_cluster): at most 16 pieces, one cluster per head, merged
    // through distributed shared memory; below plan_.attn_short_keys keys these are the pieces the general
    // graph has keys in, so it is the same work with another merge
    if (rec_range_ == StepRange::kShort) {
        a.nsplit = std::min(a.nsplit, kMaxAttnCluster);
        a.cluster = a.nsplit;
    }
    run(pf, "attention", i, 0.0, [&] { attention_pieces(a, 1, stream_); });
    project_residual(pf, "o_proj", "post_attn_norm", i, lw.o_proj, lq.o_proj, H, act_.attn, qw, act_.o,
                     lw.post_attn_norm, 1.0f, true, lw.pre_ffn_norm);
}

// The long-range graph (Tuning::decode_attn): a full layer over a bf16 or fp8 cache as one sequence of the
// batched step, on its tensor-core pieces (all query heads of a KV group per warp, each K/V row read once
// for them) in fixed pieces of batch_attn_keys keys over the whole context, the pieces past the current
// position empty, then the separate (wide) merge. Returns whether it recorded the layer's attention so.
bool CudaModel::record_attention_mma(int i, AttnArgs& a, Profiler* pf) {
    if (rec_range_ != StepRange::kLong || a.window > 0 || !attention_mma_fits(a)) return false;
    a.tok_pos = st_.d_state + 1;   // the one query's position
    a.tok_slot = st_.d_state + 3;  // 0: a.k_cache / a.v_cache (or the block table) are the slot's already
    const int64_t room = std::max<int64_t>(1, act_.max_pieces / a.nH);
    a.nsplit = static_cast<int>(
        std::clamp<int64_t>((ctx_ + plan_.batch_attn_keys - 1) / plan_.batch_attn_keys, 1, room));
    a.split_len = static_cast<int>((ctx_ + a.nsplit - 1) / a.nsplit);
    a.mma = true;
    run(pf, "attention", i, 0.0, [&] { attention(a, 1, stream_); });
    return true;
}

// FFN: m = down(gelu(gate(xn)) * up(xn)), xn = pre_feedforward_layernorm(x); a dense layer's update follows
// its down projection. MoE (graph only): the routed experts on a second stream, forked from and joined back
// to the main one, so their chain of small kernels overlaps the dense MLP (both read x, which neither
// changes; the combine needs both). Returns whether the experts were forked.
bool CudaModel::record_ffn(int i, Profiler* pf) {
    const LayerWeights& lw = w_.layers[i];
    const LayerQuant& lq = layer_quant(w_, i);
    const int H = c_.hidden, I = c_.layers[i].mlp_width;
    const bool overlap = c_.moe && !pf && !pending_.y;  // o_proj's update applied
    if (overlap) {
        CUDA_CHECK(cudaEventRecord(moe_.fork, stream_));
        CUDA_CHECK(cudaStreamWaitEvent(moe_.stream2, moe_.fork, 0));
        record_experts(i, pf, moe_.stream2);
        CUDA_CHECK(cudaEventRecord(moe_.join, moe_.stream2));
    }
    {
        const GemvInput in = x_input(pf, i, true, lw.pre_ffn_norm);
        run(pf, "mlp_gate_up", i, step_wbytes(2 * I, H, format_of(lq.gate_proj)), [&] {
            if (lq.gate_proj.q && lq.up_proj.q)
                gemv_quant_geglu(in, format_of(lq.gate_proj), lq.gate_proj, lq.up_proj, I, act_.g, stream_);
            else
                gemv_geglu(in, lw.gate_proj, lw.up_proj, I, act_.g, stream_);
        });
    }
    // the MoE combines act_.m with the experts first (record_moe_combine)
    project_residual(pf, "mlp_down", "post_ffn_norm", i, lw.down_proj, lq.down_proj, H, act_.g, I, act_.m,
                     c_.moe ? nullptr : lw.post_ffn_norm, ffn_scale(i), true);
    return overlap;
}

// 2.6: the experts joined back (or recorded here, in the profile), then x's update from the dense MLP's
// act_.m and the experts' weighted sum.
void CudaModel::record_moe_combine(int i, Profiler* pf, bool overlap) {
    const LayerWeights& lw = w_.layers[i];
    const int H = c_.hidden, K = c_.top_k;
    const float eps = c_.rms_eps, scale = ffn_scale(i);
    flush_residual(pf, i);  // (nothing pending here: the MLP consumed it) route and combine read x directly
    if (overlap)
        CUDA_CHECK(cudaStreamWaitEvent(stream_, moe_.join, 0));
    else
        record_experts(i, pf, stream_);
    if (sharded()) {  // [dense partial | experts' partial] summed over the ranks, then the norms
        xn_for_ = nullptr;
        all_reduce(pf, i, act_.m, 2 * static_cast<size_t>(H));
        run(pf, "ffn_combine", i, 0.0, [&] {
            residual_moe_combine(act_.x, act_.m, act_.m + H, moe_.ones, 1, lw.post_ffn_norm_1,
                                 lw.post_ffn_norm_2, lw.post_ffn_norm, H, 1, eps, scale, stream_, true);
        });
        return;
    }
    // plan_.prenorm: the combine also writes the next GEMV's normalised input (the next layer's q/k/v, or
    // lm_head after the last layer), where its wide form runs
    const bf16* next_w = i + 1 < c_.n_layers ? w_.layers[i + 1].input_norm : w_.final_norm;
    const bool pre = plan_.prenorm && H <= kMoeWideMaxHidden && K <= kMoeWideMaxK;
    run(pf, "ffn_combine", i, 0.0, [&] {
        // (moe_.eslots holds the down-sum's vector, combined as one slot of weight 1; quantised experts: K
        // slots)
        const bool slots = layer_quant(w_, i).experts_down.q != nullptr;
        residual_moe_combine(act_.x, act_.m, moe_.eslots, slots ? moe_.sel_w : moe_.ones, slots ? K : 1,
                             lw.post_ffn_norm_1, lw.post_ffn_norm_2, lw.post_ffn_norm, H, 1, eps, scale,
                             stream_, true, pre ? next_w : nullptr, pre ? act_.xn : nullptr);
    });
    xn_for_ = pre ? next_w : nullptr;
}

// 2.4: x += post_per_layer_input_norm(proj(gelu(gate(x)) * PLE_i)), then * layer_scalar.
void CudaModel::record_ple(int i, Profiler* pf) {
    const LayerWeights& lw = w_.layers[i];
    const int H = c_.hidden, P = c_.ple_dim;
    {
        const GemvInput in = x_input(pf, i, false, nullptr);
        run(pf, "ple_gate", i, step_wbytes(P, H),
            [&] { gemv_gelu_mul(in, lw.ple_gate, P, act_.ple + int64_t{i} * P, act_.g, stream_); });
    }
    project_residual(pf, "ple_proj", "ple_post_norm", i, lw.ple_proj, {}, H, act_.g, P, act_.o,
                     lw.ple_post_norm, lw.layer_scalar);
}

// The routed experts of MoE layer i at one token, on stream st: router logits (input norm in each warp),
// softmax / top-k / the experts' input norm, then the selected experts' gate/up and down rows.
void CudaModel::record_experts(int i, Profiler* pf, cudaStream_t st) {
    const LayerWeights& lw = w_.layers[i];
    const int H = c_.hidden, E = c_.n_experts, K = c_.top_k, Ie = c_.expert_width;
    {
        // plan_.moe_prenorm: act_.xr = RMSNorm(x) * router_scale / sqrt(H), written by the post-attention
        // update
        GemvInput in = plan_.moe_prenorm ? gemv_input(act_.xr, H) : x_input(pf, i, true, lw.router_scale);
        if (!plan_.moe_prenorm) in.norm_scale = 1.0f / std::sqrt(static_cast<float>(H));
        if (st != stream_) in.stream = {};  // beside the dense MLP's GEMVs, which hold the stream scratch
        run(pf, "router", i, step_wbytes(E, H), [&] {
            GemvSeg seg{lw.router_proj, moe_.rlogits, E, 0};
            gemv(in, &seg, 1, 1, st);
        });
    }
    run(pf, "route_topk", i, 0.0, [&] {
        moe_route(moe_.rlogits, 1, E, K, lw.per_expert_scale, moe_.sel_id, moe_.sel_w, true, moe_.gexp,
                  moe_.goff, moe_.gent, plan_.moe_prenorm ? nullptr : act_.x, lw.pre_ffn_norm_2, H,
                  c_.rms_eps, moe_.e_in, st, held_experts(), true);
    });
    const LayerQuant& lq = layer_quant(w_, i);
    run(pf, "experts_gate_up", i, step_wbytes(int64_t{K} * 2 * Ie, H, format_of(lq.experts_gate_up)), [&] {
        if (lq.experts_gate_up.q)
            moe_gate_up_decode_quant(format_of(lq.experts_gate_up), moe_.e_in, H, lq.experts_gate_up, Ie, K,
                                     moe_.gexp, moe_.eh, st);
        else
            moe_gate_up_decode(moe_.e_in, H, lw.experts_gate_up, Ie, K, moe_.gexp, moe_.eh, st);
    });
    // the weighted sum too: a rank's share goes to act_.m's second half, else moe_.eslots[0]
    run(pf, "experts_down", i, step_wbytes(int64_t{K} * H, Ie, format_of(lq.experts_down)), [&] {
        float* e = sharded() ? act_.m + H : moe_.eslots;
        if (lq.experts_down.q)  // one row per slot: the combine weighs them (record_moe_combine)
            moe_down_decode_quant(format_of(lq.experts_down), moe_.eh, Ie, lq.experts_down, H, K, moe_.gexp,
                                  moe_.eslots, st);
        else
            moe_down_sum_decode(moe_.eh, Ie, lw.experts_down, H, K, moe_.gexp, moe_.sel_w, e, st);
    });
}

}  // namespace markbase::cuda
