// The Gemma 4 decoder on one CUDA device: weights resident in GPU memory (DeviceWeights), fp32 activations
// and a bf16 or fp32 KV cache (kv_cache.h), a decode step captured once as a CUDA graph and replayed per
// token, and batched prefill through cuBLAS. The model's math follows cpu/forward.cpp step by step; step.cu
// holds the decode step, prefill.cu the prefill, weights.cu the weights.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda/backend.h"
#include "cuda/check.h"
#include "cuda/kernels/kernels.h"
#include "cuda/kv_cache.h"
#include "cuda/model_state.h"
#include "cuda/profiling/profiler.h"
#include "loading/memory_plan.h"
#include "model/config.h"
#include "model/weights.h"
#include "runtime/graph_timeline.h"
#include "runtime/kv_dtype.h"
#include "runtime/sampler.h"
#include "runtime/tuning.h"

namespace markbase {
class NcclGroup;
struct PartitionPlan;
}  // namespace markbase

namespace markbase::cuda {

class CudaModel;

// Weights in device memory, in the checkpoint's layout; Weights' pointers are device pointers here.
struct DeviceWeights {
    ModelConfig config;
    Weights w;
    struct Tensor {
        std::string name;
        std::vector<int64_t> shape;
        const bf16* ptr = nullptr;
        uint64_t bytes = 0;
    };
    std::vector<Tensor> tensors;  // plan order
    uint64_t bytes = 0;
    void* arena = nullptr;  // when set, one allocation holds every tensor (the staged loader); else one each
    // w.quant's bytes, scales and zero points (attach_quant_weights), one allocation; quant_format says
    // which format they are (kBf16: none)
    void* quant_arena = nullptr;
    uint64_t quant_bytes = 0;
    WeightFormat quant_format = WeightFormat::kBf16;
    // Where the dense projections' bf16 copy is not kept (loader.h CopyDrop): a prompt chunk's or a batched
    // step's product dequantises its matrices here first (dequant_scratch_bytes: a layer's largest launch)
    bf16* dequant_scratch = nullptr;
    uint64_t dequant_scratch_bytes = 0;
    DeviceWeights() = default;
    DeviceWeights(const DeviceWeights&) = delete;
    DeviceWeights& operator=(const DeviceWeights&) = delete;
    ~DeviceWeights();
};

// The Weights pointer of a bf16 copy that is not kept (loader.h CopyDrop): not null (the pointers also say
// which tensors a layer has), and no device memory, so a read of it faults rather than computing with stale
// values.
inline const bf16* const kDroppedBf16 = reinterpret_cast<const bf16*>(uintptr_t{256});

// cudaMalloc that throws markbase::Error naming `what`, the size and the free memory.
bf16* device_alloc(uint64_t bytes, const std::string& what);
// The checkpoint's weights through the staged loader (staged_load.cu; its threads and chunk from the
// tuning).
std::unique_ptr<DeviceWeights> upload_weights(const Checkpoint& ck, const Tuning& tuning);
std::unique_ptr<DeviceWeights> synthetic_weights(const ModelConfig& c, uint64_t seed);
// shard.cu: one tensor-parallel rank's weights on the current device, its config rank_config's: the
// checkpoint's shard_weights, or synthetic_weights' very values (element for element) cut the same way.
std::unique_ptr<DeviceWeights> upload_shard(const Checkpoint& ck, const PartitionPlan& plan);
std::unique_ptr<DeviceWeights> synthetic_shard(const ModelConfig& c, const PartitionPlan& plan,
                                               uint64_t seed);

// Backend helpers shared by the one-GPU and the tensor-parallel backends (backend.cu).
// Ids the embedding (and, with PLE, the per-layer table) can look up; a bad one is named, not read.
void check_token_ids(const ModelConfig& c, const int* ids, int64_t n);
// Backend::eval on one model: the context and id checks, then one decode step or prefill chunks. whole: the
// model's config (a rank's model has its own widths; host logits rows are the whole vocabulary wide and a
// rank writes its columns of them).
void eval_model(CudaModel& m, const ModelConfig& whole, const int* ids, int64_t n, float* logits,
                bool all_logits);
// tp_backend.cu: the backend over opt.tensor_parallel GPUs, from a checkpoint (ck) or random weights.
std::unique_ptr<CudaBackend> make_tp_backend(const ModelConfig& c, const Checkpoint* ck, uint64_t seed,
                                             const BackendOptions& opt);

// Tensor parallelism (issue 7): the model is rank `rank` of `world`, its weights that rank's shard and its
// config rank_config's widths. Each collective runs on the model's stream, inside the decode graph: a sum
// after the embedding (only the owner of the token's vocabulary row writes it), after o_proj and after the
// FFN (the MoE's dense partial and its experts' weighted sum together), and a max over the ranks' argmax
// keys.
struct ShardContext {
    NcclGroup* group = nullptr;
    int rank = 0, world = 1;
    int64_t vocab_begin = 0;  // this rank's first vocabulary row
    int64_t vocab_total = 0;  // the model's vocabulary (host logits rows are this wide)
    int expert_begin = 0, expert_count = -1;
};

// model.cu: an executable graph from g (which it destroys), or an error naming the instantiation.
cudaGraphExec_t instantiate_graph(cudaGraph_t g);

class CudaModel {
  public:
    // slots: sequences with a cache each, for decode_batch (1: the single-sequence model)
    // kv_blocks: with slots, the paged cache's pool (memory_plan.h; 0: every slot's whole context)
    CudaModel(std::unique_ptr<DeviceWeights> dw, int64_t ctx, int chunk, const Tuning& tuning,
              KvDtype kv_dtype, const ShardContext* shard = nullptr, int slots = 1, int64_t kv_blocks = 0);
    ~CudaModel();
    CudaModel(const CudaModel&) = delete;
    CudaModel& operator=(const CudaModel&) = delete;

    const ModelConfig& config() const { return c_; }
    const DeviceWeights& weights() const { return *dw_; }
    int64_t ctx() const { return ctx_; }
    int chunk() const { return chunk_; }
    uint64_t cache_bytes() const { return kv_.bytes; }
    int64_t n_past = 0;

    bool sharded() const { return shard_.world > 1; }
    // Sharded: one collective of each kind, so that NCCL connects now rather than inside a graph capture.
    // Every rank's thread calls it together, once every rank's model exists.
    void connect();
    // Sharded, with peer access between the GPUs: this rank's inbox and flags for peer_sum (allocated here),
    // then every rank's, after which the decode step's sums run as peer_sum instead of NCCL (before the first
    // decode: the graph is captured with whichever is set).
    struct PeerEndpoint {
        float* inbox = nullptr;
        unsigned long long* flags = nullptr;
    };
    PeerEndpoint peer_endpoint();
    void use_peers(const std::vector<PeerEndpoint>& ranks);
    bool peer_timed_out();  // a peer_sum waited 2 s for a peer (a bug or a dead GPU): the results are wrong
    // n <= chunk tokens at position n_past; logits [n][V] (all_logits) or [V] for the last token, or none.
    // Sharded, V is the whole vocabulary and the rank writes only its columns.
    void prefill(const int* ids, int n, float* logits, bool all_logits);
    // Drops positions >= n (false, nothing changed, when a sliding ring already overwrote what n needs).
    bool truncate(int64_t n);
    // One token through the captured graph.
    void decode(int id, float* logits);
    std::vector<int> decode_greedy(int steps, float* last_logits);
    // One token through the graph, then topk_select over its logits: the k best (logit, id) of the penalised
    // row into top, n_finite, and whether a NaN/+inf was seen (then the row is copied to logits instead).
    // pen: n_pen ids then n_pen counts, n_pen <= kMaxPenaltyIds. Returns false when the row was bad.
    // Sharded: over this rank's vocabulary columns (global ids in, global ids out); the caller merges the
    // ranks' candidates.
    static constexpr int kMaxPenaltyIds = 1024;
    bool decode_select(int id, const int* pen, int n_pen, float rp, float pp, float fp, int k,
                       std::vector<Sampler::Top>* top, int64_t* n_finite, float* logits);
    bool can_select() const { return st_.d_sel_top != nullptr; }
    // topk_select's keys (k of them, 0 = none) as candidates, id_offset added to each id
    static void unpack_top(const unsigned long long* keys, int k, int64_t id_offset,
                           std::vector<Sampler::Top>* top);

    // Batched decode (batch.cu, docs/batched-decode.md): slots() sequences, each with its own cache and
    // position. The single-sequence API above is slot 0's when nothing else is used; do not mix the two.
    int slots() const { return slots_; }
    int64_t slot_past(int slot) const { return slot_pos_.at(static_cast<size_t>(slot)); }
    void reset_slot(int slot);
    // Appends n <= chunk ids to the slot's sequence (a prefill into its cache).
    void prefill_slot(int slot, const int* ids, int n);
    // The paged cache (slots > 1): its pool, and slot's block numbers [0, n) in the given blocks (used from
    // the slot's next step on; an id outside the pool, or more than ctx / kKvBlock of them, is an Error).
    int64_t kv_pool_blocks() const { return kv_.pool_blocks; }
    void set_slot_blocks(int slot, const int* blocks, int64_t n);
    // One token for each of n distinct slots in one batched pass (GEMMs over the n rows); the greedy next id
    // of each; logits [n][V] when given. Each slot's position advances by one.
    std::vector<int> decode_batch(const int* slot_ids, const int* ids, int n, float* logits);
    // A mixed step (mixed.cu): each item appends its ids to its slot (distinct slots; one decode token, or a
    // prompt chunk), all of them rows of one pass over the weights, at most chunk() rows. The leading
    // one-id items attend through the batched step's pieces, every later item through the prompt's attention
    // over its slot. Returns the greedy next id of each item with logits set, in item order; logits [k][V]
    // of those rows when given (they stay on the device for batch_select either way). Eager, not a graph.
    std::vector<int> mixed_batch(const SlotItem* items, int count, float* logits);
    // mixed_batch's step with events around each phase of each layer (the slots advance)
    std::vector<CudaProfileEntry> profile_mixed(const SlotItem* items, int count);
    // After a decode_batch that copied no logits (its rows stay on the device until the next step): the most
    // rows batch_select takes at once (0: none; a tensor-parallel rank holds part of each row), row r's
    // logits to the host, and each listed row's best candidates as decode_select chooses them, with its own
    // penalties (batch_sample.cu).
    int batch_select_rows() const { return sharded() ? 0 : st_.sel_rows; }
    void batch_row_logits(int row, float* host);
    void batch_select(BatchRowSelect* rows, int m);
    double batch_expert_weight_bytes(int n) const;  // batch.cu
    // decode_batch's step run eagerly with events around each phase of each layer (the positions advance).
    std::vector<CudaProfileEntry> profile_batch(const int* slot_ids, const int* ids, int n);
    using MoePrefillStats = cuda::MoePrefillStats;
    const MoePrefillStats& moe_prefill_stats() const { return moe_.stats; }
    void copy_logits(float* host);  // the last step's logits row (sharded: this rank's columns of it)
    std::vector<CudaProfileEntry> profile_step();
    // A prefill of n <= chunk tokens at n_past with events around each phase of each layer (the prompt
    // advances, logits are not copied): where a prefill's time goes.
    std::vector<CudaProfileEntry> profile_prefill(const int* ids, int n);
    bool profile_gated() const { return profile_gated_; }  // the last profile ran behind the gate
    // graph_timeline_cupti.cu: the decode graph captured again with each launch's nodes noted, replayed
    // between events, then `replays` times under CUPTI (graph_timeline.h). Every replay is a real step (up to
    // timeline_positions(replays) tokens). Never throws: a failure, or no CUPTI, comes back as why_not.
    GraphTimeline decode_timeline(int replays);
    // The batched step of the slots (n >= 2, each at its position, ids their next tokens) the same way: its
    // graph captured with each launch's nodes noted, replayed between events, then under CUPTI. Every replay
    // is the same step (the positions do not move: each writes the same K/V rows again). Never throws.
    GraphTimeline batch_timeline(const int* slot_ids, const int* ids, int n, int replays);

  private:
    // q/k norms + RoPE + cache write arguments for layer i (decode and prefill build the same ones)
    QkvPost qkv_post_args(int i) const;
    // Every launch of the decode step and the prefill goes through run(): with a Profiler (a step or a
    // prefill run without a graph) between events, else launched (and, while the timeline captures, its
    // graph nodes noted); the hooks' skip list leaves launches out (profiling/profiler.h).
    template <class F>
    void run(Profiler* pf, const char* name, int layer, double bytes, F&& launch) {
        if (hooks_.skips(name)) return;
        if (!pf) {
            launch();
            if (hooks_.capture) timeline_note(name, layer, bytes);
            return;
        }
        pf->time(name, layer, bytes, stream_, launch);
    }
    LaunchHooks hooks_;
    void record_step(Profiler* pf);  // step.cu: the decode step's kernels, n = 1
    // step.cu: one layer at one token, in the named blocks of cpu/forward.cpp's layer
    void record_layer(int i, Profiler* pf);
    void record_attention(int i, Profiler* pf);
    bool record_attention_mma(int i, AttnArgs& a, Profiler* pf);  // Tuning::decode_attn=mma's layers
    bool record_ffn(int i, Profiler* pf);  // whether the MoE's experts were forked to moe_.stream2
    void record_moe_combine(int i, Profiler* pf, bool overlap);
    void record_ple(int i, Profiler* pf);
    // the FFN's last update's scale: layer_scalar goes on the layer's last update (the PLE's, where present)
    float ffn_scale(int i) const { return c_.ple_dim ? 1.0f : w_.layers[i].layer_scalar; }
    void record_experts(int i, Profiler* pf, cudaStream_t st);  // step.cu: router .. experts_down
    GemvInput gemv_input(const float* x, int K) const;          // step.cu: this model's GEMV settings
    GemvSeg seg_of(const bf16* w, const QuantMatrix& q, float* y, int rows) const;  // step.cu
    WeightFormat format_of(const QuantMatrix& m) const;                             // step.cu
    // step.cu: the current x as a GEMV input (a deferred update is launched first, for `layer`)
    GemvInput x_input(Profiler* pf, int layer, bool norm, const bf16* norm_w);
    void residual(Profiler* pf, const char* name, int layer, const float* y, const bf16* w, float scale,
                  const bf16* next_w = nullptr);
    void flush_residual(Profiler* pf, int layer);
    // y[rows] = W @ xin (K wide) at one token, then (res_w not null) x = (x + RMSNorm(y) * res_w) * scale:
    // an update that waits as pending_ for its consumer (plan_.prenorm) or runs as its own kernel at once.
    // reduce (tensor parallel): y is this rank's partial sum; it is summed over the ranks before the update.
    // next_w: the input norm of the GEMV that reads x next, for an update launched at once (plan_.prenorm).
    // W8: W as FP8 (read instead of W when set).
    void project_residual(Profiler* pf, const char* name, const char* res_name, int layer, const bf16* W,
                          const QuantMatrix& W8, int rows, const float* xin, int K, float* y,
                          const bf16* res_w, float scale, bool reduce = false, const bf16* next_w = nullptr);

    // Sharded only (no-ops otherwise): in-place sum of n floats over the ranks; max of the argmax key.
    void all_reduce(Profiler* pf, int layer, float* buf, size_t n);
    void all_reduce_argmax(Profiler* pf);
    // rows x (this rank's vocabulary columns) of device logits into host rows of the whole vocabulary
    void logits_to_host(float* host, const float* dev, int rows);
    ExpertRange held_experts() const { return {shard_.expert_begin, shard_.expert_count}; }
    bool peer_ready(size_t n) const {
        return in_decode_ && ps_.world > 1 && n <= static_cast<size_t>(ps_.max_n);
    }
    void embed_chunk(Profiler* pf, int n);  // prefill.cu: embeddings and per-layer inputs of n ids
    // prefill.cu: one layer over n tokens at pos0.., in the named blocks of cpu/forward.cpp's layer
    void prefill_layer(int i, int n, int64_t pos0);
    void prefill_attention(int i, int n, int64_t pos0);
    // mixed.cu: a mixed step's attention at layer i over its n rows (a: the decode rows' batched pieces)
    void mixed_attention(int i, AttnArgs& a, int n);
    void record_mixed(int n, const std::vector<int>& wanted);  // mixed.cu: the step's launches
    std::vector<int> mixed_run(const SlotItem* items, int count, float* logits, Profiler* pf);
    void prefill_ffn(int i, int n);
    void prefill_experts_of(int i, int n, cudaStream_t s);  // router, routing, experts (2.6) on stream s
    void prefill_moe_combine(int i, int n);
    void prefill_ple(int i, int n);
    // Y[n][N] = alpha (hi+lo)[n][K] W^T; W's rows q where its bf16 copy was not kept (loader.h CopyDrop)
    void gemm(const bf16* W, int N, int K, int n, float* Y, int64_t ldy, float alpha = 1.0f,
              const QuantMatrix& q = {});
    // gemm() for matrices of one input (q/k/v, gate/up; each seg's q as gemm's): one stream_gemm launch where
    // it applies
    void gemm_many(const GemvSeg* segs, int nseg, int K, int n);
    void gemm_cublas(const bf16* W, int N, int K, int n, float* Y, int64_t ldy, float alpha);
    // A product's bf16 weights: the copy, or its rows q dequantised into the scratch at `at` (advanced)
    const bf16* bf16_weights(const bf16* w, const QuantMatrix& q, int rows, int K, bf16*& at);
    bool own_product(const GemvSeg* segs, int nseg, int K, int n);  // stream_gemm or tile_gemm ran them
    // Where a GEMM's lo half lives: right after its n rows of hi (width K), so [hi; lo] is one [2n][K] input
    bf16* lo_at(int n, int K) const { return act_.hi + int64_t{n} * K; }
    // x's input rows of a product (split_rows of x: normed by w, or as it is); on: a split is wanted
    struct XSplit {
        bool on = false;
        bool norm = false;
        const bf16* w = nullptr;
    };
    RowSplit split_for(const XSplit& next, int n);  // an update of n rows writes next's rows too
    void split_x(const XSplit& want, int n);        // act_.hi, lo = want's rows (launched unless written)
    XSplit after_ffn(int i) const;                  // the rows the product after layer i's FFN takes
    XSplit layer_input(int i) const;                // layer i's q/k/v rows (past the last: lm_head's)
    // The experts of prefill layer i over n tokens (after moe_route and moe_bucket), no host in the loop:
    // moe_gemm where it tiles the widths (FP8 experts where the model has them), else the grouped GEMV
    // kernels. Writes moe_.eslots. A batched step that batch_on_device allows runs batch_experts instead
    // (moe_stream; on any stream).
    void prefill_experts(int i, int n);
    void batch_experts(int i, int n, cudaStream_t s);
    // the decode step as a graph (ensure_graph's capture; the caller owns it) for one range of positions
    cudaGraph_t capture_step(StepRange range = StepRange::kGeneral);
    cudaGraphExec_t ensure_graph(StepRange range = StepRange::kGeneral);  // the current slot's
    // The graph for a step at position pos (captured on first use): the short-range one while every layer's
    // range fits its clusters (plan_.attn_short_keys), the long-range one past plan_.attn_long_keys over a
    // bf16 or fp8 cache (Tuning::decode_attn), else the general one. All are correct at any position; this
    // is speed only.
    StepRange step_range(int64_t pos) const {
        if (plan_.attn_short_keys > 0 && pos + 1 <= plan_.attn_short_keys) return StepRange::kShort;
        if (plan_.attn_long_keys > 0 && kv_.elem_bytes < 4 && pos + 1 > plan_.attn_long_keys)
            return StepRange::kLong;
        return StepRange::kGeneral;
    }
    cudaGraphExec_t step_graph(int64_t pos);
    void timeline_note(const char* name, int layer, double bytes);
    // capture: the step as a graph, each launch noted; decode: the decode step's (its positions advance by
    // a replay, so the context must hold them, and the ids count is zeroed before the replays)
    GraphTimeline timeline_run(int replays, const std::function<cudaGraph_t()>& capture, bool decode,
                               int64_t* launched);
    void launch_step(int id);  // the decode graph for token `id` at n_past (no sync, n_past unchanged)
    void release();            // frees everything this object allocated (destructor, failed constructor)
    // The constructor's parts (model.cu): the widest per-layer shapes; what the tuning and the shape
    // decide for the decode step; the step's state and activations; the MoE's scratch; the KV cache.
    struct Widths {
        int q = 0, kv = 0, mlp = 0;           // nH * d, nKV * d, the MLP's width: the widest layer's
        int head = 0;                         // the largest head dim
        int head_sliding = 0, head_full = 0;  // the sliding and full layers' head dims (0: none)
    };
    Widths widths() const;
    void plan_decode(const Tuning& tuning);
    void alloc_step();
    void alloc_moe();
    void alloc_cache(const Widths& wd);
    void upload_block_tables();  // the host's block tables to the device (stream-ordered), when changed
    template <class T>
    T* alloc(size_t count);
    // buffers.cu: the memory plan's buffer b (layout_), allocated once; after construction, check_layout()
    // throws an internal error unless the bytes allocated are exactly the plan's
    template <class T>
    T* take(CudaBuf b);
    void check_layout() const;
    void ensure_all_logits();  // act_.all_logits: on first use by one sequence (eagerly with slots)
    void attention_args(int i, AttnArgs& a) const;
    // Layer i's cache in QkvPost / AttnArgs: the current slot's (cur_slot_), or while decode_batch runs the
    // slots' base with each token's position and slot; a paged layer's through the block tables.
    template <class Args>
    void bind_cache(int i, Args& a) const {
        bind_cache(i, a, batch_, cur_slot_);
    }
    // ... of one slot's (batch false: a mixed step's prompt chunk), or the batched binding
    template <class Args>
    void bind_cache(int i, Args& a, bool batch, int slot) const {
        const LayerCache& lc = kv_.layers[i];
        const int64_t off = batch || lc.paged ? 0 : slot * lc.slot_stride * kv_.elem_bytes;  // bytes
        a.cap = lc.cap;
        a.kv = kv_.elem_bytes == 1 ? KvElem::kFp8 : kv_.elem_bytes == 2 ? KvElem::kBf16 : KvElem::kF32;
        a.k_cache = static_cast<char*>(lc.k) + off;
        a.v_cache = static_cast<char*>(lc.v) + off;
        if (lc.paged) {
            a.block_table = kv_.table + (batch ? 0 : slot * kv_.table_stride);
            a.table_stride = kv_.table_stride;
            a.block_shift = kKvBlockShift;
        }
        if (batch) {
            a.tok_pos = d_bpos_;
            a.tok_slot = d_bslot_;
        }
    }

    std::unique_ptr<DeviceWeights> dw_;
    const ModelConfig& c_;
    const Weights& w_;
    int64_t ctx_;
    int chunk_;
    ShardContext shard_;
    PeerSum ps_;  // set by use_peers: the decode step's sums over NVLink

    DecodePlan plan_;            // what the tuning and the shape decide for the decode step
    StepState st_;               // the decode step's device state and sampling scratch
    Activations act_;            // activations and the GEMMs' / attention's scratch
    MoeScratch moe_;             // the 26B's routing, experts and their streams
    KvCache kv_;                 // the KV cache and the RoPE tables
    AttnGemm attn_gemm_;         // prefill attention's scratch (attention_gemm.cu)
    std::vector<void*> allocs_;  // every cudaMalloc of the above (release() frees them)
    // Every buffer's size (loading/memory_plan.h, the list the fit check adds up), which of them are taken,
    // and the bytes alloc() has handed out
    CudaBuffers layout_;
    std::array<bool, static_cast<size_t>(CudaBuf::kCount)> taken_{};
    uint64_t alloc_bytes_ = 0;

    // streams and graphs
    cudaStream_t stream_ = nullptr;
    cublasHandle_t blas_ = nullptr;
    // the decode step's graphs by (sequence slot, range of positions: step_range); a slot's cache is bound
    // at capture
    std::map<std::pair<int, StepRange>, cudaGraphExec_t> step_graphs_;

    // while a step is recorded
    StepRange rec_range_ = StepRange::kGeneral;  // the range of the step recorded
    bool in_decode_ = false;                     // record_step runs (prefill keeps NCCL: its sums are large)
    Profiler* prefill_pf_ = nullptr;             // profile_prefill runs a prefill
    bool profile_gated_ = false;                 // the last profile_step ran behind the gate
    // A residual update waits as `pending_` for its consumer (plan_.prenorm): the consumer launches it, and
    // where that consumer is a GEMV with an input norm the update also writes act_.xn = RMSNorm(x) * that
    // norm's weight, the GEMV's input (one GPU, dense models: 31B -5.3%, E4B -5.6%, E2B -7.8%; sharded models
    // keep their updates behind the ranks' sums). The MoE's updates run at once (its expert fork wants
    // nothing pending): o_proj's writes the dense MLP's input, and with plan_.moe_prenorm also the router's
    // (act_.xr) and the experts' (moe_.e_in) inputs (-1.1%); the combine writes the next layer's q/k/v input
    // (xn_for_: the norm weight act_.xn holds, until the next x_input).
    struct PendingResidual {
        const float* y = nullptr;
        const bf16* w = nullptr;
        float scale = 1.0f;
        const char* name = nullptr;  // the update's own launch, by its consumer
    } pending_;
    const bf16* xn_for_ = nullptr;
    // the rows of x the last n-row update wrote into act_.hi (split_for), until split_x takes them
    XSplit x_split_;
    int x_split_n_ = 0;

    // batched decode: the slots, their positions, the slot the single-sequence calls address, and while
    // decode_batch runs, per-token positions / slots [chunk] and the next ids
    int slots_ = 1;
    std::vector<int64_t> slot_pos_;
    int cur_slot_ = 0;
    bool batch_ = false;
    struct BatchScope {  // batch_ while a batched or mixed step is recorded, also when it throws
        bool& flag;
        explicit BatchScope(bool& f) : flag(f) { flag = true; }
        ~BatchScope() { flag = false; }
        BatchScope(const BatchScope&) = delete;
        BatchScope& operator=(const BatchScope&) = delete;
    };
    // while mixed_batch runs: its leading one-id rows (the batched pieces, positions below decode_range) and
    // its prompt chunks (rows row0.. of slot `slot` from pos0, through attention_gemm)
    struct MixedChunk {
        int row0 = 0, n = 0, slot = 0;
        int64_t pos0 = 0;
    };
    struct MixedPlan {
        bool on = false;
        int decode_rows = 0;
        int64_t decode_range = 0;
        std::vector<MixedChunk> chunks;
    } mixed_;
    int *d_bpos_ = nullptr, *d_bslot_ = nullptr, *d_bnext_ = nullptr;
    // the last decode_batch's logits rows on the device ([n][V]; one sequence's in act_.logits)
    const float* batch_rows_ = nullptr;
    int batch_n_ = 0;
    // batch.cu: the batched step's graphs by (sequences, range class), captured on first use
    std::map<std::pair<int, int64_t>, cudaGraphExec_t> batch_graphs_;
    int64_t batch_range(int64_t max_pos) const;
    cudaGraphExec_t batch_graph(int n, int64_t range);
    cudaGraph_t capture_batch(int n, int64_t range);
    int64_t check_batch(const int* slot_ids, int n, std::vector<int>* pos, std::vector<int>* slot) const;
    void stage_batch(const int* ids, const std::vector<int>& pos, const std::vector<int>& slot);
    bool batch_on_device(int n) const;  // no host in the step's loop: it can be one graph
    bool fp8_experts() const;           // batched steps can stream FP8 experts (batch.cu)
    bool int4_experts() const;          // ... int4 experts (batch.cu)
    void record_batch(int n, int64_t range);
    void record_batch_logits(Profiler* pf, int rows);
    int decode_slot(int slot, int id, float* logits);  // one sequence: its slot's decode graph
    std::vector<int> batch_step(const int* slot_ids, const int* ids, int n, float* logits, Profiler* pf);
};

}  // namespace markbase::cuda
