// Memory honesty for the CUDA backend (issue 5): before any weight moves, add up what the device must hold
// (weights, the KV cache for the requested context, activations and scratch) and compare it with the free
// memory, so a model that cannot fit is refused with the numbers and the largest context that would fit,
// instead of failing half-way through the upload. The sizes mirror cuda/model.cu's constructor (fp32 K
// and V per layer with its own cache; sliding layers hold a ring of min(ctx, window + chunk) positions);
// a change there must be mirrored here (tests/loading/test_memory_plan.cpp pins the arithmetic).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "model/config.h"

namespace markbase {

struct CudaMemoryPlan {
    int64_t ctx = 0;  // after clamping to max_positions, as the backend does
    int chunk = 0;    // after clamping to ctx
    uint64_t weights = 0;
    uint64_t kv_cache = 0;
    uint64_t workspace = 0;  // activations, scratch, decode state, RoPE tables + a fixed runtime reserve
    uint64_t total() const { return weights + kv_cache + workspace; }
};

// Headroom for what is not a cudaMalloc of ours: cuBLAS workspaces, the CUDA graph, allocation rounding.
constexpr uint64_t kCudaRuntimeReserve = uint64_t{256} << 20;

// The MoE prefill's batched-GEMM scratch holds this many token rows per expert (a layer whose busiest expert
// has more falls back to the grouped GEMV kernels): 4x the mean load of a full chunk, at least 64.
inline int moe_prefill_rows_cap(int chunk, int n_experts, int top_k) {
    if (n_experts <= 0) return 0;
    const int64_t mean = (int64_t{chunk} * top_k + n_experts - 1) / n_experts;
    return static_cast<int>(std::min<int64_t>(chunk, std::max<int64_t>(64, 4 * mean)));
}
// A GEMM over at most this many rows of fp32 activations (per expert, for the MoE's batched GEMMs) runs as
// one bf16 GEMM over the stacked [hi; lo] halves, which reads the weights once, into an fp32 scratch of
// twice the output rows whose halves are then summed.
constexpr int kGemmStackMaxN = 128;
// Bytes of that scratch: gathered inputs (bf16 hi + lo, reused for the fp32 down output), gate and up
// outputs (fp32), the GeGLU result (bf16 hi + lo), and the stacked GEMMs' output ([E][2 rows][max(2 Ie,
// H)] fp32, for the passes of at most kGemmStackMaxN rows per expert).
inline uint64_t moe_prefill_scratch_bytes(const ModelConfig& c, int chunk) {
    if (!c.moe) return 0;
    const int cap = moe_prefill_rows_cap(chunk, c.n_experts, c.top_k);
    const uint64_t rows = static_cast<uint64_t>(c.n_experts) * cap;
    const uint64_t stacked = static_cast<uint64_t>(c.n_experts) * 2 * std::min(cap, kGemmStackMaxN) *
                             std::max<uint64_t>(2 * static_cast<uint64_t>(c.expert_width), c.hidden) * 4;
    return rows * (4 * static_cast<uint64_t>(c.hidden) + 12 * static_cast<uint64_t>(c.expert_width)) +
           stacked;
}

// Prefill attention as GEMMs (cuda/kernels/attention_gemm.cu): fp32 scores for every query
// head of a chunk over up to this many key slots, or the sliding layers' whole ring where that is longer
// (never past the context); longer key ranges (full layers deep into a long prompt) run in head and row
// batches of the same scratch.
constexpr int64_t kAttnGemmKeys = 2048;
inline int64_t attn_gemm_keys(const ModelConfig& c, int64_t ctx, int chunk) {
    return std::min<int64_t>(ctx, std::max<int64_t>(kAttnGemmKeys, int64_t{c.sliding_window} + chunk));
}

uint64_t cuda_kv_cache_bytes(const ModelConfig& c, int64_t ctx, int chunk);
uint64_t cuda_workspace_bytes(const ModelConfig& c, int64_t ctx, int chunk);  // reserve included
CudaMemoryPlan plan_cuda_memory(const ModelConfig& c, uint64_t weight_bytes, int64_t ctx, int chunk);

struct FitCheck {
    bool fits = true;
    int64_t max_ctx = 0;  // the largest context that fits with this chunk (0: not even the weights fit)
    std::string message;  // one line: the sum, what it exceeds, and what to change
};
// `device` names the GPU in the message ("NVIDIA H200").
FitCheck check_cuda_fit(const ModelConfig& c, uint64_t weight_bytes, int64_t ctx, int chunk,
                        uint64_t free_bytes, const std::string& device);

std::string format_gb(uint64_t bytes);  // "50.5 GB" (decimal, as the receipts)

}  // namespace markbase
