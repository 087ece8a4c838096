// Launchers for MarkBase's CUDA kernels. Every pointer is device memory; every launcher enqueues on `s` and
// checks the launch. Weights are bf16 (raw uint16 bits), activations fp32, accumulation fp32. Shapes follow
// HF's [out, in] layout, so a weight row is one output and rows are contiguous along the input dim.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels/moe_kernels.h"  // the MoE's: routing, the experts' passes
#include "model/bf16.h"
#include "model/weights.h"

namespace markbase::cuda {

// ---- gemv.cu: y = W @ xn for one or a few tokens, weights streamed with 16-byte loads -------------------

// Scratch of the GeGLU GEMV through the cp.async ring (Tuning::gemv async_geglu, gemv_rows.cu): each warp's
// partial sums of the (at most two) rows it shares with other warps, and one arrival counter per output row
// (zero between launches). One per stream that runs GEMVs concurrently; without it the launch takes the
// warp-per-row kernel.
struct GemvStreamScratch {
    float* part = nullptr;          // [warps][2][3]
    unsigned int* count = nullptr;  // [rows]
    int64_t warps = 0;              // capacity of part, in warps
    int rows = 0;                   // capacity of count
};

// Which kernel a product runs: kTiles = gemv.cu's staged tiles (lm_head, products over several tokens, the
// prefill router); kRows = gemv_rows.cu's warp-per-row kernels at one token (the decode step);
// kRowsAsyncGeglu = the same with the GeGLU launches through the cp.async ring (the 26B-A4B on one GPU).
enum class GemvKernel { kTiles, kRows, kRowsAsyncGeglu };

// The input vector, optionally RMS-normalised on the fly: xn = x * rsqrt(mean(x^2) + eps) * norm_w * scale
// (norm_w may be null = no weight). K must be a multiple of 8; rows are 16-byte aligned.
struct GemvInput {
    const float* x = nullptr;
    int K = 0;
    int64_t ldx = 0;  // stride between tokens' x (elements), for ntok > 1
    bool norm = false;
    const bf16* norm_w = nullptr;
    float norm_scale = 1.0f;
    float eps = 1e-6f;

    GemvKernel kernel = GemvKernel::kTiles;
    GemvStreamScratch stream;  // kRowsAsyncGeglu
    // The warp-per-row GeGLU with a row's gate and up products on different warps: a plain product's
    // registers, twice the blocks per SM. At 8 chunks per lane only. On for one GPU (31B -3.5..-5.2% with
    // min_waves; E2B and the 26B-A4B run neither); not measured sharded, so off there.
    bool geglu_split = false;
    // > 0 (3 for one GPU, 0 sharded): a warp-per-row launch at 8 chunks per lane and K >= 4096 halves its
    // warps per row while it still has at least this many waves of blocks (the kernel lab's one-warp-per-row
    // v11 ran the 31B's q/k/v at 98% of the roofline; 4 warps per row at ~73%; E4B's K = 2560 lost 1.7%).
    int min_waves = 0;
    // gemv_quant.cu: FP8 products with 4 super-steps a register buffer, not 2 (E2B and E4B -3% a token; the
    // 26B-A4B, whose dense products run beside its experts, +2.5%)
    bool fp8_long_buffers = false;
    // > 0: warps per row for the warp-per-row launch, instead of the rule above (the kernel lab's sweep)
    int force_warps = 0;
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
    // Quantised weights instead of w (model/weights.h QuantMatrix, format kFp8 or kInt4): gemv_quant.cu, at
    // one token only.
    QuantMatrix q;
    WeightFormat format = WeightFormat::kBf16;
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

// ---- quantize_rows.cu: bf16 weights [rows, K] quantised in place (random weights at real widths;
// checkpoints quantise on the host): q and scale written, w rewritten as the quantised values rounded to
// bf16. FP8 (model/fp8.h): a scale per row. int4 (model/int4.h): symmetric, a scale per group of 128 along K
// (scale [rows, ceil(K/128)]).
void quantize_rows_fp8(uint16_t* w, int64_t rows, int K, uint8_t* q, float* scale, cudaStream_t s);
void quantize_rows_int4(uint16_t* w, int64_t rows, int K, uint8_t* q, float* scale, cudaStream_t s);
// The rewritten bf16 values again from q and scale (and int4's zero points, null: symmetric), into out
// [rows, K]: equal to what quantize_rows_* wrote (its -0 for a weight rounded to a zero code excepted).
void dequantize_rows(const uint8_t* q, const float* scale, const uint8_t* zero, int64_t rows, int K,
                     bool int4, uint16_t* out, cudaStream_t s);

// ---- gemv_rows.cu: the same products, one warp per row, input norm folded into each warp (one token) ----
// GemvKernel::kRows routes gemv / gemv_geglu / gemv_gelu_mul here when ntok == 1 (lm_head keeps
// gemv_logits). in.x, in.norm_w and the weights must be 16-byte aligned.

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

// The residual update peer_sum applies after its sum: x = (x + RMSNorm(buf) * w) * scale in place.
struct ResidualTail {
    float* x = nullptr;
    const bf16* w = nullptr;
    float scale = 1.0f;
    float eps = 1e-6f;
};
void gemv_rows(const GemvInput& in, const GemvSeg* segs, int nseg, cudaStream_t s);
void gemv_rows_geglu(const GemvInput& in, const bf16* wg, const bf16* wu, int rows, float* y, cudaStream_t s);
void gemv_rows_gelu_mul(const GemvInput& in, const bf16* w, int rows, const float* aux, float* y,
                        cudaStream_t s);
// Which warp-per-row kernel one of those products launches (the async GeGLU chooses for itself): warps per
// row, 16-byte chunks in flight per lane (4 or 8), the lean kernel (no input norm), and for the GeGLU whether
// a row's gate and up products go to different warps. A pure function of the launch (rows: output rows over
// all segments; sms: the device's multiprocessors), so the measured rules can be checked without a GPU
// (tests/cuda/test_gemv_rows_plan.cpp).
enum class RowsProduct { kPlain, kGeglu, kGeluMul };
struct RowsPlan {
    int warps = 1;   // warps per row (the split GeGLU: per row's gate, and as many for its up)
    int chunks = 8;  // 16-byte loads in flight per lane
    bool lean = false;
    bool split = false;
};
RowsPlan gemv_rows_plan(RowsProduct product, const GemvInput& in, int64_t rows, int sms);
// The warps an async GEMV launch may use on this device (its scratch's size); also raises the kernels'
// shared-memory limit (call outside any capture).
int64_t gemv_async_prepare();

// Raises the dynamic shared-memory limit of the GEMV kernels so that inputs of up to max_K floats can be
// staged.
void gemv_prepare(int max_K);

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
// router and experts' inputs, on one GPU): out[i] = RMSNorm(x) * w[i] * scale[i].
struct NormCopies {
    const bf16* w[2] = {nullptr, nullptr};
    float* out[2] = {nullptr, nullptr};
    float scale[2] = {1.0f, 1.0f};
};
// The next product's input that an update of n rows writes beside x (prompt chunks and batched steps):
// hi, lo = split_rows(x, norm, w)'s, the same values, so the product needs no split_rows launch of its own.
// hi null: none.
struct RowSplit {
    bool norm = false;
    const bf16* w = nullptr;
    bf16* hi = nullptr;
    bf16* lo = nullptr;
};
// x[t] = (x[t] + RMSNorm(y[t]) * w) * scale (n == 1, H <= 6144: one block of 1024 threads, loads batched);
// with next_w (one token only) also xn = RMSNorm(x) * next_w, the next GEMV's input, and `more`'s copies;
// with split.hi (the n-row form) also the next product's input rows
void residual_add_norm(float* x, const float* y, const bf16* w, int H, int n, float eps, float scale,
                       cudaStream_t s, const bf16* next_w = nullptr, float* xn = nullptr,
                       const NormCopies& more = {}, const RowSplit& split = {});
// 26B FFN combine: e = sum_k sel_w[t][k] * slots[t*K + k]; m' = RMSNorm(m)*w1 + RMSNorm(e)*w2;
// x = (x + RMSNorm(m')*w) * scale
// wide (decode: n == 1, H <= 3072, K <= 8): one block of 1024 threads with each thread's loads issued
// together (two L2 round trips instead of ~12; 26B-A4B -11.3% per token); otherwise a block of 256 per token.
// With next_w (wide only), also xn = RMSNorm(x) * next_w, as residual_add_norm; with split.hi (not wide)
// the next product's input rows.
constexpr int kMoeWideMaxHidden = 3072, kMoeWideMaxK = 8;  // the wide form's limits
void residual_moe_combine(float* x, const float* m, const float* slots, const float* sel_w, int K,
                          const bf16* w1, const bf16* w2, const bf16* w, int H, int n, float eps, float scale,
                          cudaStream_t s, bool wide = false, const bf16* next_w = nullptr,
                          float* xn = nullptr, const RowSplit& split = {});
// out[t] = RMSNorm(x[t]) * w (w may be null) as fp32
void rmsnorm_rows(const float* x, const bf16* w, int H, int n, float eps, float* out, cudaStream_t s);
// Prefill GEMM inputs, fp32 -> two bf16 halves (hi = bf16(v), lo = bf16(v - hi)) so that two bf16 GEMMs
// reproduce fp32 activations to ~2^-16. v = norm ? RMSNorm(x)*w : x. Rows of `width`, row stride ld_in.
void split_rows(const float* x, int64_t ld_in, int width, int n, bool norm, const bf16* w, float eps,
                bf16* hi, bf16* lo, cudaStream_t s);
// The same rows as f16(v / 16), one array: the input of FP8 rows' MMAs (moe_stream), whose sums are scaled
// back by 16.
void f16_rows(const float* x, int64_t ld_in, int width, int n, bool norm, const bf16* w, float eps,
              uint16_t* out, cudaStream_t s);
// v = gelu_tanh(a) * b (b: row stride ld_b) split into hi/lo as above.
void geglu_split(const float* a, const float* b, int64_t ld_b, int width, int n, bf16* hi, bf16* lo,
                 cudaStream_t s);
// The two halves' products from one GEMM over [hi; lo] (y2: [2n][N], hi's rows first) summed into Y (row
// stride ldy): Y[t][j] = y2[t][j] + y2[n + t][j].
void sum_halves(const float* y2, int n, int N, float* Y, int64_t ldy, cudaStream_t s);

// ---- stream_gemm.cu: the projections of at most kStreamGemmMaxN tokens, each weight byte read once ------
// Y[t][r] = sum_k (hi[t][k] + lo[t][k]) W[r][k] (lo null: hi alone, the one bf16 operand of
// gemm_inputs=bf16) for each segment (up to kStreamGemmMaxSegs matrices of one input: q/k/v, gate/up), on the
// tensor cores; hi, lo as split_rows writes them ([n][K] each).
constexpr int kStreamGemmMaxN = 64;
constexpr int kStreamGemmMaxSegs = 3;
// How a launch is cut: mt tiles of 16 rows per block (1, 2, 4), the K range over a cluster of ks blocks (1,
// 2, 4, 8).
struct StreamGemmShape {
    int mt = 1;
    int ks = 1;
};
// Whether a matrix of N rows and K columns at n tokens is one stream_gemm takes (N % 16, K % 32).
bool stream_gemm_fits(int N, int K, int n);
// Whether stream_gemm beats cuBLAS for nseg matrices of `bytes` weight bytes in all at n tokens (the kernel
// lab): over both halves, against cuBLAS over the stacked halves (a GEMM and a sum per matrix), up to 48 MB
// per matrix at 8 tokens, less beyond; over the one bf16 operand (one_operand) against cuBLAS over it.
bool stream_gemm_pays(int64_t bytes, int nseg, int n, bool one_operand);
// The shape for these matrices at n tokens on a GPU of `sms` SMs (the kernel lab's rule).
StreamGemmShape stream_gemm_shape(const GemvSeg* segs, int nseg, int K, int n, int sms);
void stream_gemm(const GemvSeg* segs, int nseg, const bf16* hi, const bf16* lo, int n, int K,
                 StreamGemmShape shape, cudaStream_t s);

// ---- tile_gemm.cu: the projections of up to kTileGemmMaxN tokens over the one bf16 operand -------------
// Y[t][r] = sum_k x[t][k] W[r][k] for each segment (up to kStreamGemmMaxSegs matrices of one input), x [n][K]
// bf16 (split_rows' hi); tiles of mt x 64 weight rows (1, 2) x every token through a cp.async ring, the K
// range optionally cut across a cluster of ks blocks (1, 2, 4, 8).
constexpr int kTileGemmMaxN = 128;
struct TileGemmShape {
    int ks = 1;
    int mt = 2;
};
bool tile_gemm_fits(int N, int K, int n);  // K % 64, 1 <= n <= kTileGemmMaxN
// Whether tile_gemm beats cuBLAS over the bf16 operand for these nseg matrices of `bytes` bytes in all at n
// tokens on a GPU of `sms` SMs (the kernel lab).
bool tile_gemm_pays(int64_t bytes, int nseg, int n, int sms, const GemvSeg* segs);
TileGemmShape tile_gemm_shape(const GemvSeg* segs, int nseg, int K, int n, int sms);
void tile_gemm_prepare();  // its kernels' shared-memory limit on the current device (CudaModel's set-up)
void tile_gemm(const GemvSeg* segs, int nseg, const bf16* x, int n, int K, TileGemmShape shape,
               cudaStream_t s);

// The KV cache's element (runtime/kv_dtype.h): fp32, bf16, or e4m3 with no scale (kv_elems.cuh).
enum class KvElem : uint8_t { kF32, kBf16, kFp8 };

// Per token t at position pos_base[0] + t: q heads get q_norm + RoPE in place; own-KV layers write
// k = RoPE(k_norm(kraw)) and v = RMSNorm_noweight(vraw) into the cache slot (pos % cap), rounded to the
// cache's element (round to nearest even; e4m3 saturating at +-448).
struct QkvPost {
    float* q = nullptr;           // [n][nH][d]
    const float* kraw = nullptr;  // [n][nKV][d]; null on KV-shared layers
    const float* vraw = nullptr;  // [n][nKV][d]; = kraw on k_eq_v layers
    const bf16* q_norm = nullptr;
    const bf16* k_norm = nullptr;
    void* k_cache = nullptr;  // [cap][nKV][d] of `kv`
    void* v_cache = nullptr;
    KvElem kv = KvElem::kBf16;
    int64_t cap = 0;
    int nH = 0, nKV = 0, d = 0;
    const float* inv_freq = nullptr;  // [d/2]; 0 = the pair does not rotate
    const int* pos_base = nullptr;
    float eps = 1e-6f;
    // Batched decode (docs/batched-decode.md): token t sits at tok_pos[t] of sequence slot tok_slot[t] (its
    // ring: cap rows after slot - 1's). Null: pos_base[0] + t, one cache.
    const int* tok_pos = nullptr;
    const int* tok_slot = nullptr;
    // A paged layer (kv_cache.h): position p of slot s in row p % 2^block_shift of block
    // block_table[s * table_stride + (p >> block_shift)] (kv_elems.cuh kv_row). Null: the rings above.
    const int* block_table = nullptr;
    int64_t table_stride = 0;
    int block_shift = 0;
};
void qkv_post(const QkvPost& p, int n, cudaStream_t s);

// ---- attention.cu: decode and prefill attention over the cache, split over the key range -----------------
struct AttnArgs {
    const float* q = nullptr;       // [n][nH][d], normed and rotated
    const void* k_cache = nullptr;  // [cap][nKV][d] of `kv`; products in fp32 whatever the element
    const void* v_cache = nullptr;
    KvElem kv = KvElem::kBf16;
    int64_t cap = 0;
    int nH = 0, nKV = 0, d = 0;
    int window = 0;                 // sliding: a query at p sees keys (p - window, p]; 0 = full causal
    const int* pos_base = nullptr;  // query t sits at pos_base[0] + t
    // Batched decode: query t sits at tok_pos[t] of slot tok_slot[t] (its ring: cap rows after slot - 1's),
    // and sees only that sequence's keys (attention_warp.cu; split_len > 0). Null: pos_base, one cache.
    const int* tok_pos = nullptr;
    const int* tok_slot = nullptr;
    // A paged layer: as QkvPost's (kv_row). Prefill (attention_gemm) gathers its rows first.
    const int* block_table = nullptr;
    int64_t table_stride = 0;
    int block_shift = 0;
    int nsplit = 1;       // key range cut into nsplit pieces of split_len keys
    int split_len = 256;  // 0: ceil(range / nsplit) from the device-side position (decode graphs)
    int min_split = 32;   // split_len 0: at least this many keys per piece
    // (split_len 0, the decode graphs: pieces past the current range exit at once, and the merge counts only
    // the pieces that hold keys)
    float* part_o = nullptr;   // [n][nH][nsplit][d] scratch
    float* part_ml = nullptr;  // [n][nH][nsplit][2] scratch
    float* out = nullptr;      // [n][nH][d]
    // Batched decode's separate merge: also out's bf16 halves ([n][nH d] each, o_proj's input rows as
    // split_rows writes them); null: none.
    bf16* out_hi = nullptr;
    bf16* out_lo = nullptr;
    // Decode (split_len 0): [n][nH] zeroed counters; the last piece of each head merges them all into `out`
    // (one kernel). Batched decode (fixed pieces) leaves them null: attention() runs a separate merge.
    unsigned int* merge_counters = nullptr;
    // Decode: the nsplit pieces of a head (cluster == nsplit, <= kMaxAttnCluster) as one thread-block
    // cluster merging through distributed shared memory, not the ticket (merge_counters then go unused);
    // 0 = the ticket (Tuning::attn_cluster).
    int cluster = 0;
    // batched decode: at most this many query heads per warp; 0 = automatic (attention_warp.cu)
    int max_heads = 0;
    // batched decode over a bf16 cache: the tensor-core pieces (attention_mma.cu) where they fit
    bool mma = false;
};
void attention(const AttnArgs& a, int n, cudaStream_t s);
// Batched decode's separate merge (attention_batched.cu): above this many pieces a head, the wide merge (a
// head over many blocks) rather than one block walking them
constexpr int kWideMergePieces = 32;
constexpr int kMaxAttnCluster = 16;
// Decode attention: pieces of at least kAttnMinKeys keys (attention.cu's split_len 0 rule), at most ~2 waves
// of blocks per layer, only the pieces holding keys run and merge. Measured on the H200
// (docs/performance.md): 64 keys beat pieces of >= 32 keys with up to 512 blocks per layer (every piece
// reporting) by 0.2-0.6 ms per token on all four variants, 32 beat 64 by another 2-5% (also at a 2000-token
// context), 128/256 lost; 16 beat 32 by 0.2-1.9% in two runs of all four. It only matters below the ~2-wave
// cap: on the sliding layers (512 keys) at any context, on the full layers at short contexts.
constexpr int kAttnMinKeys = 16;
// Whether clusters of C decode pieces (nH heads of dim d) can be scheduled on this GPU (sm_90+).
bool attention_cluster_fits(int C, int nH, int d);
// attention_warp.cu: batched decode's pieces (tok_pos, split_len > 0), a warp per piece for the query heads
// of a KV group
void attention_warp_pieces(const AttnArgs& a, int n, cudaStream_t s);
// attention_mma.cu: the same pieces on the tensor cores, all query heads of a KV group per warp; fits a bf16
// or fp8 cache, at most 8 query heads per KV head and head dims 64, 128, 256, 512
bool attention_mma_fits(const AttnArgs& a);
void attention_mma_pieces(const AttnArgs& a, int n, cudaStream_t s);
// The two halves of attention(): the pieces, and their merge (skipped when merge_counters are given).
// Decode's pieces (split_len 0, merge_counters) and batched decode's (tok_pos, fixed pieces); prefill runs
// attention_gemm.
void attention_pieces(const AttnArgs& a, int n, cudaStream_t s);
void attention_combine(const AttnArgs& a, int n, cudaStream_t s);

// ---- attention_gemm.cu: prefill attention as cuBLAS GEMMs -----------------------------------------------
// One sequence's chunk of n queries at positions pos0.. over the key slots [0, min(cap, pos0 + n)): per head
// S = Q K^T, a masked softmax in place, a.out = P V (fp32 products); heads (and, past the scratch, query
// rows) in batches.
struct AttnGemm {
    cublasHandle_t blas = nullptr;  // on the same stream
    float* s = nullptr;             // scores scratch [s_floats]
    int64_t s_floats = 0;
    void** ptrs = nullptr;  // device [6][nH] pointer arrays
    // A bf16 or fp8 cache: the chunk's queries rounded to bf16 [n][nH][d] (the GEMMs' operands share one
    // type)
    bf16* q16 = nullptr;
    // A paged layer (AttnArgs.block_table): its rows [0, pos0 + n) gathered here first, K then V, contiguous;
    // an fp8 cache's rows [0, min(cap, pos0 + n)) of every layer, widened to bf16
    void* gather = nullptr;
};
// Throws where it does not apply (batched decode) or the scratch cannot hold 16 rows of one head's scores.
void attention_gemm(const AttnArgs& a, int n, int64_t pos0, const AttnGemm& g, cudaStream_t s);

// ---- gemv_quant.cu: quantised weights (model/weights.h QuantMatrix) at one token on the tensor cores ------
// The decode step's products over FP8 or int4 matrices: y = W @ xn, xn as GemvInput makes it (the input norm
// folded in or not). K a multiple of 64, each segment's rows a multiple of 16. gemv() routes segments with a
// quantised matrix here.
void gemv_quant(const GemvInput& in, const GemvSeg* segs, int nseg, cudaStream_t s);
// y = gelu_tanh(Wg @ xn) * (Wu @ xn) over quantised gate and up projections.
void gemv_quant_geglu(const GemvInput& in, WeightFormat f, const QuantMatrix& wg, const QuantMatrix& wu,
                      int rows, float* y, cudaStream_t s);
// The MoE's decode over quantised experts (the bf16 layout's rows): h[slot] = GeGLU of slot's expert on x (as
// moe_gate_up_decode); slots[slot] = down[expert of slot] @ h[slot], one row of H per slot, which
// residual_moe_combine then weighs by sel_w (a slot of another rank's expert: zeros).
void moe_gate_up_decode_quant(WeightFormat f, const float* x, int H, const QuantMatrix& gate_up, int Ie,
                              int K, const int* group_expert, float* h, cudaStream_t s);
void moe_down_decode_quant(WeightFormat f, const float* h, int Ie, const QuantMatrix& down, int H, int K,
                           const int* group_expert, float* slots, cudaStream_t s);
// Raises the quantised kernels' shared-memory limit (x staged, up to 32768 wide); gemv_prepare calls it.
void gemv_quant_prepare();
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
// topk_select for up to kTopKRowsMax rows of a batched step at once (row[i] of logits [.][row_stride]), each
// with its own penalty window (pen + i pen_stride: n_pen[i] ids, then their counts), penalties and k; row
// i's slices at slices + i ceil(V / kTopKSlice) kTopKMax, its keys at out + i kTopKMax, its info at
// info + 2 i. Passed by value (the rows' scalars fit a launch's parameters).
constexpr int kTopKRowsMax = 128;
struct TopkRows {
    const float* logits = nullptr;
    int64_t row_stride = 0;
    const int* pen = nullptr;
    int pen_stride = 0;
    unsigned long long* slices = nullptr;
    unsigned long long* out = nullptr;
    int* info = nullptr;
    int n = 0;
    int row[kTopKRowsMax], n_pen[kTopKRowsMax], k[kTopKRowsMax];
    float rp[kTopKRowsMax], pp[kTopKRowsMax], fp[kTopKRowsMax];
};
void topk_select_rows(const TopkRows& rows, int V, cudaStream_t s);
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
