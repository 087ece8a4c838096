// The Gemma 4 text decoder, top to bottom, as ../shared/GEMMA4.md section 2 describes it.
// Section numbers in comments refer to that page.
#include "cpu/forward.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "cpu/matmul.h"
#include "cpu/ops.h"
#include "model/error.h"

namespace markbase::cpu {

namespace {

// Applies `fn(row)` to rows [0, n) of `width` floats, in parallel when that is worth it.
template <class Fn>
void for_rows(ThreadPool& pool, int n, int64_t width, Fn fn) {
    parallel_if(pool, n, 4 * width, [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) fn(static_cast<int>(t));
    });
}

}  // namespace

CpuModel::CpuModel(const Checkpoint& ck, ThreadPool& pool, int max_chunk, PromptProducts products)
    : c_(ck.config),
      resident_(ck, pool),
      w_(resident_.weights()),
      pool_(pool),
      max_chunk_(max_chunk),
      products_(products) {
    int max_q = 0, max_kv = 0, max_I = 0;
    for (const LayerSpec& s : c_.layers) {
        max_q = std::max(max_q, c_.n_heads * s.head_dim);
        max_kv = std::max(max_kv, s.n_kv_heads * s.head_dim);
        max_I = std::max(max_I, s.mlp_width);
    }
    if (c_.moe) max_I = std::max(max_I, 2 * c_.expert_width);
    const size_t n = max_chunk, H = c_.hidden, LP = static_cast<size_t>(c_.n_layers) * c_.ple_dim;
    x_.resize(n * H);
    a_.resize(n * H);
    q_.resize(n * max_q);
    k_.resize(n * max_kv);
    v_.resize(n * max_kv);
    attn_.resize(n * max_q);
    o_.resize(n * H);
    gate_.resize(n * max_I);
    up_.resize(n * max_I);
    m_.resize(n * H);
    ple_.resize(n * LP);
    ple_tmp_.resize(n * std::max<size_t>(LP, H));
    if (c_.moe) {
        moe_out_.resize(n * H);
        moe_in_.resize(n * H);
    }
    logits_rows_.resize(n * H);
}

void CpuModel::matmul(const float* x, int n, int64_t in, const bf16* w, int64_t out, float* y) {
    if (rowwise_)
        matmul_bf16_rowwise(pool_, x, n, in, w, out, y);
    else
        matmul_bf16(pool_, x, n, in, w, out, y, products_);
}

// 2.2: h0 = embed_tokens[ids] * bf16(sqrt(H))
void CpuModel::embed(const int* ids, int n) {
    const int H = c_.hidden;
    const float scale = c_.embed_scale();
    for (int t = 0; t < n; ++t) {
        if (ids[t] < 0 || ids[t] >= c_.vocab_size)
            throw Error("token id " + std::to_string(ids[t]) + " at position " + std::to_string(t) +
                        " is outside the vocabulary [0, " + std::to_string(c_.vocab_size) + ")");
        const bf16* row = w_.embed + static_cast<int64_t>(ids[t]) * H;
        float* x = x_.data() + static_cast<size_t>(t) * H;
        for (int i = 0; i < H; ++i) x[i] = bf16_to_float(row[i]) * scale;
    }
}

// 2.3: PLE = (RMSNorm_P(per_layer_model_projection(h0) * H^-0.5) + embed_tokens_per_layer[ids] * sqrt(P)) *
// 2^-0.5
void CpuModel::per_layer_inputs(const int* ids, int n) {
    const int H = c_.hidden, P = c_.ple_dim, L = c_.n_layers;
    const int64_t LP = int64_t{L} * P;
    matmul(x_.data(), n, H, w_.ple_model_proj, LP, ple_tmp_.data());
    const float proj_scale = 1.0f / std::sqrt(static_cast<float>(H));
    const float tok_scale = round_to_bf16(std::sqrt(static_cast<float>(P)));
    const float mix = 1.0f / std::sqrt(2.0f);
    for_rows(pool_, n, LP * 3, [&](int t) {
        if (ids[t] >= c_.ple_vocab)
            throw Error("token id " + std::to_string(ids[t]) + " is outside the per-layer embedding table (" +
                        std::to_string(c_.ple_vocab) + " rows)");
        const bf16* tok = w_.ple_embed + static_cast<int64_t>(ids[t]) * LP;
        float* ctx = ple_tmp_.data() + t * LP;
        float* out = ple_.data() + t * LP;
        for (int64_t j = 0; j < LP; ++j) ctx[j] *= proj_scale;
        for (int l = 0; l < L; ++l) rmsnorm(ctx + l * P, w_.ple_proj_norm, P, c_.rms_eps, out + l * P);
        for (int64_t j = 0; j < LP; ++j) out[j] = (out[j] + bf16_to_float(tok[j]) * tok_scale) * mix;
    });
}

// GeGLU: down( gelu_tanh(gate(in)) * up(in) )
void CpuModel::mlp(const LayerWeights& w, int I, const float* in, int n, float* out) {
    const int H = c_.hidden;
    matmul(in, n, H, w.gate_proj, I, gate_.data());
    matmul(in, n, H, w.up_proj, I, up_.data());
    const int64_t total = int64_t{n} * I;
    gelu_mul(pool_, gate_.data(), up_.data(), gate_.data(), total);
    matmul(gate_.data(), n, I, w.down_proj, H, out);
}

// 2.4: one decoder layer on the residual stream x_.
void CpuModel::layer(int i, int n, const RowCaches& rows) {
    const LayerWeights& w = w_.layers[i];
    const LayerSpec& s = c_.layers[i];
    const int H = c_.hidden;
    const float eps = c_.rms_eps;
    float* x = x_.data();

    // a = input_layernorm(x); a = Attention(a); x = x + post_attention_layernorm(a)
    for_rows(pool_, n, H, [&](int t) { rmsnorm(x + t * H, w.input_norm, H, eps, a_.data() + t * H); });
    attention(i, n, rows);  // a_ -> o_
    for_rows(pool_, n, H, [&](int t) {
        float* xt = x + t * H;
        float* ot = o_.data() + t * H;
        rmsnorm(ot, w.post_attn_norm, H, eps, ot);
        for (int j = 0; j < H; ++j) xt[j] += ot[j];
    });

    // m = mlp(pre_feedforward_layernorm(r)), r = x
    for_rows(pool_, n, H, [&](int t) { rmsnorm(x + t * H, w.pre_ffn_norm, H, eps, a_.data() + t * H); });
    mlp(w, s.mlp_width, a_.data(), n, m_.data());

    // 2.6 MoE: m = post_ffn_norm_1(m) + post_ffn_norm_2(experts(pre_ffn_norm_2(r)))
    if (c_.moe) {
        moe(i, n);  // x_ -> moe_out_ (already through post_feedforward_layernorm_2)
        for_rows(pool_, n, H, [&](int t) {
            float* mt = m_.data() + t * H;
            rmsnorm(mt, w.post_ffn_norm_1, H, eps, mt);
            const float* e = moe_out_.data() + t * H;
            for (int j = 0; j < H; ++j) mt[j] += e[j];
        });
    }

    // x = r + post_feedforward_layernorm(m)
    for_rows(pool_, n, H, [&](int t) {
        float* mt = m_.data() + t * H;
        rmsnorm(mt, w.post_ffn_norm, H, eps, mt);
        float* xt = x + t * H;
        for (int j = 0; j < H; ++j) xt[j] += mt[j];
    });

    // 2.3/2.4 PLE: x = x + post_per_layer_input_norm(per_layer_projection(gelu(per_layer_input_gate(x)) *
    // PLE_i))
    if (c_.ple_dim) {
        const int P = c_.ple_dim;
        const int64_t LP = int64_t{c_.n_layers} * P;
        float* g = ple_tmp_.data();  // [n][P]
        matmul(x, n, H, w.ple_gate, P, g);
        for_rows(pool_, n, 32 * P, [&](int t) {
            float* gt = g + int64_t{t} * P;
            const float* pl = ple_.data() + t * LP + int64_t{i} * P;
            for (int j = 0; j < P; ++j) gt[j] = gelu_tanh(gt[j]) * pl[j];
        });
        matmul(g, n, P, w.ple_proj, H, o_.data());
        for_rows(pool_, n, H, [&](int t) {
            float* ot = o_.data() + t * H;
            rmsnorm(ot, w.ple_post_norm, H, eps, ot);
            float* xt = x + t * H;
            for (int j = 0; j < H; ++j) xt[j] += ot[j];
        });
    }

    // x = x * layer_scalar (the whole stream, residual included)
    parallel_if(pool_, int64_t{n} * H, 1, [&](int64_t b, int64_t e) {
        for (int64_t j = b; j < e; ++j) x[j] *= w.layer_scalar;
    });
}

void CpuModel::check_room(const KvCache& cache, int n) const {
    if (n > max_chunk_ || n > cache.max_chunk)
        throw Error("internal: forward() got " + std::to_string(n) + " tokens, more than the chunk size " +
                    std::to_string(std::min(max_chunk_, cache.max_chunk)));
    if (cache.n_past + n > cache.max_ctx)
        throw Error("context full: " + std::to_string(cache.n_past + n) +
                    " tokens do not fit in the context of " + std::to_string(cache.max_ctx) +
                    " (raise --ctx-size, at most " + std::to_string(c_.max_positions) + ")");
}

void CpuModel::run_layers(const int* ids, int n, const RowCaches& rows) {
    embed(ids, n);
    if (c_.ple_dim) per_layer_inputs(ids, n);
    for (int i = 0; i < c_.n_layers; ++i) layer(i, n, rows);
}

void CpuModel::forward(const int* ids, int n, KvCache& cache, float* logits, bool all_logits) {
    if (n <= 0) return;
    check_room(cache, n);
    rowwise_ = false;  // a chunk's rows are one sequence's: the fastest kernel for n rows
    run_layers(ids, n, RowCaches(cache));
    cache.n_past += n;
    if (!logits) return;
    const int first_row = all_logits ? 0 : n - 1;
    final_logits(first_row, n - first_row, logits);
}

void CpuModel::forward_decode(const int* ids, int n, KvCache* const* caches, float* logits, int n_logits) {
    if (n <= 0) return;
    if (n > max_chunk_)
        throw Error("internal: forward_decode() got " + std::to_string(n) +
                    " rows, more than the chunk size " + std::to_string(max_chunk_));
    for (int t = 0; t < n; ++t) {
        check_room(*caches[t], 1);
        for (int u = 0; u < t; ++u)  // two rows writing one cache at one position would race
            if (caches[u] == caches[t]) throw Error("internal: forward_decode() got one cache twice");
    }
    rowwise_ = true;
    run_layers(ids, n, RowCaches(caches));
    for (int t = 0; t < n; ++t) ++caches[t]->n_past;
    if (logits && n_logits > 0) final_logits(0, std::min(n_logits, n), logits);
}

// 2.7: logits = softcap(norm(x) @ embed_tokens^T)
void CpuModel::final_logits(int first_row, int rows, float* logits) {
    const int H = c_.hidden;
    for (int r = 0; r < rows; ++r)
        rmsnorm(x_.data() + int64_t{first_row + r} * H, w_.final_norm, H, c_.rms_eps,
                logits_rows_.data() + int64_t{r} * H);
    matmul(logits_rows_.data(), rows, H, w_.embed, c_.vocab_size, logits);
    if (c_.final_softcap > 0.0f) {
        const float cap = c_.final_softcap;
        const int64_t total = int64_t{rows} * c_.vocab_size;
        parallel_if(pool_, total, 20, [&](int64_t b, int64_t e) {
            for (int64_t j = b; j < e; ++j) logits[j] = cap * std::tanh(logits[j] / cap);
        });
    }
}

}  // namespace markbase::cpu
