// The decode step (one token), as cpu/forward.cpp computes it, launched kernel by kernel on one stream. Nothing
// here reads host state that changes between tokens: the token id and its position are read by the kernels from
// d_state_, so the same launches captured once as a CUDA graph serve every step. With a Profiler each launch is
// bracketed by events instead (the profile mode).
#include <cmath>

#include "cuda/cuda_model.h"

namespace markbase::cuda {

namespace {
double wbytes(int64_t rows, int64_t cols) { return 2.0 * static_cast<double>(rows) * static_cast<double>(cols); }
}  // namespace

void CudaModel::record_step(Profiler* pf) {
    const int H = c_.hidden, P = c_.ple_dim, L = c_.n_layers;
    const int64_t LP = int64_t{L} * P, V = c_.vocab_size;
    const float eps = c_.rms_eps;
    const int* tok = d_state_;

    // 2.2: x = embed[tok] * bf16(sqrt(H)); also clears the argmax for this step
    run(pf, "embed", -1, 2.0 * H,
        [&] { embed_rows(tok, 1, w_.embed, H, c_.embed_scale(), x_, d_argmax_, stream_); });

    // 2.3: per-layer inputs from the scaled embedding
    if (P) {
        run(pf, "ple_model_proj", -1, wbytes(LP, H), [&] {
            GemvInput in;
            in.x = x_;
            in.K = H;
            GemvSeg seg{w_.ple_model_proj, ple_ctx_, static_cast<int>(LP), 0};
            gemv(in, &seg, 1, 1, stream_);
        });
        run(pf, "ple_mix", -1, 2.0 * LP, [&] {
            ple_mix(ple_ctx_, tok, 1, w_.ple_embed, w_.ple_proj_norm, L, P, H, eps, ple_, stream_);
        });
    }

    for (int i = 0; i < L; ++i) record_layer(i, pf);

    // 2.7: logits = softcap(norm(x) @ embed^T), argmax folded in
    run(pf, "lm_head", -1, wbytes(V, H), [&] {
        GemvInput in;
        in.x = x_;
        in.K = H;
        in.norm = true;
        in.norm_w = w_.final_norm;
        in.eps = eps;
        gemv_logits(in, w_.embed, static_cast<int>(V), c_.final_softcap, logits_, d_argmax_, stream_);
    });
    run(pf, "sample", -1, 0.0,
        [&] { finish_step(d_argmax_, d_state_, 1, d_out_ids_, static_cast<int>(ctx_), stream_); });
}

void CudaModel::record_layer(int i, Profiler* pf) {
    const LayerWeights& lw = w_.layers[i];
    const LayerSpec& s = c_.layers[i];
    const int H = c_.hidden, nH = c_.n_heads, d = s.head_dim, nKV = s.n_kv_heads, I = s.mlp_width;
    const int qw = nH * d, kvw = nKV * d;
    const float eps = c_.rms_eps;
    const bool own = s.has_own_kv();

    GemvInput xin;  // x through a fused RMSNorm with weight nw
    xin.x = x_;
    xin.K = H;
    xin.norm = true;
    xin.eps = eps;

    // 2.5: q (and own k, v) from input_layernorm(x), one launch
    run(pf, "qkv", i, wbytes(qw + (own ? kvw * (lw.v_proj ? 2 : 1) : 0), H), [&] {
        GemvInput in = xin;
        in.norm_w = lw.input_norm;
        GemvSeg segs[3];
        int ns = 0;
        segs[ns++] = {lw.q_proj, q_, qw, 0};
        if (own) {
            segs[ns++] = {lw.k_proj, k_, kvw, 0};
            if (lw.v_proj) segs[ns++] = {lw.v_proj, v_, kvw, 0};
        }
        gemv(in, segs, ns, 1, stream_);
    });
    const bool sliding = s.kind == AttentionKind::Sliding;
    run(pf, "qk_norm_rope", i, 0.0, [&] {
        QkvPost p;
        p.q = q_;
        p.kraw = own ? k_ : nullptr;
        p.vraw = lw.v_proj ? v_ : k_;  // k_eq_v: V is the raw k projection
        p.q_norm = lw.q_norm;
        p.k_norm = lw.k_norm;
        p.k_cache = cache_[i].k;
        p.v_cache = cache_[i].v;
        p.cap = cache_[i].cap;
        p.nH = nH;
        p.nKV = nKV;
        p.d = d;
        p.inv_freq = sliding ? inv_sliding_ : inv_full_;
        p.pos_base = d_state_ + 1;
        p.eps = eps;
        qkv_post(p, 1, stream_);
    });
    run(pf, "attention", i, 0.0, [&] {
        AttnArgs a;
        attention_args(i, a);
        a.nsplit = decode_splits_[i];
        a.split_len = 256;
        attention(a, 1, stream_);
    });
    run(pf, "o_proj", i, wbytes(H, qw), [&] {
        GemvInput in;
        in.x = attn_;
        in.K = qw;
        GemvSeg seg{lw.o_proj, o_, H, 0};
        gemv(in, &seg, 1, 1, stream_);
    });
    run(pf, "post_attn_norm", i, 0.0,
        [&] { residual_add_norm(x_, o_, lw.post_attn_norm, H, 1, eps, 1.0f, stream_); });

    // FFN: m = down(gelu(gate(xn)) * up(xn)), xn = pre_feedforward_layernorm(x)
    const float ffn_scale = c_.ple_dim ? 1.0f : lw.layer_scalar;  // layer_scalar goes on the layer's last update
    run(pf, "mlp_gate_up", i, wbytes(2 * I, H), [&] {
        GemvInput in = xin;
        in.norm_w = lw.pre_ffn_norm;
        gemv_geglu(in, lw.gate_proj, lw.up_proj, I, g_, stream_);
    });
    run(pf, "mlp_down", i, wbytes(H, I), [&] {
        GemvInput in;
        in.x = g_;
        in.K = I;
        GemvSeg seg{lw.down_proj, m_, H, 0};
        gemv(in, &seg, 1, 1, stream_);
    });

    if (c_.moe) {  // 2.6
        const int E = c_.n_experts, K = c_.top_k, Ie = c_.expert_width;
        run(pf, "router", i, wbytes(E, H), [&] {
            GemvInput in = xin;
            in.norm_w = lw.router_scale;
            in.norm_scale = 1.0f / std::sqrt(static_cast<float>(H));
            GemvSeg seg{lw.router_proj, rlogits_, E, 0};
            gemv(in, &seg, 1, 1, stream_);
        });
        run(pf, "route_topk", i, 0.0, [&] {
            moe_route(rlogits_, 1, E, K, lw.per_expert_scale, sel_id_, sel_w_, true, gexp_, goff_, gent_, stream_);
        });
        run(pf, "experts_norm", i, 0.0, [&] { rmsnorm_rows(x_, lw.pre_ffn_norm_2, H, 1, eps, e_in_, stream_); });
        run(pf, "experts_gate_up", i, wbytes(int64_t{K} * 2 * Ie, H), [&] {
            moe_gate_up(e_in_, H, lw.experts_gate_up, Ie, K, gexp_, goff_, gent_, K, eh_, stream_);
        });
        run(pf, "experts_down", i, wbytes(int64_t{K} * H, Ie), [&] {
            moe_down(eh_, Ie, lw.experts_down, H, gexp_, goff_, gent_, K, eslots_, stream_);
        });
        run(pf, "ffn_combine", i, 0.0, [&] {
            residual_moe_combine(x_, m_, eslots_, sel_w_, K, lw.post_ffn_norm_1, lw.post_ffn_norm_2,
                                 lw.post_ffn_norm, H, 1, eps, ffn_scale, stream_);
        });
    } else {
        run(pf, "post_ffn_norm", i, 0.0,
            [&] { residual_add_norm(x_, m_, lw.post_ffn_norm, H, 1, eps, ffn_scale, stream_); });
    }

    if (c_.ple_dim) {  // 2.4: x += post_per_layer_input_norm(proj(gelu(gate(x)) * PLE_i)), then * layer_scalar
        const int P = c_.ple_dim;
        run(pf, "ple_gate", i, wbytes(P, H), [&] {
            GemvInput in;
            in.x = x_;
            in.K = H;
            gemv_gelu_mul(in, lw.ple_gate, P, ple_ + int64_t{i} * P, g_, stream_);
        });
        run(pf, "ple_proj", i, wbytes(H, P), [&] {
            GemvInput in;
            in.x = g_;
            in.K = P;
            GemvSeg seg{lw.ple_proj, o_, H, 0};
            gemv(in, &seg, 1, 1, stream_);
        });
        run(pf, "ple_post_norm", i, 0.0,
            [&] { residual_add_norm(x_, o_, lw.ple_post_norm, H, 1, eps, lw.layer_scalar, stream_); });
    }
}

}  // namespace markbase::cuda
