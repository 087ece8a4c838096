// Memory honesty for the CUDA backend (issue 5): before any weight moves, add up what the device must hold
// (weights, the KV cache of every sequence slot for the requested context, activations and scratch) and
// compare it with the free memory, so a model that cannot fit is refused with the numbers and the largest
// context that would fit, instead of failing half-way through the upload.
//
// The sizes have one source: cuda_buffers() lists every device buffer CudaModel allocates. cuda/buffers.cu
// allocates exactly those counts, and after construction compares the bytes it allocated with the list's
// (an internal error naming the difference, so the GPU tests catch drift); plan_cuda_memory sums the same
// list. Plain C++ (no CUDA headers), so the fit check and its tests build and run without a GPU.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace markbase {

// Headroom for what is not a cudaMalloc of ours: cuBLAS workspaces, the CUDA graph, allocation rounding.
constexpr uint64_t kCudaRuntimeReserve = uint64_t{256} << 20;

// A GEMM over at most this many rows of fp32 activations runs as one bf16 GEMM over the stacked [hi; lo]
// halves, which reads the weights once, into an fp32 scratch of twice the output rows whose halves are
// then summed.
constexpr int kGemmStackMaxN = 128;

// Prefill attention as GEMMs (cuda/kernels/attention_gemm.cu): fp32 scores for every query
// head of a chunk over up to this many key slots, or the sliding layers' whole ring where that is longer
// (never past the context); longer key ranges (full layers deep into a long prompt) run in head and row
// batches of the same scratch.
constexpr int64_t kAttnGemmKeys = 2048;
inline int64_t attn_gemm_keys(const ModelConfig& c, int64_t ctx, int chunk) {
    return std::min<int64_t>(ctx, std::max<int64_t>(kAttnGemmKeys, int64_t{c.sliding_window} + chunk));
}

// The paged KV cache (more than one sequence slot): the full-attention layers' K and V live in a pool of
// blocks of kKvBlock positions, found through a block table per slot (runtime/kv_blocks.h keeps the tables);
// sliding layers keep a ring of min(ctx, window + chunk) positions per slot, which never holds more than a
// query can read.
constexpr int kKvBlock = 16;
constexpr int kKvBlockShift = 4;  // log2(kKvBlock)
inline int64_t kv_blocks_per_slot(int64_t ctx) {
    return (ctx + kKvBlock - 1) / kKvBlock;
}

// Decode attention's pieces per layer: at most this many blocks (the model takes ~2 waves of its SMs, never
// more than this, so the scratch sized here holds any GPU's pieces).
constexpr int kMaxDecodePieces = 512;
// The decode graph's attention pieces per head for a layer whose key range is at most `range`: pieces of at
// least 16 keys (CudaBuffers::kAttnMinKeys, kernels.h kAttnMinKeys), at most ~2 waves of blocks over `sms`
// SMs and never more than kMaxDecodePieces blocks a layer; sms 0: the bound any GPU stays within.
int decode_attention_splits(int64_t range, int n_heads, int sms);

// What besides the config decides CudaModel's buffers. plan_cuda_memory uses the one-GPU defaults.
struct CudaBufferSpec {
    int64_t ctx = 1;  // as the model holds it (plan_cuda_memory clamps first, as the backend does)
    int chunk = 1;
    int slots = 1;               // sequences with a KV cache each (batched decode)
    bool sharded = false;        // a tensor-parallel rank: MoE partials doubled, no prenormed router input
    bool gemv_ring = false;      // the cp.async GeGLU ring (Tuning::gemv; by default the MoE on one GPU)
    int64_t attn_gemm_rows = 0;  // Tuning::attn_gemm_rows (tests); 0: every query head of a chunk
    int kv_elem_bytes = 2;       // the KV cache's element: 1 e4m3, 2 bf16, 4 fp32 (kv_dtype.h's gpu_kv_bytes)
    int64_t kv_blocks = 0;       // paged (slots > 1): the pool's blocks; 0: every slot's whole context
    bool paged() const { return slots > 1; }
};

// Every device buffer of CudaModel but the KV cache (CudaBuffers::kv_*), in the order buffers.cu takes them.
// clang-format off
enum class CudaBuf : int {
    // the decode step's state and the device-side top-k (int, u64 or uint as named in kCudaBufInfo)
    kState, kIds, kOutIds, kArgmax, kX, kCounter, kXn, kAttnCounters, kRingPart, kRingCount,
    // activations and the GEMMs' / attention's scratch
    kQ, kK, kV, kAttn, kO, kG, kU, kM, kOnes, kPleCtx, kPle, kLogits, kSelSlices, kSelTop, kSelInfo, kPen,
    kHi, kY2, kPartO, kPartMl, kScores, kScorePtrs,
    // the MoE's routing and experts' scratch
    kRouterLogits, kSelW, kSelId, kXr, kMx, kMh, kGroupExperts, kGroupOffsets,
    kGroupEntries, kExpertIn, kExpertHidden, kExpertSlots,
    // batched decode's per-token arrays, the RoPE tables, all rows' logits
    kBatchPos, kBatchSlot, kBatchNext, kRopeSliding, kRopeFull, kAllLogits,
    // the paged cache's block tables [slots][blocks per slot] and prefill's gather of one slot's K and V
    kKvTable, kKvGather,
    kCount
};
// clang-format on
struct CudaBufInfo {
    const char* name;
    int elem_bytes;
};
extern const std::array<CudaBufInfo, static_cast<size_t>(CudaBuf::kCount)> kCudaBufInfo;

struct CudaBuffers {
    // Mirrors of cuda/kernels/kernels.h's and CudaModel's constants (buffers.cu static_asserts they agree).
    static constexpr int kTopKMax = 64, kTopKSlice = 4096, kMaxPenaltyIds = 1024, kAttnMinKeys = 16,
                         kTopKRowsMax = 128;
    // The cp.async GeGLU ring's partial sums: 2 blocks of 8 warps per SM on up to 256 SMs (a larger GPU's
    // launch falls back to the warp-per-row kernel, which needs none).
    static constexpr int64_t kGemvRingWarps = 2 * 8 * 256;

    CudaBufferSpec spec;
    std::array<int64_t, static_cast<size_t>(CudaBuf::kCount)> count{};  // elements; 0: not allocated
    // shapes buffers.cu needs beyond the counts
    int64_t y2_cols = 0;            // the dense GEMMs' stacked output width
    int64_t max_pieces = 0;         // attention pieces part_o / part_ml hold
    std::vector<int64_t> kv_cap;    // [L] positions per slot (sliding: a ring); 0: KV-shared layer
    std::vector<int64_t> kv_elems;  // [L] elements of the layer's K (or V): every slot's ring, or the pool
    std::vector<char> kv_paged;     // [L] the layer's K and V are the pool's blocks
    int64_t kv_blocks = 0;          // the pool (paged), resolved; 0: not paged
    int64_t kv_table_stride = 0;    // block table entries per slot (paged)

    int64_t operator[](CudaBuf b) const { return count[static_cast<size_t>(b)]; }
    static const char* name(CudaBuf b) { return kCudaBufInfo[static_cast<size_t>(b)].name; }
    uint64_t bytes(CudaBuf b) const {
        return static_cast<uint64_t>((*this)[b]) * kCudaBufInfo[static_cast<size_t>(b)].elem_bytes;
    }
    // All rows' logits are allocated on first use by one sequence (perplexity's all_logits; not counted, as
    // docs/loading.md says) and at construction with slots, whose batched decode always needs them.
    bool eager(CudaBuf b) const { return b != CudaBuf::kAllLogits || spec.slots > 1; }
    uint64_t eager_bytes() const;     // what the constructor allocates besides the KV cache
    uint64_t kv_bytes() const;        // K and V of every slot of every layer with its own cache
    uint64_t kv_block_bytes() const;  // K and V of one pool block over the paged layers (0: not paged)
};
CudaBuffers cuda_buffers(const ModelConfig& c, const CudaBufferSpec& spec);

struct CudaMemoryPlan {
    int64_t ctx = 0;  // after clamping to max_positions, as the backend does
    int chunk = 0;    // after clamping to ctx
    int slots = 1;
    uint64_t weights = 0;
    uint64_t kv_cache = 0;   // every slot's
    uint64_t workspace = 0;  // CudaBuffers::eager_bytes() + kCudaRuntimeReserve
    uint64_t total() const { return weights + kv_cache + workspace; }
};

// kv_elem_bytes: the KV cache's element size, 1 (e4m3), 2 (bf16) or 4 (fp32); the backend's choice is
// runtime/kv_dtype.h's gpu_kv_bytes (auto: bf16 with more than one slot, fp32 for one sequence)
// kv_blocks: the paged pool (slots > 1; 0: every slot's whole context, CudaBufferSpec::kv_blocks)
uint64_t cuda_kv_cache_bytes(const ModelConfig& c, int64_t ctx, int chunk, int slots, int kv_elem_bytes = 2,
                             int64_t kv_blocks = 0);
uint64_t cuda_workspace_bytes(const ModelConfig& c, int64_t ctx, int chunk, int slots);  // reserve included
CudaMemoryPlan plan_cuda_memory(const ModelConfig& c, uint64_t weight_bytes, int64_t ctx, int chunk,
                                int slots, int kv_elem_bytes = 2, int64_t kv_blocks = 0);
// The largest paged pool (slots > 1) whose plan fits in `budget` bytes (weights included), or 0 when not
// even one sequence's whole context (kv_blocks_per_slot(ctx) blocks) fits.
int64_t fit_kv_blocks(const ModelConfig& c, uint64_t weight_bytes, int64_t ctx, int chunk, int slots,
                      int kv_elem_bytes, uint64_t budget);

struct FitCheck {
    bool fits = true;
    int64_t max_ctx = 0;  // the largest context that fits with this chunk and slots (0: not even 1 fits)
    std::string message;  // one line: the sum, what it exceeds, and what to change
};
// `device` names the GPU in the message ("NVIDIA H200").
FitCheck check_cuda_fit(const ModelConfig& c, uint64_t weight_bytes, int64_t ctx, int chunk, int slots,
                        uint64_t free_bytes, const std::string& device, int kv_elem_bytes = 2,
                        int64_t kv_blocks = 0);

std::string format_gb(uint64_t bytes);  // "50.5 GB" (decimal, as the receipts)

}  // namespace markbase
