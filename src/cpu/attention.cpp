// 2.5: Gemma 4 attention on the CPU: q/k norms, RoPE (default or proportional), k_eq_v, weightless v_norm,
// GQA, sliding-window and full causal masks, KV sharing, scale 1.0, no softcap. The projections take every
// row of the pass at once; RoPE and the cache writes go row by row, each against its own cache and position
// (RowCaches), and the scores in blocks of a sequence's rows and a KV group's heads (each row's result the
// same as alone), so one code path serves a prompt chunk and a batched decode step. On the H200 host's
// 16-core Xeon the blocks took E2B's prefill of 512 from 194 to 216 tok/s (medians of four alternating
// pairs, bench/results/cpu-attention-xeon.json; the prefill of 64 even); on a 2-core VM the attention's
// share of that prefill went 1.10 -> 0.27 s.
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

// The queries of one task: rows [t0, t1) of one sequence (one cache; a prompt chunk's rows, or one row of a
// batched decode step) and heads [h0, h1) of KV group g, which share their key and value rows: the kernels'
// tiles read a key or value row once for several heads, and the block's rows find it in cache.
struct QueryBlock {
    int t0, t1, h0, h1, g;
};

// A thread's scratch across its blocks: the key and value rows' addresses, one row's scores.
struct BlockScratch {
    std::vector<const float*> k, v;
    std::vector<float> scores;
};

// Each query against the keys lo..pos of its row: scores q.k * 1.0, fp32 softmax (sum in double), the
// weighted sum of V into its out[d]. The block's rows share one range of keys (the union of theirs; a weight
// outside a query's own range is 0), and attn_scores / attn_values compute each query's row the same whatever
// the block around it, so a prompt's row equals the same row computed alone (given finite value rows).
void attend_block(const QueryBlock& b, const float* q, int nH, int d, const RowCaches& rows, int src_layer,
                  bool sliding, int64_t W, BlockScratch& scratch, float* out) {
    LayerCache& src = rows.cache(b.t0).layers[src_layer];
    auto lo_of = [&](int t) { return sliding ? std::max<int64_t>(0, rows.pos(t) - W + 1) : int64_t{0}; };
    int64_t jlo = INT64_MAX, jhi = -1;
    for (int t = b.t0; t < b.t1; ++t) {
        jlo = std::min(jlo, lo_of(t));
        jhi = std::max(jhi, rows.pos(t));
    }
    const int nh = b.h1 - b.h0;
    const int span = static_cast<int>(jhi - jlo + 1);
    scratch.k.resize(static_cast<size_t>(span));
    scratch.v.resize(static_cast<size_t>(span));
    for (int64_t j = jlo; j <= jhi; ++j) {
        scratch.k[j - jlo] = src.k_at(j) + b.g * d;
        scratch.v[j - jlo] = src.v_at(j) + b.g * d;
    }
    scratch.scores.resize(static_cast<size_t>(nh) * span);
    float* sc = scratch.scores.data();
    for (int t = b.t0; t < b.t1; ++t) {
        const int64_t q0 = (static_cast<int64_t>(t) * nH + b.h0) * d;  // the row's first query of the block
        // in SIMD lanes, a tile of queries x keys at a time (a serial sum is one dependent add per element)
        attn_scores(q + q0, d, nh, scratch.k.data(), span, d, sc, span);
        const int64_t lo = lo_of(t) - jlo, hi = rows.pos(t) - jlo;
        for (int h = 0; h < nh; ++h) {
            float* r = sc + static_cast<int64_t>(h) * span;
            float mx = -INFINITY;
            for (int64_t j = lo; j <= hi; ++j) mx = std::max(mx, r[j]);
            double sum = 0.0;
            for (int64_t j = lo; j <= hi; ++j) {
                r[j] = std::exp(r[j] - mx);
                sum += r[j];
            }
            const float inv_sum = static_cast<float>(1.0 / sum);
            for (int64_t j = 0; j < span; ++j) r[j] = j >= lo && j <= hi ? r[j] * inv_sum : 0.0f;
        }
        attn_values(sc, span, nh, scratch.v.data(), span, d, out + q0, d);
    }
}

// The attention's tasks: runs of at most kBlockRows consecutive rows of one cache (a prompt chunk's; a
// batched decode step's rows are each their own) times each KV group, its heads split further while there
// would be fewer than two tasks a thread (one token's decode: a task per head, as before). Ordered
// heaviest-first alternating with lightest, so the pool's contiguous shares of a causal prompt carry even
// work.
constexpr int kBlockRows = 4;

std::vector<QueryBlock> query_blocks(const RowCaches& rows, int n, int nH, int nKV, int threads) {
    std::vector<std::pair<int, int>> runs;
    for (int t = 0; t < n;) {
        int e = t + 1;
        while (e < n && e - t < kBlockRows && &rows.cache(e) == &rows.cache(t)) ++e;
        runs.emplace_back(t, e);
        t = e;
    }
    const int group = nH / nKV;
    int split = 1;
    while (split < group && static_cast<int64_t>(runs.size()) * nKV * split < 2 * int64_t{threads})
        split *= 2;
    while (group % split) --split;
    std::vector<QueryBlock> blocks;
    for (const auto& [t0, t1] : runs)
        for (int g = 0; g < nKV; ++g)
            for (int p = 0; p < split; ++p) {
                const int h0 = g * group + p * (group / split);
                blocks.push_back({t0, t1, h0, h0 + group / split, g});
            }
    std::vector<QueryBlock> order;
    order.reserve(blocks.size());
    for (size_t a = 0, z = blocks.size(); a < z;) {
        order.push_back(blocks[--z]);
        if (a < z) order.push_back(blocks[a++]);
    }
    return order;
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
    const int64_t W = c_.sliding_window;
    int64_t visible = 0;  // keys per query, at most: what a query's work costs
    for (int t = 0; t < n; ++t) {
        const int64_t keys = rows.pos(t) + 1;
        visible = std::max(visible, sliding ? std::min<int64_t>(W, keys) : keys);
    }
    const std::vector<QueryBlock> blocks = query_blocks(rows, n, nH, nKV, pool_.size());
    const int64_t per_block = 4 * visible * d * int64_t{n} * nH / static_cast<int64_t>(blocks.size());
    parallel_if(pool_, static_cast<int64_t>(blocks.size()), per_block, [&](int64_t b, int64_t e) {
        BlockScratch scratch;
        for (int64_t k = b; k < e; ++k)
            attend_block(blocks[k], q_.data(), nH, d, rows, src_layer, sliding, W, scratch, attn_.data());
    });

    // o_proj(concat heads)
    matmul(attn_.data(), n, qw, w.o_proj, H, o_.data());
}

}  // namespace markbase::cpu
