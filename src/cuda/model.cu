// CudaModel's memory, graph and entry points: buffers sized once for the chunk and context, the KV cache, the
// decode graph (captured on first use, replayed per token), greedy decoding that never leaves the device, and
// the profiled step.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cuda/model.h"
#include "loading/memory_plan.h"
#include "model/sliding_ring.h"

namespace markbase::cuda {

namespace {

// The compact MoE prefill pass's GEMMs over this many streams (26B-A4B prefill of 512 tokens +3.4% at 2 and
// at 3, the same bits).
constexpr int kMoeCompactStreams = 2;

}  // namespace

template <class T>
T* CudaModel::alloc(size_t count) {
    void* p = nullptr;
    const size_t bytes = std::max<size_t>(count, 1) * sizeof(T);
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();
        throw Error("out of GPU memory: " + std::to_string(bytes >> 20) +
                    " MiB of activations or KV cache (lower --ctx-size or --batch-size)");
    }
    allocs_.push_back(p);
    return static_cast<T*>(p);
}

CudaModel::Widths CudaModel::widths() const {
    Widths w;
    for (const LayerSpec& s : c_.layers) {
        w.q = std::max(w.q, c_.n_heads * s.head_dim);
        w.kv = std::max(w.kv, s.n_kv_heads * s.head_dim);
        w.mlp = std::max(w.mlp, s.mlp_width);
        w.head = std::max(w.head, s.head_dim);
        (s.kind == AttentionKind::Sliding ? w.head_sliding : w.head_full) = s.head_dim;
    }
    return w;
}

CudaModel::CudaModel(std::unique_ptr<DeviceWeights> dw, int64_t ctx, int chunk, const Tuning& tuning,
                     const ShardContext* shard, int slots)
    : dw_(std::move(dw)), c_(dw_->config), w_(dw_->w), ctx_(ctx), chunk_(chunk) {
    if (shard) shard_ = *shard;
    if (slots < 1) throw Error("--parallel: at least one sequence slot, found " + std::to_string(slots));
    if (slots > 1 && sharded())
        throw Error("batched decode (--parallel) does not combine with tensor parallelism yet");
    slots_ = slots;
    slot_pos_.assign(static_cast<size_t>(slots), 0);
    if (sharded() && !shard_.group) throw Error("internal: a sharded model without its NCCL group");
    try {
        const Widths wd = widths();
        plan_decode(tuning);
        gemv_prepare(std::max({c_.hidden, wd.q, wd.mlp, c_.ple_dim, c_.moe ? c_.expert_width : 0}));
        CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        CUBLAS_CHECK(cublasCreate(&blas_));
        CUBLAS_CHECK(cublasSetStream(blas_, stream_));
        alloc_step(wd, tuning);
        if (c_.moe) alloc_moe(tuning);
        alloc_cache(wd);
        CUDA_CHECK(cudaDeviceSynchronize());
    } catch (...) {
        release();
        throw;
    }
}

// What the tuning and the model's shape decide for the decode step: the GEMV kernels, the attention pieces
// per layer, the short-range cluster graph, and the updates' prenorm.
void CudaModel::plan_decode(const Tuning& tuning) {
    const int nH = c_.n_heads, L = c_.n_layers;
    // The 26B-A4B on one GPU runs its GeGLU launches through the cp.async ring (-3.5% per token: its dense
    // GeGLU runs beside the experts, and the ring's 264 blocks leave them room); the dense models measured
    // +0.8..+3.6% with it.
    const bool async_geglu = tuning.gemv == Tuning::Gemv::kAsyncGeglu ||
                             (tuning.gemv == Tuning::Gemv::kAuto && c_.moe && !sharded());
    gemv_kernel_ = async_geglu ? GemvKernel::kRowsAsyncGeglu : GemvKernel::kRows;
    // One GPU (both at 8 chunks per lane only): 31B -3.5..-5.2% together, E4B -1.1..-1.2%. Not yet run with
    // tensor parallelism, so a sharded model keeps them off.
    geglu_split_ = !sharded();
    min_waves_ = sharded() ? 0 : 3;
    prenorm_ = !sharded();
    moe_prenorm_ = prenorm_ && c_.moe;
    skip_ = tuning.skip;
    if (!skip_.empty()) {
        std::string names;
        for (const std::string& k : skip_) names += (names.empty() ? "" : "+") + k;
        std::fprintf(stderr,
                     "tuning skip=%s: those kernels are not launched (a timing experiment; every output is "
                     "wrong)\n",
                     names.c_str());
    }
    int sms = 0, dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    // Decode: a fixed number of pieces per head (the graph's grid), each taking an even share of the current
    // range (split_len 0): pieces of >= kAttnMinKeys keys, at most ~2 waves of blocks over the SMs.
    int64_t max_pieces = int64_t{chunk_} * nH * 4;
    decode_splits_.resize(L);
    int widest = 1, dmax = 0;
    for (int i = 0; i < L; ++i) {
        const LayerSpec& s = c_.layers[i];
        const int64_t range =
            s.kind == AttentionKind::Sliding ? std::min<int64_t>(c_.sliding_window, ctx_) : ctx_;
        const int64_t cap_pieces = std::max(1, 2 * std::max(sms, 1) / nH);
        decode_splits_[i] =
            static_cast<int>(std::clamp<int64_t>((range + kAttnMinKeys - 1) / kAttnMinKeys, 1, cap_pieces));
        max_pieces = std::max<int64_t>(max_pieces, int64_t{nH} * decode_splits_[i]);
        widest = std::max(widest, std::min(decode_splits_[i], kMaxAttnCluster));
        dmax = std::max(dmax, s.head_dim);
    }
    max_pieces_ = max_pieces;
    // The short-range graph with clustered attention: the dense models on one GPU (E2B -2.3%, E4B -2.1%, 31B
    // -1.0% below 256 keys, unchanged at 2000; the 26B-A4B read +1.6%, so it keeps one graph). Where clusters
    // cannot run (before sm_90) the default falls back to one graph; asked for, it is an error.
    const bool cluster = tuning.attn_cluster == Tuning::Choice::kOn ||
                         (tuning.attn_cluster == Tuning::Choice::kAuto && !c_.moe);
    if (cluster && !sharded()) {
        if (attention_cluster_fits(widest, nH, dmax))
            attn_short_keys_ = int64_t{kMaxAttnCluster} * kAttnMinKeys;
        else if (tuning.attn_cluster == Tuning::Choice::kOn)
            throw Error("--tuning attn_cluster=1: clusters of " + std::to_string(widest) +
                        " attention pieces cannot be scheduled on this GPU");
    }
}

// The decode step's state and the activations, sized for the chunk (and the prefill's GEMM inputs and
// attention scratch).
void CudaModel::alloc_step(const Widths& wd, const Tuning& tuning) {
    const int H = c_.hidden, nH = c_.n_heads, L = c_.n_layers, P = c_.ple_dim;
    const int64_t LP = int64_t{L} * P, V = c_.vocab_size, n = chunk_;
    d_state_ = alloc<int>(4);
    CUDA_CHECK(cudaMemset(d_state_, 0, 4 * sizeof(int)));
    CUDA_CHECK(cudaMallocHost(&h_state_, 4 * sizeof(int)));
    CUDA_CHECK(cudaMallocHost(&h_ids_, static_cast<size_t>(n) * sizeof(int)));
    d_ids_ = alloc<int>(n);
    d_out_ids_ = alloc<int>(ctx_);
    d_argmax_ = alloc<unsigned long long>(1);
    x_ = alloc<float>(n * H);
    d_counter_ = alloc<unsigned int>(1);
    CUDA_CHECK(cudaMemset(d_counter_, 0, sizeof(unsigned int)));
    xn_ = alloc<float>(H);
    d_attn_counters_ = alloc<unsigned int>(nH);
    CUDA_CHECK(cudaMemset(d_attn_counters_, 0, nH * sizeof(unsigned int)));
    if (gemv_kernel_ == GemvKernel::kRowsAsyncGeglu) {
        // rows of the widest one-token GEMV: q + k + v, the MLP, the PLE projections, the router
        int rows = std::max({H, wd.mlp, P, c_.moe ? c_.n_experts : 0, static_cast<int>(LP)});
        for (const LayerSpec& s : c_.layers) rows = std::max(rows, (nH + 2 * s.n_kv_heads) * s.head_dim);
        gemv_stream_.warps = gemv_async_prepare();
        gemv_stream_.rows = rows;
        gemv_stream_.part = alloc<float>(gemv_stream_.warps * 2 * 3);
        gemv_stream_.count = alloc<unsigned int>(rows);
        CUDA_CHECK(cudaMemset(gemv_stream_.count, 0, rows * sizeof(unsigned int)));
    }
    q_ = alloc<float>(n * wd.q);
    k_ = alloc<float>(n * std::max(wd.kv, 1));
    v_ = alloc<float>(n * std::max(wd.kv, 1));
    attn_ = alloc<float>(n * wd.q);
    o_ = alloc<float>(n * H);
    g_ = alloc<float>(n * std::max(wd.mlp, P));
    u_ = alloc<float>(n * std::max(wd.mlp, P));
    // sharded MoE: [n][H] dense partial, then [n][H] this rank's experts' weighted sum: one all-reduce
    m_ = alloc<float>((sharded() && c_.moe ? 2 : 1) * n * H);
    if (c_.moe) {  // the combine's weights for one already summed expert vector (the down-sum, ranks)
        const std::vector<float> ones(static_cast<size_t>(n), 1.0f);
        d_ones_ = alloc<float>(n);
        CUDA_CHECK(cudaMemcpy(d_ones_, ones.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    }
    if (P) {
        ple_ctx_ = alloc<float>(n * LP);
        ple_ = alloc<float>(n * LP);
    }
    logits_ = alloc<float>(V);
    if (V <= int64_t{kTopKSlice} / kTopKMax * kTopKSlice) {
        d_sel_slices_ = alloc<unsigned long long>((V + kTopKSlice - 1) / kTopKSlice * kTopKMax);
        d_sel_top_ = alloc<unsigned long long>(kTopKMax);
        d_sel_info_ = alloc<int>(2);
        d_pen_ = alloc<int>(2 * kMaxPenaltyIds);
        CUDA_CHECK(cudaMallocHost(&h_sel_top_, kTopKMax * sizeof(unsigned long long)));
        CUDA_CHECK(cudaMallocHost(&h_sel_info_, 2 * sizeof(int)));
        CUDA_CHECK(cudaMallocHost(&h_pen_, 2 * kMaxPenaltyIds * sizeof(int)));
    }
    hi_ = alloc<bf16>(2 * n * std::max({H, wd.q, wd.mlp, P}));
    if (const int64_t rows = std::min<int64_t>(n, kGemmStackMaxN); rows > 0) {
        // the dense GEMMs' widest output (lm_head's vocabulary, for all logits, keeps the two GEMMs)
        y2_cols_ = std::max<int64_t>({LP, wd.q, wd.kv, H, wd.mlp, P});
        y2_ = alloc<float>(2 * rows * y2_cols_);
    }
    part_o_ = alloc<float>(max_pieces_ * wd.head);
    part_ml_ = alloc<float>(2 * max_pieces_);
    // Prefill attention as GEMMs: the score rows of the longest key range the scratch holds, every head of a
    // chunk unless the tuning asks for fewer (tests: head and row batches)
    const int64_t rows =
        tuning.attn_gemm_rows > 0 ? tuning.attn_gemm_rows : std::min<int64_t>(n * nH, 1 << 24);
    attn_gemm_.blas = blas_;
    attn_gemm_.s_floats = rows * attn_gemm_keys(c_, ctx_, static_cast<int>(n));
    attn_gemm_.s = alloc<float>(static_cast<size_t>(attn_gemm_.s_floats));
    attn_gemm_.ptrs = alloc<void*>(6 * static_cast<size_t>(nH));
}

// The 26B's routing and experts: decode's second stream, the prefill's expert scratch and the compact
// pass's plan and streams.
void CudaModel::alloc_moe(const Tuning& tuning) {
    const int H = c_.hidden, E = c_.n_experts, K = c_.top_k, Ie = c_.expert_width;
    const int64_t n = chunk_;
    rlogits_ = alloc<float>(n * E);
    sel_w_ = alloc<float>(n * K);
    sel_id_ = alloc<int>(n * K);
    if (moe_prenorm_) xr_ = alloc<float>(H);
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream2_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
    moe_cap_ = moe_prefill_rows_cap(static_cast<int>(n), E, K);
    const int64_t rows = int64_t{E} * moe_cap_;  // the memory plan's; a pass may use less
    if (tuning.moe_prefill_cap > 0) moe_cap_ = std::clamp(tuning.moe_prefill_cap, 1, moe_cap_);
    mx_ = alloc<float>(rows * H);  // = 2 x bf16 [rows][H] (hi, lo), later the fp32 [rows][H] output
    mg_ = alloc<float>(rows * Ie);
    mu_ = alloc<float>(rows * Ie);
    mh_ = alloc<bf16>(2 * rows * Ie);
    const int srows = std::min(moe_cap_, kGemmStackMaxN);
    ey2_ = alloc<float>(int64_t{E} * 2 * srows * std::max(2 * Ie, H));
    // the compact pass reuses the scratch: [2 R][H] bf16 in mx_, [2 R][Ie] in mh_, ey2_ for both GEMMs'
    // outputs
    moe_compact_rows_ = std::min<int64_t>(rows, int64_t{E} * srows);
    for (int k = 0; k < kMoeCompactStreams; ++k) {
        cudaEvent_t ev = nullptr;
        CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
        moe_events_.push_back(ev);
    }
    for (int k = 1; k < kMoeCompactStreams; ++k) {
        cudaStream_t st = nullptr;
        CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        moe_streams_.push_back(st);
        cublasHandle_t hb = nullptr;
        CUBLAS_CHECK(cublasCreate(&hb));
        moe_blas_.push_back(hb);
        CUBLAS_CHECK(cublasSetStream(hb, st));
    }
    const size_t plan = 6 * static_cast<size_t>(E) * sizeof(void*) + (E + 1) * sizeof(int);
    CUDA_CHECK(cudaMallocHost(&h_mplan_, plan));
    d_mplan_ = alloc<char>(plan);
    CUDA_CHECK(cudaMallocHost(&h_goff_, (E + 1) * sizeof(int)));
    gexp_ = alloc<int>(std::max(E, K) + 1);
    goff_ = alloc<int>(std::max(E, K) + 1);
    gent_ = alloc<int>(n * K);
    e_in_ = alloc<float>(n * H);
    eh_ = alloc<float>(n * K * Ie);
    eslots_ = alloc<float>(n * K * H);
}

// The KV cache (KV-shared layers point at their source's), batched decode's per-token arrays, and the RoPE
// frequencies.
void CudaModel::alloc_cache(const Widths& wd) {
    const int L = c_.n_layers;
    const int64_t n = chunk_;
    cache_.resize(L);
    for (int i = 0; i < L; ++i) {
        const LayerSpec& s = c_.layers[i];
        if (!s.has_own_kv()) continue;
        LayerCache& lc = cache_[i];
        lc.cap =
            s.kind == AttentionKind::Sliding ? std::min<int64_t>(ctx_, c_.sliding_window + chunk_) : ctx_;
        lc.slot_stride = lc.cap * s.n_kv_heads * s.head_dim;
        const size_t elems = static_cast<size_t>(lc.slot_stride) * slots_;
        lc.k = alloc<float>(elems);
        lc.v = alloc<float>(elems);
        CUDA_CHECK(cudaMemset(lc.k, 0, elems * sizeof(float)));
        CUDA_CHECK(cudaMemset(lc.v, 0, elems * sizeof(float)));
        cache_bytes_ += 2 * elems * sizeof(float);
    }
    for (int i = 0; i < L; ++i)
        if (!c_.layers[i].has_own_kv()) cache_[i] = cache_[c_.layers[i].kv_source];
    if (slots_ > 1) {
        d_bpos_ = alloc<int>(n);
        d_bslot_ = alloc<int>(n);
        d_bnext_ = alloc<int>(n);
    }
    auto upload = [&](const std::vector<float>& v) {
        float* d = alloc<float>(v.size());
        CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
        return d;
    };
    if (wd.head_sliding) inv_sliding_ = upload(c_.rope_sliding.inverse_frequencies(wd.head_sliding));
    if (wd.head_full) inv_full_ = upload(c_.rope_full.inverse_frequencies(wd.head_full));
}

CudaModel::~CudaModel() {
    release();
}

void CudaModel::release() {
    if (graph_) cudaGraphExecDestroy(graph_);
    graph_ = nullptr;
    if (graph_short_) cudaGraphExecDestroy(graph_short_);
    graph_short_ = nullptr;
    if (blas_) cublasDestroy(blas_);
    blas_ = nullptr;
    if (stream_) cudaStreamDestroy(stream_);
    stream_ = nullptr;
    if (stream2_) cudaStreamDestroy(stream2_);
    stream2_ = nullptr;
    for (cublasHandle_t hb : moe_blas_) cublasDestroy(hb);
    moe_blas_.clear();
    for (cudaStream_t st : moe_streams_) cudaStreamDestroy(st);
    moe_streams_.clear();
    for (cudaEvent_t ev : moe_events_) cudaEventDestroy(ev);
    moe_events_.clear();
    for (cudaEvent_t* ev : {&fork_, &join_}) {
        if (*ev) cudaEventDestroy(*ev);
        *ev = nullptr;
    }
    for (void* p : allocs_) cudaFree(p);
    allocs_.clear();
    if (h_state_) cudaFreeHost(h_state_);
    h_state_ = nullptr;
    if (h_ids_) cudaFreeHost(h_ids_);
    h_ids_ = nullptr;
    for (void* p : {static_cast<void*>(h_sel_top_), static_cast<void*>(h_sel_info_),
                    static_cast<void*>(h_pen_), static_cast<void*>(h_goff_), h_mplan_})
        if (p) cudaFreeHost(p);
    h_sel_top_ = nullptr;
    h_sel_info_ = nullptr;
    h_pen_ = nullptr;
    h_goff_ = nullptr;
    h_mplan_ = nullptr;
}

void CudaModel::gemm(const bf16* W, int N, int K, int n, float* Y, int64_t ldy) {
    // Row-major Y[n][N] = X[n][K] W[N][K]^T is column-major Y^T = W^T(op) X^T; X = hi + lo (two bf16 halves).
    const float one = 1.0f, zero = 0.0f;
    if (n <= kGemmStackMaxN && N <= y2_cols_) {  // one pass over W: [hi; lo] as 2n columns, then the sum
        CUBLAS_CHECK(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, N, 2 * n, K, &one, W, CUDA_R_16BF, K, hi_,
                                  CUDA_R_16BF, K, &zero, y2_, CUDA_R_32F, N, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
        sum_halves(y2_, n, N, Y, ldy, stream_);
        return;
    }
    CUBLAS_CHECK(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, N, n, K, &one, W, CUDA_R_16BF, K, hi_,
                              CUDA_R_16BF, K, &zero, Y, CUDA_R_32F, static_cast<int>(ldy), CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
    CUBLAS_CHECK(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, N, n, K, &one, W, CUDA_R_16BF, K, lo_at(n, K),
                              CUDA_R_16BF, K, &one, Y, CUDA_R_32F, static_cast<int>(ldy), CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
}

void CudaModel::gemm_batched_stacked(const bf16* W, int64_t w_stride, int N, int K, int batch, int rows,
                                     const bf16* x, float* y2) {
    const float one = 1.0f, zero = 0.0f;
    const long long sx = 2LL * rows * K, sy = 2LL * rows * N;
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        blas_, CUBLAS_OP_T, CUBLAS_OP_N, N, 2 * rows, K, &one, W, CUDA_R_16BF, K, w_stride, x, CUDA_R_16BF, K,
        sx, &zero, y2, CUDA_R_32F, N, sy, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void CudaModel::gemm_batched(const bf16* W, int64_t w_stride, int N, int K, int batch, int rows,
                             const bf16* hi, const bf16* lo, float* Y) {
    // gemm() per batch entry, as one strided-batched call per half
    const float one = 1.0f, zero = 0.0f;
    const long long sx = static_cast<long long>(rows) * K, sy = static_cast<long long>(rows) * N;
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, N, rows, K, &one, W, CUDA_R_16BF,
                                            K, w_stride, hi, CUDA_R_16BF, K, sx, &zero, Y, CUDA_R_32F, N, sy,
                                            batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, N, rows, K, &one, W, CUDA_R_16BF,
                                            K, w_stride, lo, CUDA_R_16BF, K, sx, &one, Y, CUDA_R_32F, N, sy,
                                            batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void CudaModel::attention_args(int i, AttnArgs& a) const {
    const LayerSpec& s = c_.layers[i];
    a.q = q_;
    bind_cache(i, a);
    a.nH = c_.n_heads;
    a.nKV = s.n_kv_heads;
    a.d = s.head_dim;
    a.window = s.kind == AttentionKind::Sliding ? c_.sliding_window : 0;
    a.pos_base = d_state_ + 1;
    a.part_o = part_o_;
    a.part_ml = part_ml_;
    a.out = attn_;
}

cudaGraph_t CudaModel::capture_step(bool short_range) {
    cudaGraph_t g = nullptr;
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    rec_short_ = short_range;
    try {
        record_step(nullptr);
    } catch (...) {
        rec_short_ = false;
        cudaStreamEndCapture(stream_, &g);
        if (g) cudaGraphDestroy(g);
        throw;
    }
    rec_short_ = false;
    CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
    return g;
}

void CudaModel::ensure_graph(bool short_range) {
    cudaGraphExec_t& exec = short_range ? graph_short_ : graph_;
    if (exec) return;
    cudaGraph_t g = capture_step(short_range);
    const cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
    CUDA_CHECK(e);
}

cudaGraphExec_t CudaModel::step_graph(int64_t pos) {
    const bool sh = short_step(pos);
    ensure_graph(sh);
    return sh ? graph_short_ : graph_;
}

bool CudaModel::truncate(int64_t n) {
    if (n < 0 || n > n_past) return false;
    // full layers hold every position (cap == ctx_) and never wrap
    for (int i = 0; i < c_.n_layers; ++i)
        if (c_.layers[i].has_own_kv() && cache_[i].cap < ctx_ &&
            !ring_can_roll_back(n_past, n, cache_[i].cap, c_.sliding_window))
            return false;
    n_past = n;
    return true;
}

void CudaModel::launch_step(int id) {
    if (n_past >= ctx_)
        throw Error("context full: " + std::to_string(n_past) +
                    " tokens fill the context (raise --ctx-size)");
    cudaGraphExec_t exec = step_graph(n_past);
    h_state_[0] = id;
    h_state_[1] = static_cast<int>(n_past);
    CUDA_CHECK(cudaMemcpyAsync(d_state_, h_state_, 2 * sizeof(int), cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaGraphLaunch(exec, stream_));
}

void CudaModel::decode(int id, float* logits) {
    launch_step(id);
    if (logits) logits_to_host(logits, logits_, 1);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    ++n_past;
}

bool CudaModel::decode_select(int id, const int* pen, int n_pen, float rp, float pp, float fp, int k,
                              std::vector<Sampler::Top>* top, int64_t* n_finite, float* logits) {
    if (!d_sel_top_ || k < 1 || k > kTopKMax || n_pen < 0 || n_pen > kMaxPenaltyIds)
        throw Error("internal: decode_select cannot serve k = " + std::to_string(k) + " with " +
                    std::to_string(n_pen) + " penalty ids");
    launch_step(id);
    if (sharded()) {  // this rank's vocabulary columns only, as local ids (h_pen_ is free: see below)
        const int64_t vb = shard_.vocab_begin, V = c_.vocab_size;
        int m = 0;
        for (int i = 0; i < n_pen; ++i)
            if (pen[i] >= vb && pen[i] < vb + V) {
                h_pen_[m] = static_cast<int>(pen[i] - vb);
                h_pen_[kMaxPenaltyIds + m] = pen[n_pen + i];
                ++m;
            }
        std::copy(h_pen_ + kMaxPenaltyIds, h_pen_ + kMaxPenaltyIds + m, h_pen_ + m);  // ids, then counts
        n_pen = m;
        if (n_pen)
            CUDA_CHECK(
                cudaMemcpyAsync(d_pen_, h_pen_, 2 * n_pen * sizeof(int), cudaMemcpyHostToDevice, stream_));
    } else if (n_pen) {  // h_pen_ is free: the previous call synchronised before returning
        std::copy(pen, pen + 2 * n_pen, h_pen_);
        CUDA_CHECK(cudaMemcpyAsync(d_pen_, h_pen_, 2 * n_pen * sizeof(int), cudaMemcpyHostToDevice, stream_));
    }
    topk_select(logits_, static_cast<int>(c_.vocab_size), d_pen_, n_pen, rp, pp, fp, k, d_sel_slices_,
                d_sel_top_, d_sel_info_, stream_);
    CUDA_CHECK(cudaMemcpyAsync(h_sel_top_, d_sel_top_, k * sizeof(unsigned long long), cudaMemcpyDeviceToHost,
                               stream_));
    CUDA_CHECK(cudaMemcpyAsync(h_sel_info_, d_sel_info_, 2 * sizeof(int), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    ++n_past;
    if (h_sel_info_[1]) {  // NaN or +inf: the host sampler names the id from the full row
        if (logits) copy_logits(logits);
        return false;
    }
    *n_finite = h_sel_info_[0];
    top->clear();
    for (int i = 0; i < k; ++i) {
        const unsigned long long key = h_sel_top_[i];
        if (!key) break;
        // argmax_key inverted: the high word is the float's bits made order-preserving, the low word ~id
        const uint32_t hi = static_cast<uint32_t>(key >> 32);
        const uint32_t bits = (hi & 0x80000000u) ? (hi & 0x7fffffffu) : ~hi;
        float v;
        std::memcpy(&v, &bits, sizeof v);
        const int local = static_cast<int>(0xffffffffu - static_cast<uint32_t>(key & 0xffffffffull));
        top->push_back({v, static_cast<int>(local + shard_.vocab_begin)});
    }
    return true;
}

std::vector<int> CudaModel::decode_greedy(int steps, float* last_logits) {
    if (steps <= 0) return {};
    if (n_past + steps > ctx_)
        throw Error("context full: " + std::to_string(n_past) + " + " + std::to_string(steps) +
                    " tokens exceed the context of " + std::to_string(ctx_) + " (raise --ctx-size)");
    // both graphs captured before any step is queued (a capture is not made between queued launches)
    ensure_graph(short_step(n_past));
    ensure_graph(short_step(n_past + steps - 1));
    CUDA_CHECK(cudaMemsetAsync(d_state_ + 2, 0, sizeof(int), stream_));
    for (int i = 0; i < steps; ++i) CUDA_CHECK(cudaGraphLaunch(step_graph(n_past + i), stream_));
    std::vector<int> ids(steps);
    CUDA_CHECK(cudaMemcpyAsync(ids.data(), d_out_ids_, steps * sizeof(int), cudaMemcpyDeviceToHost, stream_));
    if (last_logits) logits_to_host(last_logits, logits_, 1);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    n_past += steps;
    return ids;
}

void CudaModel::copy_logits(float* host) {
    logits_to_host(host, logits_, 1);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
}

std::vector<CudaProfileEntry> CudaModel::profile_prefill(const int* ids, int n) {
    if (sharded()) throw Error("the per-kernel profile runs on one GPU: use --tensor-parallel-size 1");
    Profiler pf;
    prefill_pf_ = &pf;
    try {
        prefill(ids, n, nullptr, false);
    } catch (...) {
        prefill_pf_ = nullptr;
        for (auto& r : pf.recs) {
            cudaEventDestroy(r.start);
            cudaEventDestroy(r.stop);
        }
        throw;
    }
    prefill_pf_ = nullptr;
    return collect_profile(pf);
}

std::vector<CudaProfileEntry> CudaModel::collect_profile(Profiler& pf) {
    std::vector<CudaProfileEntry> out;
    for (auto& r : pf.recs) {
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, r.start, r.stop));
        cudaEventDestroy(r.start);
        cudaEventDestroy(r.stop);
        out.push_back({r.kernel, r.layer, ms, r.bytes});
    }
    return out;
}

std::vector<CudaProfileEntry> CudaModel::profile_step() {
    if (n_past >= ctx_) throw Error("context full: no room for a profiled step");
    if (sharded()) throw Error("the per-kernel profile runs on one GPU: use --tensor-parallel-size 1");
    // Gate the stream while the step is enqueued (profile_gate.cu): the events then time the GPU, not the
    // host's launch rate. If enqueueing outlasts the gate's timeout, the profile says so.
    int* flag = nullptr;
    CUDA_CHECK(cudaHostAlloc(&flag, sizeof(int), cudaHostAllocMapped));
    *reinterpret_cast<volatile int*>(flag) = 0;
    int* d_flag = nullptr;
    CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&d_flag), flag, 0));
    int* d_timed_out = d_sel_info_ ? d_sel_info_ + 1 : nullptr;  // scratch int (the top-k flag slot)
    int timed_out = 0;
    Profiler pf;
    try {
        if (d_timed_out) CUDA_CHECK(cudaMemsetAsync(d_timed_out, 0, sizeof(int), stream_));
        if (d_timed_out) stream_gate(d_flag, 2.0, d_timed_out, stream_);
        record_step(&pf);
        *reinterpret_cast<volatile int*>(flag) = 1;
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        if (d_timed_out) CUDA_CHECK(cudaMemcpy(&timed_out, d_timed_out, sizeof(int), cudaMemcpyDeviceToHost));
    } catch (...) {
        *reinterpret_cast<volatile int*>(flag) = 1;
        cudaStreamSynchronize(stream_);
        cudaFreeHost(flag);
        throw;
    }
    cudaFreeHost(flag);
    profile_gated_ = d_timed_out && !timed_out;
    ++n_past;
    return collect_profile(pf);
}

}  // namespace markbase::cuda

namespace markbase::cuda {
template float* CudaModel::alloc<float>(size_t);
template int* CudaModel::alloc<int>(size_t);
template unsigned long long* CudaModel::alloc<unsigned long long>(size_t);
bool CudaModel::skipped(const char* name) const {
    for (const std::string& s : skip_)
        if (s == name) return true;
    return false;
}

}  // namespace markbase::cuda
