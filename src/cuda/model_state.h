// CudaModel's plain-data state (cuda/model.h): the decode plan, the step's device state, the activations and
// the MoE's scratch, and the prefill experts' counters. model.cu decides the plan, buffers.cu allocates the
// rest.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "cuda/kernels/kernels.h"
#include "loading/memory_plan.h"
#include "model/bf16.h"

namespace markbase::cuda {

// The 26B's prefill experts since the model was built (the bench receipt shows how its layers ran).
struct MoePrefillStats {
    int moe_gemm_layers = 0;       // prefill layers through moe_gemm (grouped on the device)
    int moe_gemm_fp8_layers = 0;   // those of them reading FP8 experts
    int moe_gemm_int4_layers = 0;  // and int4
    int gemv_layers = 0;           // through the grouped GEMV kernels (widths moe_gemm does not tile)
    int stream_layers = 0;  // batched-step layers recorded through moe_stream (a graph's once, at capture)
    int stream_fp8_layers = 0;   // those of them reading FP8 experts
    int stream_int4_layers = 0;  // and int4
};

// CudaModel's state, plain data (model.cu decides the plan, buffers.cu allocates the rest). Shapes: n = the
// chunk (prefill tokens, or batched decode's sequences), H = hidden, V = vocabulary (a rank's columns when
// sharded), L = layers, P = PLE width, E = experts, K = experts per token, Ie = expert width, nH = query
// heads; q, kv, mlp = the widest layer's q, k/v and MLP widths.

// What the tuning and the model's shape decide for the decode step (plan_decode).
// The decode step's graphs by the range of positions they serve, in the order positions reach them
// (CudaModel::step_range)
enum class StepRange : uint8_t { kShort, kGeneral, kLong };

struct DecodePlan {
    // The decode GEMVs (GemvInput): the kernel (Tuning::gemv), the split GeGLU and min_waves (one GPU),
    // and the cp.async GeGLU's pieces and row counters for the launches on stream_ (a GEMV on moe_.stream2
    // runs beside them and takes the warp-per-row kernel)
    GemvKernel gemv_kernel = GemvKernel::kRows;
    bool geglu_split = false;
    int min_waves = 0;
    bool fp8_long_buffers = false;  // the dense models (GemvInput)
    GemvStreamScratch gemv_stream;
    bool prenorm = false;  // residual updates write the next GEMV's normalised input (CudaModel::pending_)
    bool moe_prenorm = false;        // ... and on the MoE, the router's and the experts' inputs
    std::vector<int> decode_splits;  // [L] attention pieces per head at decode
    // Decode attention: pieces of at least kAttnMinKeys keys, at most ~2 waves of blocks per layer, only
    // the pieces holding keys run, the last one merges. While a step's position is below attn_short_keys
    // (16 pieces of kAttnMinKeys keys; Tuning::attn_cluster) it runs a second graph whose pieces (<= 16
    // per head) are one thread-block cluster per head, merging through distributed shared memory
    // (attention.cu). 0 = one graph.
    int64_t attn_short_keys = 0;
    // Batched decode's attention (Tuning::batch_attn_keys, _heads, batch_attn; cuda/prefill.cu's pieces)
    int batch_attn_keys = 64;
    int batch_attn_heads = 0;
    bool batch_attn_mma = false;
    // The one-sequence decode graph's full layers over a bf16 or fp8 cache on the batched step's tensor-core
    // pieces (Tuning::decode_attn; step.cu record_attention_mma) in a third graph for steps past this many
    // keys (CudaModel::step_range); 0 = never.
    int64_t attn_long_keys = 0;
    // The projections of at most stream_gemm_max tokens (a batched step, a short chunk) run stream_gemm
    // (Tuning::stream_gemm), each weight read once on the tensor cores, instead of cuBLAS over the stacked
    // halves; sms sizes its K split.
    int stream_gemm_max = kStreamGemmMaxN;
    // With the bf16 operand (gemm_bf16), the projections of up to tile_gemm_max tokens that stream_gemm does
    // not take run tile_gemm where it pays (Tuning::tile_gemm).
    int tile_gemm_max = 0;
    // A batched step of at most batch_experts_max sequences runs the MoE's experts on the device (moe_stream,
    // Tuning::batch_experts) and is captured as one graph; more run prefill_experts' path (moe_gemm).
    int batch_experts_max = 0;
    // A prefill chunk's experts run moe_gemm where it tiles the widths (Tuning::moe_gemm), else the grouped
    // GEMV kernels.
    bool moe_gemm = true;
    // The cuBLAS products take their inputs' bf16 rounding alone (Tuning::gemm_inputs), not both halves.
    bool gemm_bf16 = false;
    int sms = 0;
};

// The decode step's device state: what the graph reads and writes between tokens, and the device-side top-k
// for sampling (decode_select) with its pinned host mirrors.
struct StepState {
    // [4]: [0] next token, [1] its position, [2] ids produced by decode_greedy so far, [3] 0: the one
    // sequence's slot for kernels that take each token's slot (its rows are already the current slot's)
    int* d_state = nullptr;
    int* h_state = nullptr;                   // pinned [4]
    int* h_ids = nullptr;                     // pinned [n]
    int* d_ids = nullptr;                     // [n]
    int* d_out_ids = nullptr;                 // [ctx] decode_greedy's ids
    unsigned long long* d_argmax = nullptr;   // [1] the step's argmax key (sampling.cu)
    unsigned int* d_counter = nullptr;        // [1] lm_head's finished blocks
    unsigned int* d_attn_counters = nullptr;  // [nH] finished attention pieces per head
    // top-k: slices' winners [ceil(V / kTopKSlice) * kTopKMax] (for min(sel_rows, kTopKRowsMax) rows), the k
    // best [kTopKMax], [n_finite, bad], the penalty ids then counts [2 kMaxPenaltyIds]; null when V is too
    // wide for it
    unsigned long long *d_sel_slices = nullptr, *d_sel_top = nullptr, *h_sel_top = nullptr;
    int *d_sel_info = nullptr, *h_sel_info = nullptr, *d_pen = nullptr, *h_pen = nullptr;
    int sel_rows = 0;  // rows of a batched step the candidates, counts and windows above hold (kTopKMax, 2,
                       // 2 kMaxPenaltyIds each)
};

// Activations, [n][width] row-major, and the scratch of the GEMMs and of decode attention.
struct Activations {
    float* x = nullptr;                // [n][H] the residual stream
    float* q = nullptr;                // [n][q]
    float *k = nullptr, *v = nullptr;  // [n][kv] raw k, v projections
    float* attn = nullptr;             // [n][q] attention output
    float* o = nullptr;                // [n][H] o_proj (and ple_proj) output
    float *g = nullptr, *u = nullptr;  // [n][max(mlp, P)] gate, up (and the PLE gate)
    float* m = nullptr;  // [n][H] the MLP's output (sharded MoE: [2][n][H], dense then experts' partials)
    float *ple_ctx = nullptr, *ple = nullptr;  // [n][L P] per-layer inputs: projection, mixed
    float* logits = nullptr;                   // [V]
    float* all_logits = nullptr;               // [n][V], on first use (at construction with slots)
    float* xn = nullptr;                       // [H] RMSNorm(x) * the next GEMV's norm weight (plan.prenorm)
    float* xr = nullptr;                       // [H] RMSNorm(x) * router_scale / sqrt(H) (plan.moe_prenorm)
    bf16* hi = nullptr;  // prefill GEMM inputs: [n][K] hi, then [n][K] lo (lo_at), K <= max(H, q, mlp, P)
    // A GEMM over at most kGemmStackMaxN tokens (loading/memory_plan.h; batched decode, short prompts; per
    // expert in the MoE prefill) reads its weights once, as one GEMM over [hi; lo] into a scratch whose
    // halves are then summed, instead of one GEMM per half (31B batched decode of 16 -34%, 26B-A4B prefill of
    // 512 +39%; a stacked 512-token chunk lost 3-4%).
    float* y2 = nullptr;  // [2 * min(n, kGemmStackMaxN)][y2_cols] (dense GEMMs)
    int64_t y2_cols = 0;
    float *part_o = nullptr, *part_ml = nullptr;  // [max_pieces][head dim], [max_pieces][2]: attention pieces
    int64_t max_pieces = 0;  // attention pieces the scratch holds (tokens x heads x splits)
};

// The 26B's routing and experts.
struct MoeScratch {
    // routing: router logits [n][E], the selected experts' weights and ids [n][K]; the entries grouped by
    // expert (ids, offsets [max(E, K) + 1], entries [n K]); the experts' input [n][H], GeGLU [n K][Ie] and
    // output slots [n K][H]
    float *rlogits = nullptr, *sel_w = nullptr, *e_in = nullptr, *eh = nullptr, *eslots = nullptr;
    int *sel_id = nullptr, *gexp = nullptr, *goff = nullptr, *gent = nullptr;
    float* ones = nullptr;  // [n] weights of 1 for the combine of one summed expert vector
    // The decode graph runs the routed experts (router, route, gate/up, down) on stream2 beside the dense
    // MLP, forked after o_proj and joined before the combine (26B-A4B -3.9%, tp2 -3.1%)
    cudaStream_t stream2 = nullptr;
    cudaEvent_t fork = nullptr, join = nullptr;
    // The experts' scratch (moe_gemm at prefill, moe_stream in a batched step): the tokens' inputs [2][n][H]
    // (bf16 halves, or one f16 array) and the GeGLU rows [2][n K][Ie] (halves, or one f16 array)
    MoePrefillStats stats;
    void* mx = nullptr;
    bf16* mh = nullptr;
};

}  // namespace markbase::cuda
