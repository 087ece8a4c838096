// 2.5: Gemma 4 attention on the CPU: q/k norms, RoPE (default or proportional), k_eq_v, weightless v_norm,
// GQA, sliding-window and full causal masks, KV sharing, scale 1.0, no softcap. The projections take every
// row of the pass at once; RoPE, the cache writes and the scores go row by row, each against its own cache
// and position (RowCaches), so one code path serves a prompt chunk and a batched decode step.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/forward.h"
#include "cpu/matmul.h"
#include "cpu/ops.h"
#include "model/bf16.h"
#include "model/fp8.h"

namespace markbase::cpu {

namespace {

// A key or value row as the cache holds it: unchanged (fp32), or rounded to bf16 or e4m3 as the GPU's cache
// stores it (kv_store in cuda/kernels/kv_elems.cuh: round to nearest even; e4m3 saturating at +-448).
void round_kv(KvDtype t, float* x, int d) {
    if (t == KvDtype::kBf16)
        for (int c = 0; c < d; ++c) x[c] = round_to_bf16(x[c]);
    else if (t == KvDtype::kFp8)
        for (int c = 0; c < d; ++c) x[c] = fp8_e4m3_to_float(float_to_fp8_e4m3(x[c]));
}

// One query head against the keys lo..pos of its KV group g: scores q.k * 1.0, fp32 softmax (sum in double),
// weighted sum of V into out[d].
void attend(const float* q, LayerCache& src, int g, int d, int64_t lo, int64_t pos,
            std::vector<float>& scores, float* out) {
    scores.resize(pos - lo + 1);
    float mx = -INFINITY;
    for (int64_t j = lo; j <= pos; ++j) {
        // in SIMD lanes (a serial sum is one dependent add per element: ~40x slower at d = 256)
        const float acc = dot_f32(q, src.k_at(j) + g * d, d);
        scores[j - lo] = acc;
        mx = std::max(mx, acc);
    }
    double sum = 0.0;
    for (float& sc : scores) {
        sc = std::exp(sc - mx);
        sum += sc;
    }
    const float inv_sum = static_cast<float>(1.0 / sum);
    std::fill(out, out + d, 0.0f);
    for (int64_t j = lo; j <= pos; ++j) {
        const float p = scores[j - lo] * inv_sum;
        const float* v = src.v_at(j) + g * d;
        for (int u = 0; u < d; ++u) out[u] += p * v[u];
    }
}

// cos/sin per row at its position, [n][d/2], fp32 as HF computes them
void rope_tables(const std::vector<float>& inv, const RowCaches& rows, int n, std::vector<float>& cos_t,
                 std::vector<float>& sin_t) {
    const size_t half = inv.size();
    cos_t.resize(static_cast<size_t>(n) * half);
    sin_t.resize(cos_t.size());
    for (int t = 0; t < n; ++t) {
        const float pos = static_cast<float>(rows.pos(t));
        for (size_t j = 0; j < half; ++j) {
            const float ang = pos * inv[j];
            cos_t[t * half + j] = std::cos(ang);
            sin_t[t * half + j] = std::sin(ang);
        }
    }
}

}  // namespace

void CpuModel::attention(int i, int n, const RowCaches& rows) {
    const LayerWeights& w = w_.layers[i];
    const LayerSpec& s = c_.layers[i];
    const int H = c_.hidden, d = s.head_dim, nH = c_.n_heads, nKV = s.n_kv_heads;
    const int qw = nH * d, kvw = nKV * d;
    const float eps = c_.rms_eps;
    const bool sliding = s.kind == AttentionKind::Sliding;
    const int half = d / 2;
    std::vector<float> cos_t, sin_t;
    rope_tables((sliding ? c_.rope_sliding : c_.rope_full).inverse_frequencies(d), rows, n, cos_t, sin_t);

    // q = RoPE(q_norm(q_proj(a)))
    matmul(a_.data(), n, H, w.q_proj, qw, q_.data());
    parallel_if(pool_, int64_t{n} * nH, 8 * d, [&](int64_t b, int64_t e) {
        for (int64_t th = b; th < e; ++th) {
            const int64_t t = th / nH;
            float* q = q_.data() + th * d;
            rmsnorm(q, w.q_norm, d, eps, q);
            rope_neox(q, d, cos_t.data() + t * half, sin_t.data() + t * half);
        }
    });

    // Own K/V: k = RoPE(k_norm(kraw)); v = v_norm(V) with V = kraw on k_eq_v layers, written into each row's
    // cache at its position.
    if (s.has_own_kv()) {
        matmul(a_.data(), n, H, w.k_proj, kvw, k_.data());
        if (w.v_proj)
            matmul(a_.data(), n, H, w.v_proj, kvw, v_.data());
        else
            std::copy(k_.begin(), k_.begin() + int64_t{n} * kvw,
                      v_.begin());  // raw k, before k_norm and RoPE
        parallel_if(pool_, int64_t{n} * nKV, 16 * d, [&](int64_t b, int64_t e) {
            for (int64_t th = b; th < e; ++th) {
                const int t = static_cast<int>(th / nKV), g = static_cast<int>(th % nKV);
                float* k = k_.data() + th * d;
                rmsnorm(k, w.k_norm, d, eps, k);
                rope_neox(k, d, cos_t.data() + int64_t{t} * half, sin_t.data() + int64_t{t} * half);
                float* v = v_.data() + th * d;
                rmsnorm(v, nullptr, d, eps, v);
                KvCache& cache = rows.cache(t);
                LayerCache& lc = cache.layers[i];
                round_kv(cache.values, k, d);
                round_kv(cache.values, v, d);
                std::copy(k, k + d, lc.k_at(rows.pos(t)) + g * d);
                std::copy(v, v + d, lc.v_at(rows.pos(t)) + g * d);
            }
        });
    }

    // Every query over its visible keys. KV-shared layers read their source layer's (already updated) cache
    // and apply their own layer type's mask.
    const int src_layer = s.has_own_kv() ? i : s.kv_source;
    const int group = nH / nKV;
    const int64_t W = c_.sliding_window;
    int64_t visible = 0;  // keys per query, at most: what a row's work costs
    for (int t = 0; t < n; ++t) {
        const int64_t keys = rows.pos(t) + 1;
        visible = std::max(visible, sliding ? std::min<int64_t>(W, keys) : keys);
    }
    parallel_if(pool_, int64_t{n} * nH, 4 * visible * d, [&](int64_t b, int64_t e) {
        std::vector<float> scores;
        for (int64_t th = b; th < e; ++th) {
            const int t = static_cast<int>(th / nH);
            const int h = static_cast<int>(th % nH);
            const int64_t pos = rows.pos(t);
            const int64_t lo =
                sliding ? std::max<int64_t>(0, pos - W + 1) : 0;  // last W positions incl. itself
            attend(q_.data() + th * d, rows.cache(t).layers[src_layer], h / group, d, lo, pos, scores,
                   attn_.data() + th * d);
        }
    });

    // o_proj(concat heads)
    matmul(attn_.data(), n, qw, w.o_proj, H, o_.data());
}

}  // namespace markbase::cpu
