// Launchers for MarkBase's CUDA kernels. Every pointer is device memory; every launcher enqueues on `s` and
// checks the launch. Weights are bf16 (raw uint16 bits), activations fp32, accumulation fp32. Shapes follow
// HF's [out, in] layout, so a weight row is one output and rows are contiguous along the input dim.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "model/bf16.h"

namespace markbase::cuda {

// ---- gemv.cu: decode-time y = W @ xn for one or a few tokens, weights streamed with 16-byte loads
// ----------

// The input vector, optionally RMS-normalised on the fly: xn = x * rsqrt(mean(x^2) + eps) * norm_w * scale
// (norm_w may be null = no weight). K must be a multiple of 8; rows are 16-byte aligned.
// Scratch of the asynchronous streaming GEMV (MARKBASE_CUDA_GEMV=async, gemv_rows.cu): each warp's partial
// sums of the (at most two) rows it shares with other warps, and one arrival counter per output row (zero
// between launches). One per stream that runs GEMVs concurrently; without it the launch takes warpk.
struct GemvStreamScratch {
    float* part = nullptr;          // [warps][2][3]
    unsigned int* count = nullptr;  // [rows]
    int64_t warps = 0;              // capacity of part, in warps
    int rows = 0;                   // capacity of count
};

struct GemvInput {
    const float* x = nullptr;
    int K = 0;
    int64_t ldx = 0;  // stride between tokens' x (elements), for ntok > 1
    bool norm = false;
    const bf16* norm_w = nullptr;
    float norm_scale = 1.0f;
    float eps = 1e-6f;

    // Decode-only residual prologue, fusing the kernel that would otherwise precede (one token):
    // x = (res_x + RMSNorm(res_y) * res_w) * res_scale; every block computes it, block 0 also stores it to
    // res_out (never res_x: other blocks are still reading that).
    const float* res_x = nullptr;
    const float* res_y = nullptr;
    const bf16* res_w = nullptr;
    float res_scale = 1.0f;
    float* res_out = nullptr;

    // Tile/grid variant (gemv.cu's table; 0 = legacy). Decode sets it from MARKBASE_CUDA_GEMV (default:
    // warpk; asyncg for the MoE model on one GPU).
    int variant = 0;
    int ksplit = 0;            // split-K variants: K slices (0 = chosen per shape; > 0 forces it, for tests)
    GemvStreamScratch stream;  // variant kGemvVariantAsync at one token
    // Warp-per-row GEMVs at 4 16-byte chunks per lane per matrix (twice the warps per row, the GeGLU at 3
    // blocks per SM instead of 2) instead of 8, when K is at most this (MARKBASE_CUDA_GEMV_U4_MAXK for the
    // plain products, MARKBASE_CUDA_GEGLU_U4_MAXK for the GeGLU). Session 6's H200 A/B: E2B -3.4% (GeGLU,
    // K = 1536) and -2.4% (every plain product at 4); E4B +2.8%, 26B +3.7%, 31B +5.4% with every plain
    // product at 4, where K is 2560 and wider.
    int u4_max_k = 2048;
    int u4_max_k_geglu = 2048;
    // The warp-per-row GeGLU with a row's gate and up products on different warps
    // (MARKBASE_CUDA_GEGLU_SPLIT=1): a plain product's registers, twice the blocks per SM. At 8 chunks per
    // lane only.
    bool geglu_split = false;
    // > 0 (MARKBASE_CUDA_GEMV_MIN_WAVES, 3 by default for one GPU since session 7: with the split GeGLU, 31B
    // -3.5..-5.2%): a warp-per-row launch at 8 chunks per lane and K >= 4096 (session 8: E4B's K = 2560
    // lost 1.7% to it) halves its warps per row while it still has at least this many waves of blocks (the
    // kernel lab's one-warp-per-row v11 ran the 31B's q/k/v at 98% of the roofline; the model's 4 warps per
    // row at ~73%).
    int min_waves = 0;
    // MARKBASE_CUDA_PDL_EARLY=0: the warp-per-row GEMV waits for the previous kernel before its first weight
    // loads (device_common.cuh's pdl_begin_late), as its compiled code did before session 9
    bool pdl_late = false;
    // MARKBASE_CUDA_GEMV_LEAN8 (with lean; default 1 since session 9: 26B-A4B -4.4%): the plain products at 8
    // chunks per lane with no norm and no tail run the lean kernel at 4 chunks per lane, at the warps per row
    // chosen for 8 (40 registers, 6 blocks per SM instead of 64 and 4; the same sums)
    bool lean8 = false;
    // MARKBASE_CUDA_GEGLU_LEAN8 (default 1; with lean and geglu_split, from K = 4096): the split GeGLU at 8
    // chunks per lane with no norm runs the lean split kernel at 4 chunks per lane, at the same warps per row
    // (the same sums)
    bool geglu_lean8 = false;
    // > 0: warps per row for the warp-per-row launch, instead of the rule above (the kernel lab's sweep)
    int force_warps = 0;
    // A warp-per-row launch at 4 chunks per lane without the input norm or a residual tail runs a kernel
    // compiled without them: 6 blocks per SM instead of 4 for the plain products, 4 instead of 3 for the
    // GeGLU (MARKBASE_CUDA_GEMV_LEAN, on by default).
    bool lean = false;
};

// The end of a step, fused into gemv_logits by its last block: argmax -> state[0], state[1] += advance, the
// id appended to out_ids at state[2]++ (when out_ids and state[2] < out_cap). counter: one zeroed uint.
struct StepFinish {
    int* state = nullptr;
    int advance = 1;
    int* out_ids = nullptr;
    int out_cap = 0;
    unsigned int* counter = nullptr;
};

struct GemvSeg {
    const bf16* w = nullptr;  // [rows, K]
    float* y = nullptr;       // [rows] (per token, stride ldy)
    int rows = 0;
    int64_t ldy = 0;
};

// Up to 3 matrices sharing one input in one launch (q/k/v); ntok tokens along grid.y.
void gemv(const GemvInput& in, const GemvSeg* segs, int nseg, int ntok, cudaStream_t s);
// y = gelu_tanh(Wg @ xn) * (Wu @ xn): the GeGLU MLP's first half in one pass.
void gemv_geglu(const GemvInput& in, const bf16* wg, const bf16* wu, int rows, float* y, cudaStream_t s);
// y = gelu_tanh(W @ xn) * aux: the per-layer-embedding gate.
void gemv_gelu_mul(const GemvInput& in, const bf16* w, int rows, const float* aux, float* y, cudaStream_t s);
// logits = softcap(W @ xn) (softcap <= 0: none), and the argmax folded into *argmax_key (see sampling.cu);
// row r is token id id_base + r (a tensor-parallel rank scores its own vocabulary rows).
void gemv_logits(const GemvInput& in, const bf16* w, int rows, float softcap, float* logits,
                 unsigned long long* argmax_key, cudaStream_t s, const StepFinish* finish = nullptr,
                 int64_t id_base = 0);

// ---- gemv_rows.cu: the same products, one warp per row, input norm folded into each warp (one token) ----
// MARKBASE_CUDA_GEMV=warp (or warpk) routes gemv / gemv_geglu / gemv_gelu_mul here when ntok == 1 and there
// is no residual prologue (lm_head keeps gemv_logits). in.x, in.norm_w and the weights must be 16-byte
// aligned.

// ---- peer_sum.cu: tensor-parallel sums over peer-to-peer NVLink at decode (issue 7) ---------------------
constexpr int kMaxPeers = 8;
struct PeerSum {
    int world = 0, rank = 0;                    // world < 2: not set up (the collectives go through NCCL)
    int max_n = 0;                              // floats per inbox row
    float* inbox[kMaxPeers] = {};               // rank q's inbox [2 slots][world][max_n] (peer-mapped)
    unsigned long long* flags[kMaxPeers] = {};  // rank q's arrival flags [world]: the last call of rank r
    unsigned long long* calls = nullptr;        // this rank's count of finished sums
    int* timed_out = nullptr;                   // set when a peer did not arrive within 2 s
};

// A residual update fused into a decode GEMV's end: once every row of y is written, the last block to finish
// computes x = (x + RMSNorm(y) * w) * scale in place (y has as many rows as x). counter: one zeroed uint,
// left zeroed.
struct ResidualTail {
    float* x = nullptr;
    const bf16* w = nullptr;
    float scale = 1.0f;
    float eps = 1e-6f;
    unsigned int* counter = nullptr;
};
void gemv_rows(const GemvInput& in, const GemvSeg* segs, int nseg, const ResidualTail* tail, cudaStream_t s);
void gemv_rows_geglu(const GemvInput& in, const bf16* wg, const bf16* wu, int rows, float* y, cudaStream_t s);
void gemv_rows_gelu_mul(const GemvInput& in, const bf16* w, int rows, const float* aux, float* y,
                        cudaStream_t s);
// Which warp-per-row kernel one of those products launches (`warp` and `warpk`; the async variants choose
// for themselves): warps per row, 16-byte chunks in flight per lane (4 or 8), the lean kernel (no norm, no
// tail), and for the GeGLU whether a row's gate and up products go to different warps. A pure function of
// the launch (rows: output rows over all segments; sms: the device's multiprocessors), so the measured rules
// can be checked without a GPU (tests/cuda/test_gemv_rows_plan.cpp).
enum class RowsProduct { kPlain, kGeglu, kGeluMul };
struct RowsPlan {
    int warps = 1;   // warps per row (the split GeGLU: per row's gate, and as many for its up)
    int chunks = 8;  // 16-byte loads in flight per lane
    bool lean = false;
    bool split = false;
};
RowsPlan gemv_rows_plan(RowsProduct product, const GemvInput& in, int64_t rows, bool tail, int sms);
// The variant indices of "warp" and "warpk" (gemv_variant_from_env's numbering). warpk: the same kernel with
// a row's K range shared by 1-8 warps (gemv_rows.cu's warps_per_row), for long rows.
constexpr int kGemvVariantWarp = 6;
constexpr int kGemvVariantWarpK = 7;
// async: each warp streams a contiguous run of 4 KB rounds of the matrix (rows in memory order) through a
// ring of 3 shared-memory stages filled by cp.async, two rounds always in flight, and no registers held by
// them; rows cut between warps meet through GemvStreamScratch. Launches with fewer than 3 rounds per warp on
// a full grid take the warpk kernel.
constexpr int kGemvVariantAsync = 8;
constexpr int kGemvVariantAsyncG = 9;  // async for the GeGLU (gate + up) launches only, warpk for the rest
inline bool gemv_variant_is_rows(int v) {
    return v == kGemvVariantWarp || v == kGemvVariantWarpK || v == kGemvVariantAsync ||
           v == kGemvVariantAsyncG;
}
// The warps an async GEMV launch may use on this device (its scratch's size); also raises the kernels'
// shared-memory limit (call outside any capture).
int64_t gemv_async_prepare();

// Raises the dynamic shared-memory limit of the GEMV kernels so that inputs of up to max_K floats can be
// staged, and records their register use (for the resident-grid variants).
void gemv_prepare(int max_K);
// Host-side; the kernel lab uses the same rule.
// K slices per row group for a balanced split-K: the fewest slices whose units (groups x slices) spread over
// `blocks` with little tail, each slice still a few full batches of U chunks per lane.
inline int choose_ksplit(int groups, int blocks, int nchunk, int U) {
    int best = 1;
    double best_score = -1.0;
    for (int S = 1; S <= 8; ++S) {
        if (S > 1 && (nchunk + S - 1) / S < 2 * 32 * U) break;
        const int units = groups * S;
        const int rounds = (units + blocks - 1) / blocks;
        const double eff = static_cast<double>(units) / (static_cast<double>(rounds) * blocks);
        const double score = eff - 0.02 * (S - 1);  // atomics and re-staging are not free
        if (score > best_score + 1e-9) {
            best_score = score;
            best = S;
        }
    }
    return best;
}
// MARKBASE_CUDA_GEMV (a name or number, see gemv.cu) as a variant index; 0 when unset; throws on an unknown
// name. Unset = kGemvVariantWarpK; gemv_variant_name(0) == "legacy".
int gemv_variant_from_env();
const char* gemv_variant_name(int variant);

// ---- norm_rope.cu: embedding, per-layer inputs, residual updates, qk-norm + RoPE + cache write -----------

// x[t] = embed[ids[t] - vocab_begin] * scale for t < n; also clears *argmax_key (start of a step). A
// tensor-parallel rank holds the rows [vocab_begin, vocab_begin + vocab_rows) and writes zeros for other ids
// (the all-reduce that follows adds the owner's row); vocab_rows < 0: every id is held.
void embed_rows(const int* ids, int n, const bf16* embed, int H, float scale, float* x,
                unsigned long long* argmax_key, cudaStream_t s, int64_t vocab_begin = 0,
                int64_t vocab_rows = -1);
// ple[t][l] = (RMSNorm_P(ctx[t][l] * H^-0.5) * norm_w + ple_embed[ids[t]][l] * sqrt(P)) * 2^-0.5
void ple_mix(const float* ctx, const int* ids, int n, const bf16* ple_embed, const bf16* norm_w, int L, int P,
             int H, float eps, float* ple, cudaStream_t s);
// Up to two more normalised copies of the new x that a one-token update writes beside xn (the 26B-A4B's
// router and experts' inputs, MARKBASE_CUDA_MOE_PRENORM): out[i] = RMSNorm(x) * w[i] * scale[i].
struct NormCopies {
    const bf16* w[2] = {nullptr, nullptr};
    float* out[2] = {nullptr, nullptr};
    float scale[2] = {1.0f, 1.0f};
};
// x[t] = (x[t] + RMSNorm(y[t]) * w) * scale (n == 1, H <= 6144: one block of 1024 threads, loads batched);
// with next_w (one token only) also xn = RMSNorm(x) * next_w, the next GEMV's input, and `more`'s copies
void residual_add_norm(float* x, const float* y, const bf16* w, int H, int n, float eps, float scale,
                       cudaStream_t s, const bf16* next_w = nullptr, float* xn = nullptr,
                       const NormCopies& more = {});
// 26B FFN combine: e = sum_k sel_w[t][k] * slots[t*K + k]; m' = RMSNorm(m)*w1 + RMSNorm(e)*w2;
// x = (x + RMSNorm(m')*w) * scale
// wide (MARKBASE_CUDA_MOE_WIDE, default on; n == 1, H <= 3072, K <= 8): one block of 1024 threads with each
// thread's loads issued together (two L2 round trips instead of ~12); otherwise a block of 256 per token.
// With next_w (wide only), also xn = RMSNorm(x) * next_w, as residual_add_norm.
constexpr int kMoeWideMaxHidden = 3072, kMoeWideMaxK = 8;  // the wide form's limits
void residual_moe_combine(float* x, const float* m, const float* slots, const float* sel_w, int K,
                          const bf16* w1, const bf16* w2, const bf16* w, int H, int n, float eps, float scale,
                          cudaStream_t s, bool wide = false, const bf16* next_w = nullptr,
                          float* xn = nullptr);
// out[t] = RMSNorm(x[t]) * w (w may be null) as fp32
void rmsnorm_rows(const float* x, const bf16* w, int H, int n, float eps, float* out, cudaStream_t s);
// Prefill GEMM inputs, fp32 -> two bf16 halves (hi = bf16(v), lo = bf16(v - hi)) so that two bf16 GEMMs
// reproduce fp32 activations to ~2^-16. v = norm ? RMSNorm(x)*w : x. Rows of `width`, row stride ld_in.
void split_rows(const float* x, int64_t ld_in, int width, int n, bool norm, const bf16* w, float eps,
                bf16* hi, bf16* lo, cudaStream_t s);
// v = gelu_tanh(a) * b (b: row stride ld_b) split into hi/lo as above.
void geglu_split(const float* a, const float* b, int64_t ld_b, int width, int n, bf16* hi, bf16* lo,
                 cudaStream_t s);
// The two halves' products from one GEMM over [hi; lo] (y2: [2n][N], hi's rows first) summed into Y (row
// stride ldy): Y[t][j] = y2[t][j] + y2[n + t][j].
void sum_halves(const float* y2, int n, int N, float* Y, int64_t ldy, cudaStream_t s);

// Per token t at position pos_base[0] + t: q heads get q_norm + RoPE in place; own-KV layers write
// k = RoPE(k_norm(kraw)) and v = RMSNorm_noweight(vraw) into the fp32 cache slot (pos % cap).
struct QkvPost {
    float* q = nullptr;           // [n][nH][d]
    const float* kraw = nullptr;  // [n][nKV][d]; null on KV-shared layers
    const float* vraw = nullptr;  // [n][nKV][d]; = kraw on k_eq_v layers
    const bf16* q_norm = nullptr;
    const bf16* k_norm = nullptr;
    float* k_cache = nullptr;  // [cap][nKV][d]
    float* v_cache = nullptr;
    int64_t cap = 0;
    int nH = 0, nKV = 0, d = 0;
    const float* inv_freq = nullptr;  // [d/2]; 0 = the pair does not rotate
    const int* pos_base = nullptr;
    float eps = 1e-6f;
    // Batched decode (docs/batched-decode.md): token t sits at tok_pos[t] of sequence slot tok_slot[t], whose
    // cache starts slot_stride floats after k_cache / v_cache. Null: pos_base[0] + t, one cache.
    const int* tok_pos = nullptr;
    const int* tok_slot = nullptr;
    int64_t slot_stride = 0;
};
void qkv_post(const QkvPost& p, int n, cudaStream_t s);

// ---- attention.cu: decode and prefill attention over the fp32 cache, split over the key range ------------
struct AttnArgs {
    const float* q = nullptr;        // [n][nH][d], normed and rotated
    const float* k_cache = nullptr;  // [cap][nKV][d]
    const float* v_cache = nullptr;
    int64_t cap = 0;
    int nH = 0, nKV = 0, d = 0;
    int window = 0;                 // sliding: a query at p sees keys (p - window, p]; 0 = full causal
    const int* pos_base = nullptr;  // query t sits at pos_base[0] + t
    // Batched decode: query t sits at tok_pos[t] of slot tok_slot[t] (cache + slot * slot_stride), and sees
    // only that sequence's keys (the v1 pieces kernel; split_len > 0). Null: pos_base, one cache.
    const int* tok_pos = nullptr;
    const int* tok_slot = nullptr;
    int64_t slot_stride = 0;
    int nsplit = 1;       // key range cut into nsplit pieces of split_len keys
    int split_len = 256;  // 0: ceil(range / nsplit) from the device-side position (decode graphs)
    int min_split = 32;   // split_len 0: at least this many keys per piece
    // split_len 0 only: pieces past the current range exit at once, and the merge (and the last-piece ticket)
    // counts only the pieces that hold keys (MARKBASE_CUDA_ATTN_SPLIT=auto; false = every piece reports).
    bool active_only = false;
    // With active_only and merge_counters at decode: the v2 pieces kernel (keys spread over warps in the V
    // phase too, a parallel merge); MARKBASE_CUDA_ATTN_SPLIT=auto sets it, active[:N] does not.
    bool decode_v2 = false;
    float* part_o = nullptr;   // [n][nH][nsplit][d] scratch
    float* part_ml = nullptr;  // [n][nH][nsplit][2] scratch
    float* out = nullptr;      // [n][nH][d]
    // Optional [n][nH] zeroed counters: the last piece of each head merges them all into `out` (one kernel);
    // without them attention() runs a separate merge kernel.
    unsigned int* merge_counters = nullptr;
    // Decode v2, pieces of <= 16 keys (MARKBASE_CUDA_ATTN_KV_EARLY, default 1): the keys and values are
    // requested before the PDL wait (they were written by earlier steps); the piece holding the current
    // position reloads that one from L2 after the wait, since the kernel before it (qkv_post) writes it.
    bool kv_early = false;
    // Decode v2 (MARKBASE_CUDA_ATTN_CLUSTER): the nsplit pieces of a head (cluster == nsplit, <=
    // kMaxAttnCluster) as one thread-block cluster merging through distributed shared memory, not the ticket
    // (merge_counters then go unused); 0 = the ticket.
    int cluster = 0;
    // Fixed pieces with a separate merge (prefill, batched decode): the query heads of a KV group in one
    // block (attention_group.cu; MARKBASE_CUDA_ATTN_GROUP, default 1), for groups of 2, 4 or 8 heads.
    bool group_heads = false;
    // With group_heads at prefill: 8 / G consecutive tokens per block too, their pieces cut from the union of
    // their key ranges (MARKBASE_CUDA_ATTN_GROUP_TOKENS, default 1).
    bool group_tokens = false;
};
void attention(const AttnArgs& a, int n, cudaStream_t s);
constexpr int kMaxAttnCluster = 16;
// Whether clusters of C decode pieces (nH heads of dim d) can be scheduled on this GPU (sm_90+).
bool attention_cluster_fits(int C, int nH, int d);
// attention_group.cu: the pieces with a group's heads together, when group_heads applies (else false)
bool attention_group_pieces(const AttnArgs& a, int n, cudaStream_t s);
// The two halves of attention(): the pieces, and their merge (skipped when merge_counters are given).
void attention_pieces(const AttnArgs& a, int n, cudaStream_t s);
void attention_combine(const AttnArgs& a, int n, cudaStream_t s);

// ---- attention_gemm.cu: prefill attention as cuBLAS GEMMs
// --------------------------------------------------- One sequence's chunk of n queries at positions pos0..
// over the key slots [0, min(cap, pos0 + n)): per head S = Q K^T, a masked softmax in place, a.out = P V;
// heads (and, past the scratch, query rows) in batches.
struct AttnGemm {
    cublasHandle_t blas = nullptr;  // on the same stream
    float* s = nullptr;             // scores scratch [s_floats]
    int64_t s_floats = 0;
    void** ptrs = nullptr;  // device [6][nH] pointer arrays
    bool tf32 = false;      // TF32 products (MARKBASE_CUDA_ATTN_GEMM=tf32)
    int block_rows = 0;     // > 0: causal row blocks of this many queries (MARKBASE_CUDA_ATTN_GEMM_BLOCK)
    // bf16x3 (MARKBASE_CUDA_ATTN_GEMM=bf16x3): bf16 hi/lo copies for key ranges of at most keys3 slots,
    // q3 [n][nH][3d], k3 [keys3][nKV][3d], v3 [3][keys3][nKV][d], p3 [3 s_floats]
    bool bf16x3 = false;
    int64_t keys3 = 0;
    uint16_t *q3 = nullptr, *k3 = nullptr, *v3 = nullptr, *p3 = nullptr;
};
// false, with nothing launched, where it does not apply (batched decode) or the scratch cannot hold 16 rows
// of one head's scores: the caller runs the pieces instead.
bool attention_gemm(const AttnArgs& a, int n, int64_t pos0, const AttnGemm& g, cudaStream_t s);

// ---- moe.cu: routing and the selected experts, no host in the loop ----------------------------------------
// The experts a rank holds (expert parallelism): global ids [begin, begin + count); a group whose expert is
// elsewhere gets group_expert -1, and the expert kernels write zeros for its entries. count < 0: all of them.
struct ExpertRange {
    int begin = 0, count = -1;
};
// logits [n][E] -> per token top-K of softmax(all E), renormalised, times per_expert_scale.
// Writes sel_id/sel_w [n][K]. When groups_for_slots (n == 1), also writes the K expert groups directly
// (group_expert = the expert's index among the held ones).
// Also the experts' input: e_in[t] = RMSNorm(x[t]) * norm_w (pre_feedforward_layernorm_2), H wide.
void moe_route(const float* logits, int n, int E, int K, const bf16* per_expert_scale, int* sel_id,
               float* sel_w, bool groups_for_slots, int* group_expert, int* group_off, int* entries,
               const float* x, const bf16* norm_w, int H, float eps, float* e_in, cudaStream_t s,
               ExpertRange held = {}, bool wide = false);
// (E <= 256, K <= 32: the top K by every expert's rank in one pass. wide: MARKBASE_CUDA_MOE_WIDE, default
// on, n == 1, H <= 4096: 1024 threads, x and the logits loaded in one batch, the logits through shared
// memory.)
// Prefill: group the n*K (token, slot) entries by expert: group g = expert g, entries[group_off[g] ...].
void moe_bucket(const int* sel_id, int n, int E, int K, int* group_expert, int* group_off, int* entries,
                cudaStream_t s, ExpertRange held = {});
// e[t] = sum_k sel_w[t][k] * slots[t*K + k] (H wide): a rank's share of the experts' weighted sum, which the
// tensor-parallel step all-reduces before residual_moe_combine's norms.
void moe_weighted_sum(const float* slots, const float* sel_w, int K, int H, int n, float* e, cudaStream_t s);
// h[entry][j] = gelu(gate_e[j] . x[entry / K]) * (up_e[j] . x[entry / K]) for each group's entries.
void moe_gate_up(const float* x, int H, const bf16* gate_up, int Ie, int K, const int* group_expert,
                 const int* group_off, const int* entries, int n_groups, float* h, cudaStream_t s);
// slots[entry][j] = down_e[j] . h[entry]
void moe_down(const float* h, int Ie, const bf16* down, int H, const int* group_expert, const int* group_off,
              const int* entries, int n_groups, float* slots, cudaStream_t s);

// Decode (one token; moe_route wrote the K slot groups, slot g = entry g): the same products, a warp per row
// with 8 loads in flight per lane (MARKBASE_CUDA_MOE_DECODE=rows).
// blocks_per_sm 3: gate/up's registers capped for 3 blocks per SM (MARKBASE_CUDA_MOE_GATE_OCC; the one-GPU
// default), else 2.
void moe_gate_up_decode(const float* x, int H, const bf16* gate_up, int Ie, int K, const int* group_expert,
                        float* h, cudaStream_t s, int blocks_per_sm = 2);
// blocks_per_sm 6 (MARKBASE_CUDA_MOE_DOWN_OCC; the one-GPU default; rows of at most 1024): 4 loads in
// flight per lane, 6 blocks per SM; else 8 loads, 4 blocks per SM at 53 registers.
void moe_down_decode(const float* h, int Ie, const bf16* down, int H, int K, const int* group_expert,
                     float* slots, cudaStream_t s, int blocks_per_sm = 4);
// Decode (MARKBASE_CUDA_MOE_DOWN_SUM=1): e[j] = sum_k sel_w[k] * (down[expert of slot k][j] . h[k]), the
// slots' down rows and their weighted sum in one kernel, a block per output row j and a warp per slot
// (Ie <= 768, K <= 32). Bit-identical to moe_down_decode's slots summed by the combine. late:
// MARKBASE_CUDA_PDL_EARLY=0's order. rows_per_block (MARKBASE_CUDA_MOE_DOWN_ROWS): 1, or 2 / 4 / 8 output
// rows per block, each warp's rows loaded in one batch (bit-identical).
void moe_down_sum_decode(const float* h, int Ie, const bf16* down, int H, int K, const int* group_expert,
                         const float* sel_w, float* e, cudaStream_t s, bool late, int rows_per_block = 1);
// Prefill experts as batched GEMMs (MARKBASE_CUDA_MOE_PREFILL=gemm), in passes of max_n rows: after
// moe_bucket, expert e's entries [group_off[e] + first, group_off[e] + first + max_n) become rows [e][0, ..)
// of hi/lo [E][max_n][H] (input row entry / K of x, split into bf16 halves; rows past the expert's entries
// zeroed); and rows [e][p] of y [E][max_n][H] go back to slots[entries[group_off[e] + first + p]].
// (e_stride: elements between experts' rows, 0 = max_n * H; halves: y is [E][2 max_n][H], hi then lo)
void moe_gather_split(const float* x, int H, int K, const int* entries, const int* group_off, int E,
                      int first, int max_n, bf16* hi, bf16* lo, cudaStream_t s, int64_t e_stride = 0);
void moe_scatter_rows(const float* y, int H, const int* entries, const int* group_off, int E, int first,
                      int max_n, float* slots, cudaStream_t s, bool halves = false);
// The stacked gate/up output [E][2 max_n][gate Ie | up Ie] to the down GEMM's stacked bf16 input [E][2
// max_n][Ie]: gelu(g) * u of the halves' sums, split into hi and lo rows.
void moe_geglu_halves(const float* y2, int E, int max_n, int Ie, bf16* h, cudaStream_t s);
// The same in one pass over each expert's own rows (MARKBASE_CUDA_MOE_COMPACT): expert e's rows padded to r_e
// = row_off[e + 1] - row_off[e] (max_r the largest), its stacked [hi; lo] block at row 2 row_off[e] of xs
// [2 R][H] bf16, of the gate/up output [2 R][2 Ie], of h [2 R][Ie] and of the down output y [2 R][H].
void moe_gather_compact(const float* x, int H, int K, const int* entries, const int* group_off,
                        const int* row_off, int E, int max_r, bf16* xs, cudaStream_t s);
void moe_geglu_compact(const float* y2, const int* row_off, int E, int max_r, int Ie, bf16* h,
                       cudaStream_t s);
void moe_scatter_compact(const float* y, int H, const int* entries, const int* group_off, const int* row_off,
                         int E, int max_r, float* slots, cudaStream_t s);

// buf[n] = the sum over the ranks of their buf (in rank order: every rank gets the same bits); with res (its
// x, w, scale, eps; n = H), then x = (x + RMSNorm(buf) * w) * scale. One block; every rank must call it in
// the same order.
void peer_sum(const PeerSum& ps, float* buf, int n, const ResidualTail* res, cudaStream_t s);

// ---- sampling.cu ----------------------------------------------------------------------------------------
// state[0] = argmax token, state[1] (position) += advance, and the token is appended to out_ids at state[2]++
// (when out_ids is not null and state[2] < out_cap).
void finish_step(const unsigned long long* argmax_key, int* state, int advance, int* out_ids, int out_cap,
                 cudaStream_t s);
// Device-side top-k for sampling: the k (<= kTopKMax) largest logits after the penalties, in the sampler's
// order (logit descending, id ascending), as argmax_key-encoded 64-bit keys in out[0..k) (0 = none: fewer
// finite logits than k). pen: n_pen distinct ids, then their n_pen counts in the penalty window (applied as
// Sampler's apply_penalties does). info[0] = logits not -inf after the penalties, info[1] = 1 if any logit is
// NaN or +inf. slices: scratch of ceil(V / kTopKSlice) * kTopKMax keys. V <= kTopKSlice^2 / kTopKMax.
constexpr int kTopKMax = 64;
constexpr int kTopKSlice = 4096;
void topk_select(const float* logits, int V, const int* pen, int n_pen, float repeat_penalty,
                 float presence_penalty, float frequency_penalty, int k, unsigned long long* slices,
                 unsigned long long* out, int* info, cudaStream_t s);
// out[r] = the argmax of row r of logits [rows][V] (ties to the lower id), one block per row.
void argmax_rows(const float* logits, int rows, int64_t V, int* out, cudaStream_t s);
// logits = cap * tanh(logits / cap) over n values.
void softcap_inplace(float* logits, int64_t n, float cap, cudaStream_t s);
// profile_gate.cu: holds stream s until *flag (host-mapped memory) turns nonzero, or timeout_s passes (then
// *timed_out = 1, device memory), so that a profiled step is enqueued whole before it starts.
void stream_gate(const int* flag, double timeout_s, int* timed_out, cudaStream_t s);
// Deterministic random bf16 weights in [lo, hi): element k of a tensor is splitmix64(seed + (k+1)*golden),
// exactly as loading/random_checkpoint.cpp draws them, so synthetic GPU weights equal the written files.
void fill_random_bf16(bf16* out, int64_t n, uint64_t seed, float lo, float hi, cudaStream_t s);
// The same draws for a block of a tensor: out[r][c] (rows x cols) = draw k0 + r * ld + c.
void fill_random_bf16_block(bf16* out, int64_t rows, int64_t cols, int64_t ld, int64_t k0, uint64_t seed,
                            float lo, float hi, cudaStream_t s);

}  // namespace markbase::cuda
