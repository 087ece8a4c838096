// CudaModel's device memory, sized once for the chunk, the context and the slots: the decode step's state and
// the activations, the MoE's scratch, the KV cache, and the RoPE tables. loading/memory_plan.h adds up the
// same sizes before any weight moves (a change here is mirrored there; tests/loading/test_memory_plan.cpp).
#include <algorithm>
#include <vector>

#include "cuda/model.h"
#include "loading/memory_plan.h"

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

// The decode step's state and the activations, sized for the chunk (and the prefill's GEMM inputs and
// attention scratch).
void CudaModel::alloc_step(const Widths& wd, const Tuning& tuning) {
    const int H = c_.hidden, nH = c_.n_heads, L = c_.n_layers, P = c_.ple_dim;
    const int64_t LP = int64_t{L} * P, V = c_.vocab_size, n = chunk_;
    st_.d_state = alloc<int>(4);
    CUDA_CHECK(cudaMemset(st_.d_state, 0, 4 * sizeof(int)));
    CUDA_CHECK(cudaMallocHost(&st_.h_state, 4 * sizeof(int)));
    CUDA_CHECK(cudaMallocHost(&st_.h_ids, static_cast<size_t>(n) * sizeof(int)));
    st_.d_ids = alloc<int>(n);
    st_.d_out_ids = alloc<int>(ctx_);
    st_.d_argmax = alloc<unsigned long long>(1);
    act_.x = alloc<float>(n * H);
    st_.d_counter = alloc<unsigned int>(1);
    CUDA_CHECK(cudaMemset(st_.d_counter, 0, sizeof(unsigned int)));
    act_.xn = alloc<float>(H);
    st_.d_attn_counters = alloc<unsigned int>(nH);
    CUDA_CHECK(cudaMemset(st_.d_attn_counters, 0, nH * sizeof(unsigned int)));
    if (plan_.gemv_kernel == GemvKernel::kRowsAsyncGeglu) {
        // rows of the widest one-token GEMV: q + k + v, the MLP, the PLE projections, the router
        int rows = std::max({H, wd.mlp, P, c_.moe ? c_.n_experts : 0, static_cast<int>(LP)});
        for (const LayerSpec& s : c_.layers) rows = std::max(rows, (nH + 2 * s.n_kv_heads) * s.head_dim);
        plan_.gemv_stream.warps = gemv_async_prepare();
        plan_.gemv_stream.rows = rows;
        plan_.gemv_stream.part = alloc<float>(plan_.gemv_stream.warps * 2 * 3);
        plan_.gemv_stream.count = alloc<unsigned int>(rows);
        CUDA_CHECK(cudaMemset(plan_.gemv_stream.count, 0, rows * sizeof(unsigned int)));
    }
    act_.q = alloc<float>(n * wd.q);
    act_.k = alloc<float>(n * std::max(wd.kv, 1));
    act_.v = alloc<float>(n * std::max(wd.kv, 1));
    act_.attn = alloc<float>(n * wd.q);
    act_.o = alloc<float>(n * H);
    act_.g = alloc<float>(n * std::max(wd.mlp, P));
    act_.u = alloc<float>(n * std::max(wd.mlp, P));
    // sharded MoE: [n][H] dense partial, then [n][H] this rank's experts' weighted sum: one all-reduce
    act_.m = alloc<float>((sharded() && c_.moe ? 2 : 1) * n * H);
    if (c_.moe) {  // the combine's weights for one already summed expert vector (the down-sum, ranks)
        const std::vector<float> ones(static_cast<size_t>(n), 1.0f);
        moe_.ones = alloc<float>(n);
        CUDA_CHECK(cudaMemcpy(moe_.ones, ones.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    }
    if (P) {
        act_.ple_ctx = alloc<float>(n * LP);
        act_.ple = alloc<float>(n * LP);
    }
    act_.logits = alloc<float>(V);
    if (V <= int64_t{kTopKSlice} / kTopKMax * kTopKSlice) {
        st_.d_sel_slices = alloc<unsigned long long>((V + kTopKSlice - 1) / kTopKSlice * kTopKMax);
        st_.d_sel_top = alloc<unsigned long long>(kTopKMax);
        st_.d_sel_info = alloc<int>(2);
        st_.d_pen = alloc<int>(2 * kMaxPenaltyIds);
        CUDA_CHECK(cudaMallocHost(&st_.h_sel_top, kTopKMax * sizeof(unsigned long long)));
        CUDA_CHECK(cudaMallocHost(&st_.h_sel_info, 2 * sizeof(int)));
        CUDA_CHECK(cudaMallocHost(&st_.h_pen, 2 * kMaxPenaltyIds * sizeof(int)));
    }
    act_.hi = alloc<bf16>(2 * n * std::max({H, wd.q, wd.mlp, P}));
    if (const int64_t rows = std::min<int64_t>(n, kGemmStackMaxN); rows > 0) {
        // the dense GEMMs' widest output (lm_head's vocabulary, for all logits, keeps the two GEMMs)
        act_.y2_cols = std::max<int64_t>({LP, wd.q, wd.kv, H, wd.mlp, P});
        act_.y2 = alloc<float>(2 * rows * act_.y2_cols);
    }
    act_.part_o = alloc<float>(act_.max_pieces * wd.head);
    act_.part_ml = alloc<float>(2 * act_.max_pieces);
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
    moe_.rlogits = alloc<float>(n * E);
    moe_.sel_w = alloc<float>(n * K);
    moe_.sel_id = alloc<int>(n * K);
    if (plan_.moe_prenorm) act_.xr = alloc<float>(H);
    CUDA_CHECK(cudaStreamCreateWithFlags(&moe_.stream2, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&moe_.fork, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&moe_.join, cudaEventDisableTiming));
    moe_.cap = moe_prefill_rows_cap(static_cast<int>(n), E, K);
    const int64_t rows = int64_t{E} * moe_.cap;  // the memory plan's; a pass may use less
    if (tuning.moe_prefill_cap > 0) moe_.cap = std::clamp(tuning.moe_prefill_cap, 1, moe_.cap);
    moe_.mx = alloc<float>(rows * H);  // = 2 x bf16 [rows][H] (hi, lo), later the fp32 [rows][H] output
    moe_.mg = alloc<float>(rows * Ie);
    moe_.mu = alloc<float>(rows * Ie);
    moe_.mh = alloc<bf16>(2 * rows * Ie);
    const int srows = std::min(moe_.cap, kGemmStackMaxN);
    moe_.ey2 = alloc<float>(int64_t{E} * 2 * srows * std::max(2 * Ie, H));
    // the compact pass reuses the scratch: [2 R][H] bf16 in moe_.mx, [2 R][Ie] in moe_.mh, moe_.ey2 for both
    // GEMMs' outputs
    moe_.compact_rows = std::min<int64_t>(rows, int64_t{E} * srows);
    for (int k = 0; k < kMoeCompactStreams; ++k) {
        cudaEvent_t ev = nullptr;
        CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
        moe_.events.push_back(ev);
    }
    for (int k = 1; k < kMoeCompactStreams; ++k) {
        cudaStream_t st = nullptr;
        CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        moe_.streams.push_back(st);
        cublasHandle_t hb = nullptr;
        CUBLAS_CHECK(cublasCreate(&hb));
        moe_.blas.push_back(hb);
        CUBLAS_CHECK(cublasSetStream(hb, st));
    }
    const size_t plan = 6 * static_cast<size_t>(E) * sizeof(void*) + (E + 1) * sizeof(int);
    CUDA_CHECK(cudaMallocHost(&moe_.h_mplan, plan));
    moe_.d_mplan = alloc<char>(plan);
    CUDA_CHECK(cudaMallocHost(&moe_.h_goff, (E + 1) * sizeof(int)));
    moe_.gexp = alloc<int>(std::max(E, K) + 1);
    moe_.goff = alloc<int>(std::max(E, K) + 1);
    moe_.gent = alloc<int>(n * K);
    moe_.e_in = alloc<float>(n * H);
    moe_.eh = alloc<float>(n * K * Ie);
    moe_.eslots = alloc<float>(n * K * H);
}

// The KV cache (KV-shared layers point at their source's), batched decode's per-token arrays, and the RoPE
// frequencies.
void CudaModel::alloc_cache(const Widths& wd) {
    const int L = c_.n_layers;
    const int64_t n = chunk_;
    kv_.layers.resize(L);
    for (int i = 0; i < L; ++i) {
        const LayerSpec& s = c_.layers[i];
        if (!s.has_own_kv()) continue;
        LayerCache& lc = kv_.layers[i];
        lc.cap =
            s.kind == AttentionKind::Sliding ? std::min<int64_t>(ctx_, c_.sliding_window + chunk_) : ctx_;
        lc.slot_stride = lc.cap * s.n_kv_heads * s.head_dim;
        const size_t elems = static_cast<size_t>(lc.slot_stride) * slots_;
        lc.k = alloc<float>(elems);
        lc.v = alloc<float>(elems);
        CUDA_CHECK(cudaMemset(lc.k, 0, elems * sizeof(float)));
        CUDA_CHECK(cudaMemset(lc.v, 0, elems * sizeof(float)));
        kv_.bytes += 2 * elems * sizeof(float);
    }
    for (int i = 0; i < L; ++i)
        if (!c_.layers[i].has_own_kv()) kv_.layers[i] = kv_.layers[c_.layers[i].kv_source];
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
    if (wd.head_sliding) kv_.inv_sliding = upload(c_.rope_sliding.inverse_frequencies(wd.head_sliding));
    if (wd.head_full) kv_.inv_full = upload(c_.rope_full.inverse_frequencies(wd.head_full));
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
    if (moe_.stream2) cudaStreamDestroy(moe_.stream2);
    moe_.stream2 = nullptr;
    for (cublasHandle_t hb : moe_.blas) cublasDestroy(hb);
    moe_.blas.clear();
    for (cudaStream_t st : moe_.streams) cudaStreamDestroy(st);
    moe_.streams.clear();
    for (cudaEvent_t ev : moe_.events) cudaEventDestroy(ev);
    moe_.events.clear();
    for (cudaEvent_t* ev : {&moe_.fork, &moe_.join}) {
        if (*ev) cudaEventDestroy(*ev);
        *ev = nullptr;
    }
    for (void* p : allocs_) cudaFree(p);
    allocs_.clear();
    if (st_.h_state) cudaFreeHost(st_.h_state);
    st_.h_state = nullptr;
    if (st_.h_ids) cudaFreeHost(st_.h_ids);
    st_.h_ids = nullptr;
    for (void* p : {static_cast<void*>(st_.h_sel_top), static_cast<void*>(st_.h_sel_info),
                    static_cast<void*>(st_.h_pen), static_cast<void*>(moe_.h_goff), moe_.h_mplan})
        if (p) cudaFreeHost(p);
    st_.h_sel_top = nullptr;
    st_.h_sel_info = nullptr;
    st_.h_pen = nullptr;
    moe_.h_goff = nullptr;
    moe_.h_mplan = nullptr;
}
template float* CudaModel::alloc<float>(size_t);
template int* CudaModel::alloc<int>(size_t);
template unsigned long long* CudaModel::alloc<unsigned long long>(size_t);

}  // namespace markbase::cuda
