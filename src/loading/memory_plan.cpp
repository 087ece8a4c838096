#include "loading/memory_plan.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>

namespace markbase {

// Names for the CUDA side's drift message; element sizes (float, int, uint: 4; u64, pointers: 8; bf16: 2;
// the compact plan in bytes).
// clang-format off
const std::array<CudaBufInfo, static_cast<size_t>(CudaBuf::kCount)> kCudaBufInfo = {{
    {"state", 4},          {"ids", 4},          {"out_ids", 4},       {"argmax", 8},
    {"x", 4},              {"counter", 4},      {"xn", 4},            {"attn_counters", 4},
    {"ring_part", 4},      {"ring_count", 4},   {"q", 4},             {"k", 4},
    {"v", 4},              {"attn", 4},         {"o", 4},             {"g", 4},
    {"u", 4},              {"m", 4},            {"ones", 4},          {"ple_ctx", 4},
    {"ple", 4},            {"logits", 4},       {"sel_slices", 8},    {"sel_top", 8},
    {"sel_info", 4},       {"pen", 4},          {"hi", 2},            {"y2", 4},
    {"part_o", 4},         {"part_ml", 4},      {"scores", 4},        {"score_ptrs", 8},
    {"router_logits", 4},  {"sel_w", 4},        {"sel_id", 4},        {"xr", 4},
    {"moe_mx", 4},         {"moe_mh", 2},       {"group_experts", 4}, {"group_offsets", 4},
    {"group_entries", 4},  {"expert_in", 4},    {"expert_hidden", 4}, {"expert_slots", 4},
    {"batch_pos", 4},      {"batch_slot", 4},   {"batch_next", 4},    {"rope_sliding", 4},
    {"rope_full", 4},      {"all_logits", 4},   {"kv_table", 4},      {"kv_gather", 1},
}};
// clang-format on

namespace {

int64_t clamp_ctx(const ModelConfig& c, int64_t ctx) {
    return std::max<int64_t>(1, std::min<int64_t>(ctx, c.max_positions));
}
int clamp_chunk(int64_t ctx, int chunk) {
    return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(chunk, ctx)));
}

// The widest layer's shapes, as CudaModel::widths() takes them.
struct Widths {
    int64_t q = 0, kv = 0, mlp = 0, head = 0, head_sliding = 0, head_full = 0;
};
Widths widths(const ModelConfig& c) {
    Widths w;
    for (const LayerSpec& s : c.layers) {
        w.q = std::max<int64_t>(w.q, int64_t{c.n_heads} * s.head_dim);
        w.kv = std::max<int64_t>(w.kv, int64_t{s.n_kv_heads} * s.head_dim);
        w.mlp = std::max<int64_t>(w.mlp, s.mlp_width);
        w.head = std::max<int64_t>(w.head, s.head_dim);
        (s.kind == AttentionKind::Sliding ? w.head_sliding : w.head_full) = s.head_dim;
    }
    return w;
}

// Decode attention's pieces: each layer's decode_attention_splits for any GPU (the model's own cap, ~2 waves
// of its SMs, is never larger); prefill attention takes 4 per row.
int64_t attention_pieces(const ModelConfig& c, int64_t ctx, int chunk) {
    const int64_t nH = std::max(c.n_heads, 1);
    int64_t pieces = int64_t{chunk} * nH * 4;
    for (const LayerSpec& s : c.layers) {
        const int64_t range =
            s.kind == AttentionKind::Sliding ? std::min<int64_t>(c.sliding_window, ctx) : ctx;
        pieces = std::max(pieces, nH * decode_attention_splits(range, c.n_heads, 0));
    }
    return pieces;
}

// The decode step's state, the activations and the dense GEMMs' and attention's scratch (alloc_step).
void step_buffers(const ModelConfig& c, const Widths& wd, CudaBuffers& b) {
    const CudaBufferSpec& s = b.spec;
    const int64_t H = c.hidden, nH = c.n_heads, P = c.ple_dim, LP = int64_t{c.n_layers} * P, n = s.chunk;
    auto set = [&](CudaBuf k, int64_t v) { b.count[static_cast<size_t>(k)] = v; };
    set(CudaBuf::kState, 4);
    set(CudaBuf::kIds, n);
    set(CudaBuf::kOutIds, s.ctx);
    set(CudaBuf::kArgmax, 1);
    set(CudaBuf::kX, n * H);
    set(CudaBuf::kCounter, 1);
    set(CudaBuf::kXn, H);
    set(CudaBuf::kAttnCounters, nH);
    if (s.gemv_ring) {  // rows of the widest one-token GEMV: q + k + v, the MLP, the PLE projections, router
        int64_t rows = std::max({H, wd.mlp, P, c.moe ? int64_t{c.n_experts} : 0, LP});
        for (const LayerSpec& l : c.layers)
            rows = std::max<int64_t>(rows, (nH + 2 * l.n_kv_heads) * int64_t{l.head_dim});
        set(CudaBuf::kRingPart, CudaBuffers::kGemvRingWarps * 2 * 3);
        set(CudaBuf::kRingCount, rows);
    }
    for (CudaBuf k : {CudaBuf::kQ, CudaBuf::kAttn}) set(k, n * wd.q);
    for (CudaBuf k : {CudaBuf::kK, CudaBuf::kV}) set(k, n * std::max<int64_t>(wd.kv, 1));
    set(CudaBuf::kO, n * H);
    for (CudaBuf k : {CudaBuf::kG, CudaBuf::kU}) set(k, n * std::max(wd.mlp, P));
    set(CudaBuf::kM, (s.sharded && c.moe ? 2 : 1) * n * H);  // sharded MoE: dense and experts' partials
    if (c.moe) set(CudaBuf::kOnes, n);
    if (P) {
        set(CudaBuf::kPleCtx, n * LP);
        set(CudaBuf::kPle, n * LP);
    }
    const int64_t V = c.vocab_size, slice = CudaBuffers::kTopKSlice, top = CudaBuffers::kTopKMax;
    set(CudaBuf::kLogits, V);
    if (V <= slice / top * slice) {  // the device-side top-k; a wider vocabulary samples on the host
        // candidates, their counts and the penalty windows for every row of a batched step (one sequence: 1)
        const int64_t rows = s.slots > 1 ? std::min<int64_t>(s.chunk, s.slots) : 1;
        const int64_t slices_rows = std::min<int64_t>(rows, CudaBuffers::kTopKRowsMax);  // one launch's rows
        set(CudaBuf::kSelSlices, slices_rows * ((V + slice - 1) / slice) * top);
        set(CudaBuf::kSelTop, rows * top);
        set(CudaBuf::kSelInfo, rows * 2);
        set(CudaBuf::kPen, rows * 2 * CudaBuffers::kMaxPenaltyIds);
    }
    set(CudaBuf::kHi, 2 * n * std::max({H, wd.q, wd.mlp, P}));  // bf16 hi, then lo
    b.y2_cols = std::max({LP, wd.q, wd.kv, H, wd.mlp, P});
    set(CudaBuf::kY2, 2 * std::min<int64_t>(n, kGemmStackMaxN) * b.y2_cols);
    b.max_pieces = attention_pieces(c, s.ctx, s.chunk);
    set(CudaBuf::kPartO, b.max_pieces * wd.head);
    set(CudaBuf::kPartMl, 2 * b.max_pieces);
    const int64_t rows = s.attn_gemm_rows > 0 ? s.attn_gemm_rows : std::min<int64_t>(n * nH, 1 << 24);
    set(CudaBuf::kScores, rows * attn_gemm_keys(c, s.ctx, s.chunk));
    set(CudaBuf::kScorePtrs, 6 * nH);
}

// The MoE's routing and its experts' scratch (alloc_moe): the tokens' inputs as bf16 halves (or one f16
// array) and the GeGLU rows of every entry as bf16 halves (or one f16 array), for moe_gemm and moe_stream.
void moe_buffers(const ModelConfig& c, CudaBuffers& b) {
    const int64_t H = c.hidden, E = c.n_experts, K = c.top_k, Ie = c.expert_width, n = b.spec.chunk;
    auto set = [&](CudaBuf k, int64_t v) { b.count[static_cast<size_t>(k)] = v; };
    set(CudaBuf::kRouterLogits, n * E);
    set(CudaBuf::kSelW, n * K);
    set(CudaBuf::kSelId, n * K);
    if (!b.spec.sharded) set(CudaBuf::kXr, H);  // the prenormed router input (one GPU only)
    set(CudaBuf::kMx, n * H);                   // 2 x bf16 [n][H] as fp32 words
    set(CudaBuf::kMh, 2 * n * K * Ie);
    set(CudaBuf::kGroupExperts, std::max(E, K) + 1);
    set(CudaBuf::kGroupOffsets, std::max(E, K) + 1);
    set(CudaBuf::kGroupEntries, n * K);
    set(CudaBuf::kExpertIn, n * H);
    set(CudaBuf::kExpertHidden, n * K * Ie);
    set(CudaBuf::kExpertSlots, n * K * H);
}

// The KV cache (K and V per layer with its own cache; sliding layers hold a ring of min(ctx, window + chunk)
// positions per slot; full layers one slot's whole context, or with slots a pool of blocks), batched decode's
// arrays, the block tables and prefill's gather, and the RoPE tables (alloc_cache).
void cache_buffers(const ModelConfig& c, const Widths& wd, CudaBuffers& b) {
    const CudaBufferSpec& s = b.spec;
    auto set = [&](CudaBuf k, int64_t v) { b.count[static_cast<size_t>(k)] = v; };
    b.kv_cap.assign(c.layers.size(), 0);
    b.kv_elems.assign(c.layers.size(), 0);
    b.kv_paged.assign(c.layers.size(), 0);
    if (s.paged()) {
        b.kv_table_stride = kv_blocks_per_slot(s.ctx);
        b.kv_blocks = s.kv_blocks > 0 ? s.kv_blocks : s.slots * b.kv_table_stride;
    }
    int64_t full_row = 0;  // the widest paged layer's K row (nKV * d)
    int64_t widened = 0;   // fp8: the most elements of one slot's K of a layer, which prefill widens to bf16
    for (size_t i = 0; i < c.layers.size(); ++i) {
        const LayerSpec& l = c.layers[i];
        if (!l.has_own_kv()) continue;  // KV-shared layers read their source's cache
        const int64_t row = int64_t{l.n_kv_heads} * l.head_dim;
        const bool sliding = l.kind == AttentionKind::Sliding;
        b.kv_cap[i] = sliding ? std::min<int64_t>(s.ctx, int64_t{c.sliding_window} + s.chunk) : s.ctx;
        b.kv_paged[i] = s.paged() && !sliding;
        b.kv_elems[i] = b.kv_paged[i] ? b.kv_blocks * kKvBlock * row : b.kv_cap[i] * row * s.slots;
        if (b.kv_paged[i]) full_row = std::max(full_row, row);
        widened = std::max(widened, b.kv_cap[i] * row);
    }
    if (s.slots > 1)
        for (CudaBuf k : {CudaBuf::kBatchPos, CudaBuf::kBatchSlot, CudaBuf::kBatchNext}) set(k, s.chunk);
    if (s.paged()) set(CudaBuf::kKvTable, s.slots * b.kv_table_stride);
    // fp8: K then V of the largest layer, bf16: a fifth of what the 31B's ten full layers hold in fp8 at any
    // context (~2 GB at 262k positions for one sequence)
    if (s.kv_elem_bytes == 1)
        set(CudaBuf::kKvGather, 2 * widened * 2);
    else if (s.paged())
        set(CudaBuf::kKvGather, 2 * s.ctx * full_row * s.kv_elem_bytes);  // K then V, positions [0, ctx)
    set(CudaBuf::kRopeSliding, wd.head_sliding / 2);  // RopeParams::inverse_frequencies: d / 2
    set(CudaBuf::kRopeFull, wd.head_full / 2);
    set(CudaBuf::kAllLogits, int64_t{s.chunk} * c.vocab_size);
}

}  // namespace

int decode_attention_splits(int64_t range, int n_heads, int sms) {
    const int64_t nH = std::max(n_heads, 1), min_keys = CudaBuffers::kAttnMinKeys;
    const int64_t blocks = sms > 0 ? std::min(2 * sms, kMaxDecodePieces) : kMaxDecodePieces;
    return static_cast<int>(
        std::clamp<int64_t>((range + min_keys - 1) / min_keys, 1, std::max<int64_t>(1, blocks / nH)));
}

uint64_t CudaBuffers::eager_bytes() const {
    uint64_t sum = 0;
    for (size_t i = 0; i < count.size(); ++i)
        if (eager(static_cast<CudaBuf>(i))) sum += bytes(static_cast<CudaBuf>(i));
    return sum;
}

uint64_t CudaBuffers::kv_bytes() const {
    uint64_t sum = 0;
    for (int64_t elems : kv_elems)
        sum += 2 * static_cast<uint64_t>(elems) * static_cast<uint64_t>(spec.kv_elem_bytes);
    return sum;
}

uint64_t CudaBuffers::kv_block_bytes() const {
    if (kv_blocks == 0) return 0;
    uint64_t sum = 0;
    for (size_t i = 0; i < kv_elems.size(); ++i)
        if (kv_paged[i])
            sum += 2 * static_cast<uint64_t>(kv_elems[i] / kv_blocks) *
                   static_cast<uint64_t>(spec.kv_elem_bytes);
    return sum;
}

CudaBuffers cuda_buffers(const ModelConfig& c, const CudaBufferSpec& spec) {
    CudaBuffers b;
    b.spec = spec;
    b.spec.ctx = std::max<int64_t>(1, spec.ctx);
    b.spec.chunk = std::max(1, spec.chunk);
    b.spec.slots = std::max(1, spec.slots);
    const Widths wd = widths(c);
    step_buffers(c, wd, b);
    if (c.moe) moe_buffers(c, b);
    cache_buffers(c, wd, b);
    return b;
}

std::string format_gb(uint64_t bytes) {
    char s[32];
    std::snprintf(s, sizeof s, "%.1f GB", static_cast<double>(bytes) / 1e9);
    return s;
}

CudaMemoryPlan plan_cuda_memory(const ModelConfig& c, uint64_t weight_bytes, int64_t ctx, int chunk,
                                int slots, int kv_elem_bytes, int64_t kv_blocks) {
    CudaMemoryPlan p;
    p.ctx = clamp_ctx(c, ctx);
    p.chunk = clamp_chunk(p.ctx, chunk);
    p.slots = std::max(1, slots);
    p.weights = weight_bytes;
    // one GPU with the default tuning: the cp.async GeGLU ring runs the MoE's decode GEMVs
    CudaBufferSpec spec;
    spec.ctx = p.ctx;
    spec.chunk = p.chunk;
    spec.slots = p.slots;
    spec.gemv_ring = c.moe;
    spec.kv_elem_bytes = kv_elem_bytes;
    spec.kv_blocks = kv_blocks;
    const CudaBuffers b = cuda_buffers(c, spec);
    p.kv_cache = b.kv_bytes();
    p.workspace = b.eager_bytes() + kCudaRuntimeReserve;
    return p;
}

uint64_t cuda_kv_cache_bytes(const ModelConfig& c, int64_t ctx, int chunk, int slots, int kv_elem_bytes,
                             int64_t kv_blocks) {
    return plan_cuda_memory(c, 0, ctx, chunk, slots, kv_elem_bytes, kv_blocks).kv_cache;
}

int64_t fit_kv_blocks(const ModelConfig& c, uint64_t weight_bytes, int64_t ctx, int chunk, int slots,
                      int kv_elem_bytes, uint64_t budget) {
    if (slots < 2) return 0;
    // the plan is linear in the pool: its total at one sequence's context, plus a block's bytes per block
    const int64_t one = kv_blocks_per_slot(clamp_ctx(c, ctx));
    const CudaMemoryPlan p = plan_cuda_memory(c, weight_bytes, ctx, chunk, slots, kv_elem_bytes, one);
    if (p.total() > budget) return 0;
    CudaBufferSpec spec;
    spec.ctx = p.ctx;
    spec.chunk = p.chunk;
    spec.slots = p.slots;
    spec.kv_elem_bytes = kv_elem_bytes;
    spec.kv_blocks = one;
    const uint64_t per_block = cuda_buffers(c, spec).kv_block_bytes();
    if (per_block == 0) return one;
    return one + static_cast<int64_t>(std::min<uint64_t>((budget - p.total()) / per_block, INT32_MAX - one));
}

uint64_t cuda_workspace_bytes(const ModelConfig& c, int64_t ctx, int chunk, int slots) {
    return plan_cuda_memory(c, 0, ctx, chunk, slots).workspace;
}

FitCheck check_cuda_fit(const ModelConfig& c, uint64_t weight_bytes, int64_t ctx, int chunk, int slots,
                        uint64_t free_bytes, const std::string& device, int kv_elem_bytes,
                        int64_t kv_blocks) {
    FitCheck f;
    const CudaMemoryPlan p = plan_cuda_memory(c, weight_bytes, ctx, chunk, slots, kv_elem_bytes, kv_blocks);
    auto fits_at = [&](int64_t x) {
        return plan_cuda_memory(c, weight_bytes, x, chunk, slots, kv_elem_bytes, kv_blocks).total() <=
               free_bytes;
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
    const std::string cache_for =
        p.slots > 1 ? std::to_string(p.slots) + " sequences of " + std::to_string(p.ctx) + " positions"
                    : std::to_string(p.ctx) + " tokens";
    f.message = "model " + format_gb(p.weights) + " + KV cache for " + cache_for + " " +
                format_gb(p.kv_cache) + " + workspace " + format_gb(p.workspace) + " = " +
                format_gb(p.total()) + (f.fits ? " <= " : " > ") + format_gb(free_bytes) + " free on " +
                device;
    if (f.fits) return f;
    if (f.max_ctx > 0) {
        f.message += "; lower --ctx-size to at most " + std::to_string(f.max_ctx);
        if (p.slots > 1)
            f.message += " (or run fewer sequences with --parallel, or a smaller --batch-size)";
        else if (p.chunk > 1)
            f.message += " (or --batch-size, which sizes the workspace)";
    } else if (p.slots > 1 &&
               plan_cuda_memory(c, weight_bytes, 1, chunk, 1, kv_elem_bytes).total() <= free_bytes) {
        f.message += "; not even one position fits for each of " + std::to_string(p.slots) +
                     " sequences: run fewer with --parallel";
    } else {
        f.message +=
            "; the weights and workspace alone do not fit: use a smaller model, a larger GPU, or "
            "--device cpu";
    }
    return f;
}

}  // namespace markbase
