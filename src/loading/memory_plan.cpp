#include "loading/memory_plan.h"

#include <algorithm>
#include <cstdio>

namespace markbase {

namespace {

// model.cu's decode attention split: pieces of >= 32 keys, at most 512 blocks per layer.
constexpr int kDecodeMinSplit = 32;
constexpr int kMaxDecodePieces = 512;

int64_t clamp_ctx(const ModelConfig& c, int64_t ctx) {
    return std::max<int64_t>(1, std::min<int64_t>(ctx, c.max_positions));
}
int clamp_chunk(int64_t ctx, int chunk) {
    return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(chunk, ctx)));
}

}  // namespace

std::string format_gb(uint64_t bytes) {
    char s[32];
    std::snprintf(s, sizeof s, "%.1f GB", static_cast<double>(bytes) / 1e9);
    return s;
}

uint64_t cuda_kv_cache_bytes(const ModelConfig& c, int64_t ctx, int chunk) {
    ctx = clamp_ctx(c, ctx);
    chunk = clamp_chunk(ctx, chunk);
    uint64_t bytes = 0;
    for (const LayerSpec& s : c.layers) {
        if (!s.has_own_kv()) continue;  // KV-shared layers read their source's cache
        const int64_t cap = s.kind == AttentionKind::Sliding
                                ? std::min<int64_t>(ctx, int64_t{c.sliding_window} + chunk)
                                : ctx;
        bytes += 2 * static_cast<uint64_t>(cap) * static_cast<uint64_t>(s.n_kv_heads) *
                 static_cast<uint64_t>(s.head_dim) * sizeof(float);
    }
    return bytes;
}

uint64_t cuda_workspace_bytes(const ModelConfig& c, int64_t ctx, int chunk) {
    ctx = clamp_ctx(c, ctx);
    chunk = clamp_chunk(ctx, chunk);
    const int64_t H = c.hidden, nH = c.n_heads, L = c.n_layers, P = c.ple_dim, V = c.vocab_size, n = chunk;
    int64_t max_q = 0, max_kv = 1, max_I = 0, dmax = 0, max_pieces = n * nH * 4;
    for (const LayerSpec& s : c.layers) {
        max_q = std::max<int64_t>(max_q, nH * s.head_dim);
        max_kv = std::max<int64_t>(max_kv, int64_t{s.n_kv_heads} * s.head_dim);
        max_I = std::max<int64_t>(max_I, s.mlp_width);
        dmax = std::max<int64_t>(dmax, s.head_dim);
        const int64_t range =
            s.kind == AttentionKind::Sliding ? std::min<int64_t>(c.sliding_window, ctx) : ctx;
        const int64_t cap_pieces = std::max<int64_t>(1, kMaxDecodePieces / std::max<int64_t>(nH, 1));
        const int64_t splits =
            std::clamp<int64_t>((range + kDecodeMinSplit - 1) / kDecodeMinSplit, 1, cap_pieces);
        max_pieces = std::max(max_pieces, nH * splits);
    }
    const int64_t E = c.moe ? c.n_experts : 0, K = c.moe ? c.top_k : 0, Ie = c.moe ? c.expert_width : 0;
    const int64_t split_w = std::max({H, max_q, max_I, P});
    // Element counts of CudaModel's buffers, 4-byte (fp32/int) unless noted.
    int64_t f32 = 4 + n + ctx + 2 /* argmax u64 */ + n * H + H + 1 + nH + n * max_q + 2 * n * max_kv +
                  n * max_q + n * H + 2 * n * std::max(max_I, P) + n * H + V + max_pieces * dmax +
                  2 * max_pieces;
    if (P) f32 += 2 * n * L * P;
    // the scores, 6 pointer arrays of nH
    f32 += n * nH * attn_gemm_keys(c, ctx, chunk) + 2 * 6 * nH;
    if (c.moe) f32 += n * E + 2 * n * K + 2 * (std::max(E, K) + 1) + n * K + n * H + n * K * Ie + n * K * H;
    if (c.moe) f32 += 2 * 6 * E + E + 1;  // the compact experts pass's plan (6 pointer arrays, row offsets)
    int64_t rope = 0;
    for (const LayerSpec& s : c.layers) rope = std::max<int64_t>(rope, s.head_dim);  // two small tables
    // the dense GEMMs' stacked output (kGemmStackMaxN): [2 min(n, max)][widest dense output] fp32
    f32 += 2 * std::min<int64_t>(n, kGemmStackMaxN) * std::max({L * P, max_q, max_kv, H, max_I});
    const uint64_t bytes = static_cast<uint64_t>(f32) * 4 +
                           static_cast<uint64_t>(2 * n * split_w) * 2 /* hi, lo bf16 */ +
                           static_cast<uint64_t>(rope) * 4;
    return bytes + moe_prefill_scratch_bytes(c, static_cast<int>(chunk)) + kCudaRuntimeReserve;
}

CudaMemoryPlan plan_cuda_memory(const ModelConfig& c, uint64_t weight_bytes, int64_t ctx, int chunk) {
    CudaMemoryPlan p;
    p.ctx = clamp_ctx(c, ctx);
    p.chunk = clamp_chunk(p.ctx, chunk);
    p.weights = weight_bytes;
    p.kv_cache = cuda_kv_cache_bytes(c, p.ctx, p.chunk);
    p.workspace = cuda_workspace_bytes(c, p.ctx, p.chunk);
    return p;
}

FitCheck check_cuda_fit(const ModelConfig& c, uint64_t weight_bytes, int64_t ctx, int chunk,
                        uint64_t free_bytes, const std::string& device) {
    FitCheck f;
    const CudaMemoryPlan p = plan_cuda_memory(c, weight_bytes, ctx, chunk);
    auto fits_at = [&](int64_t x) {
        return plan_cuda_memory(c, weight_bytes, x, chunk).total() <= free_bytes;
    };
    // Every term grows with the context, so the largest context that fits is found by bisection.
    if (fits_at(1)) {
        int64_t lo = 1, hi = p.ctx;
        if (fits_at(hi)) {
            lo = hi;
        } else {
            while (hi - lo > 1) {
                const int64_t mid = lo + (hi - lo) / 2;
                (fits_at(mid) ? lo : hi) = mid;
            }
        }
        f.max_ctx = lo;
    }
    f.fits = p.total() <= free_bytes;
    f.message = "model " + format_gb(p.weights) + " + KV cache for " + std::to_string(p.ctx) + " tokens " +
                format_gb(p.kv_cache) + " + workspace " + format_gb(p.workspace) + " = " +
                format_gb(p.total()) + (f.fits ? " <= " : " > ") + format_gb(free_bytes) + " free on " +
                device;
    if (f.fits) return f;
    if (f.max_ctx > 0) {
        f.message += "; lower --ctx-size to at most " + std::to_string(f.max_ctx);
        if (p.chunk > 1) f.message += " (or --batch-size, which sizes the workspace)";
    } else {
        f.message +=
            "; the weights and workspace alone do not fit: use a smaller model, a larger GPU, or "
            "--device cpu";
    }
    return f;
}

}  // namespace markbase
