// CudaModel's device memory, sized once for the chunk, the context and the slots: the decode step's state and
// the activations, the MoE's scratch, the KV cache, and the RoPE tables. Every size is
// loading/memory_plan.h's cuda_buffers(), the list the fit check adds up before any weight moves; a buffer is
// added or resized there, and check_layout() refuses a model whose allocations differ from it.
#include <algorithm>
#include <vector>

#include "cuda/model.h"
#include "loading/memory_plan.h"

namespace markbase::cuda {

// Every device buffer's bytes come from loading/memory_plan.h's cuda_buffers(), which the fit check sums
// before any weight moves; its mirrored constants must be these.
static_assert(CudaBuffers::kTopKMax == kTopKMax && CudaBuffers::kTopKSlice == kTopKSlice);
static_assert(CudaBuffers::kAttnMinKeys == kAttnMinKeys);
static_assert(CudaBuffers::kMaxPenaltyIds == CudaModel::kMaxPenaltyIds);
static_assert(CudaBuffers::kTopKRowsMax == kTopKRowsMax);

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
    alloc_bytes_ += bytes;
    return static_cast<T*>(p);
}

// The layout's buffer b, once (null where the layout has none): its element type must be the layout's.
template <class T>
T* CudaModel::take(CudaBuf b) {
    const size_t i = static_cast<size_t>(b);
    if (sizeof(T) != static_cast<size_t>(kCudaBufInfo[i].elem_bytes) || taken_[i])
        throw Error(std::string("internal: memory plan buffer ") + CudaBuffers::name(b) +
                    (taken_[i] ? " allocated twice" : " allocated with another element size"));
    taken_[i] = true;
    return layout_[b] > 0 ? alloc<T>(static_cast<size_t>(layout_[b])) : nullptr;
}

// After construction: what was allocated must be what the memory plan counts (a buffer added or resized here
// without cuda_buffers() knowing would make the fit check wrong).
void CudaModel::check_layout() const {
    const uint64_t want = layout_.eager_bytes() + layout_.kv_bytes();
    std::string missing;
    for (size_t i = 0; i < taken_.size(); ++i) {
        const CudaBuf b = static_cast<CudaBuf>(i);
        if (layout_.eager(b) && layout_[b] > 0 && !taken_[i])
            missing += std::string(missing.empty() ? "" : ", ") + CudaBuffers::name(b);
    }
    if (alloc_bytes_ == want && missing.empty()) return;
    const int64_t diff = static_cast<int64_t>(alloc_bytes_) - static_cast<int64_t>(want);
    throw Error("internal: CudaModel allocated " + std::to_string(alloc_bytes_) +
                " bytes of buffers where the memory plan (loading/memory_plan.h cuda_buffers) counts " +
                std::to_string(want) + " (" + (diff > 0 ? "+" : "") + std::to_string(diff) + " bytes)" +
                (missing.empty() ? "" : "; not allocated: " + missing));
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
void CudaModel::alloc_step() {
    const int nH = c_.n_heads;
    const int64_t n = chunk_;
    st_.d_state = take<int>(CudaBuf::kState);
    CUDA_CHECK(cudaMemset(st_.d_state, 0, 4 * sizeof(int)));
    CUDA_CHECK(cudaMallocHost(&st_.h_state, 4 * sizeof(int)));
    CUDA_CHECK(cudaMallocHost(&st_.h_ids, static_cast<size_t>(n) * sizeof(int)));
    st_.d_ids = take<int>(CudaBuf::kIds);
    st_.d_out_ids = take<int>(CudaBuf::kOutIds);
    st_.d_argmax = take<unsigned long long>(CudaBuf::kArgmax);
    act_.x = take<float>(CudaBuf::kX);
    st_.d_counter = take<unsigned int>(CudaBuf::kCounter);
    CUDA_CHECK(cudaMemset(st_.d_counter, 0, sizeof(unsigned int)));
    act_.xn = take<float>(CudaBuf::kXn);
    st_.d_attn_counters = take<unsigned int>(CudaBuf::kAttnCounters);
    CUDA_CHECK(cudaMemset(st_.d_attn_counters, 0, nH * sizeof(unsigned int)));
    plan_.gemv_stream.part = take<float>(CudaBuf::kRingPart);
    plan_.gemv_stream.count = take<unsigned int>(CudaBuf::kRingCount);
    if (plan_.gemv_stream.part) {  // the ring's partial sums for the layout's warps (a bigger GPU falls back)
        gemv_async_prepare();
        plan_.gemv_stream.warps = layout_[CudaBuf::kRingPart] / (2 * 3);
        plan_.gemv_stream.rows = static_cast<int>(layout_[CudaBuf::kRingCount]);
        CUDA_CHECK(cudaMemset(plan_.gemv_stream.count, 0, layout_.bytes(CudaBuf::kRingCount)));
    }
    act_.q = take<float>(CudaBuf::kQ);
    act_.k = take<float>(CudaBuf::kK);
    act_.v = take<float>(CudaBuf::kV);
    act_.attn = take<float>(CudaBuf::kAttn);
    act_.o = take<float>(CudaBuf::kO);
    act_.g = take<float>(CudaBuf::kG);
    act_.u = take<float>(CudaBuf::kU);
    // sharded MoE: [n][H] dense partial, then [n][H] this rank's experts' weighted sum: one all-reduce
    act_.m = take<float>(CudaBuf::kM);
    // the combine's weights for one already summed expert vector (the down-sum, ranks)
    if ((moe_.ones = take<float>(CudaBuf::kOnes))) {
        const std::vector<float> ones(static_cast<size_t>(n), 1.0f);
        CUDA_CHECK(cudaMemcpy(moe_.ones, ones.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    }
    act_.ple_ctx = take<float>(CudaBuf::kPleCtx);
    act_.ple = take<float>(CudaBuf::kPle);
    act_.logits = take<float>(CudaBuf::kLogits);
    st_.d_sel_slices = take<unsigned long long>(CudaBuf::kSelSlices);
    st_.d_sel_top = take<unsigned long long>(CudaBuf::kSelTop);
    st_.d_sel_info = take<int>(CudaBuf::kSelInfo);
    st_.d_pen = take<int>(CudaBuf::kPen);
    if (st_.d_sel_top) {  // pinned mirrors of every row's candidates, counts and penalty window
        st_.sel_rows = static_cast<int>(layout_[CudaBuf::kSelInfo] / 2);
        CUDA_CHECK(cudaMallocHost(&st_.h_sel_top, layout_.bytes(CudaBuf::kSelTop)));
        CUDA_CHECK(cudaMallocHost(&st_.h_sel_info, layout_.bytes(CudaBuf::kSelInfo)));
        CUDA_CHECK(cudaMallocHost(&st_.h_pen, layout_.bytes(CudaBuf::kPen)));
    }
    act_.hi = take<bf16>(CudaBuf::kHi);
    // the dense GEMMs' widest output (lm_head's vocabulary, for all logits, keeps the two GEMMs)
    act_.y2_cols = layout_.y2_cols;
    act_.y2 = take<float>(CudaBuf::kY2);
    // the layout's pieces hold any GPU's (plan_decode caps them at kMaxDecodePieces per layer)
    if (act_.max_pieces > layout_.max_pieces)
        throw Error("internal: " + std::to_string(act_.max_pieces) +
                    " attention pieces, the memory plan holds " + std::to_string(layout_.max_pieces));
    act_.part_o = take<float>(CudaBuf::kPartO);
    act_.part_ml = take<float>(CudaBuf::kPartMl);
    // Prefill attention as GEMMs: the score rows of the longest key range the scratch holds, every head of a
    // chunk unless the tuning asks for fewer (tests: head and row batches)
    attn_gemm_.blas = blas_;
    attn_gemm_.s_floats = layout_[CudaBuf::kScores];
    attn_gemm_.s = take<float>(CudaBuf::kScores);
    attn_gemm_.ptrs = take<void*>(CudaBuf::kScorePtrs);
    // a bf16 cache's rounded queries: the GEMMs' hi half is free from the q/k/v projections to o_proj's split
    // and holds n x max(H, q, mlp, P) bf16 (kHi)
    attn_gemm_.q16 = act_.hi;
}

// The 26B's routing and experts: decode's second stream and the experts' scratch.
void CudaModel::alloc_moe() {
    moe_.rlogits = take<float>(CudaBuf::kRouterLogits);
    moe_.sel_w = take<float>(CudaBuf::kSelW);
    moe_.sel_id = take<int>(CudaBuf::kSelId);
    act_.xr = take<float>(CudaBuf::kXr);
    if (plan_.moe_prenorm != (act_.xr != nullptr))
        throw Error("internal: the memory plan's prenormed router input disagrees with the decode plan");
    CUDA_CHECK(cudaStreamCreateWithFlags(&moe_.stream2, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&moe_.fork, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&moe_.join, cudaEventDisableTiming));
    moe_.mx = take<float>(CudaBuf::kMx);  // the tokens' inputs: 2 x bf16 [n][H] (hi, lo), or f16 [n][H]
    moe_.mh = take<bf16>(CudaBuf::kMh);   // GeGLU rows: 2 x bf16 [n K][Ie], or f16 [n K][Ie]
    moe_.gexp = take<int>(CudaBuf::kGroupExperts);
    moe_.goff = take<int>(CudaBuf::kGroupOffsets);
    moe_.gent = take<int>(CudaBuf::kGroupEntries);
    moe_.e_in = take<float>(CudaBuf::kExpertIn);
    moe_.eh = take<float>(CudaBuf::kExpertHidden);
    moe_.eslots = take<float>(CudaBuf::kExpertSlots);
}

// The KV cache (KV-shared layers point at their source's), the paged layers' block tables (slot s's
// blocks [s * stride, (s + 1) * stride) where the pool holds them, else block 0 until set_slot_blocks),
// batched decode's per-token arrays, all rows' logits where slots decode together, and the RoPE frequencies.
void CudaModel::alloc_cache(const Widths& wd) {
    const int L = c_.n_layers;
    kv_.layers.resize(L);
    for (int i = 0; i < L; ++i) {
        if (!c_.layers[i].has_own_kv()) continue;
        LayerCache& lc = kv_.layers[i];
        lc.cap = layout_.kv_cap[i];  // sliding layers: a ring of min(ctx, window + chunk) positions
        lc.paged = layout_.kv_paged[i] != 0;
        lc.slot_stride = lc.paged ? 0 : layout_.kv_elems[i] / slots_;
        const size_t bytes = static_cast<size_t>(layout_.kv_elems[i]) * static_cast<size_t>(kv_.elem_bytes);
        lc.k = alloc<char>(bytes);
        lc.v = alloc<char>(bytes);
        CUDA_CHECK(cudaMemset(lc.k, 0, bytes));
        CUDA_CHECK(cudaMemset(lc.v, 0, bytes));
        kv_.bytes += 2 * bytes;
    }
    for (int i = 0; i < L; ++i)
        if (!c_.layers[i].has_own_kv()) kv_.layers[i] = kv_.layers[c_.layers[i].kv_source];
    kv_.pool_blocks = layout_.kv_blocks;
    kv_.table_stride = layout_.kv_table_stride;
    kv_.table = take<int>(CudaBuf::kKvTable);
    kv_.gather = attn_gemm_.gather = take<char>(CudaBuf::kKvGather);
    if (kv_.table) {
        kv_.host_table.assign(static_cast<size_t>(layout_[CudaBuf::kKvTable]), 0);
        for (size_t e = 0; e < kv_.host_table.size(); ++e)
            if (static_cast<int64_t>(e) < kv_.pool_blocks) kv_.host_table[e] = static_cast<int>(e);
        kv_.table_dirty = true;
        upload_block_tables();
    }
    d_bpos_ = take<int>(CudaBuf::kBatchPos);
    d_bslot_ = take<int>(CudaBuf::kBatchSlot);
    d_bnext_ = take<int>(CudaBuf::kBatchNext);
    if (layout_.eager(CudaBuf::kAllLogits)) act_.all_logits = take<float>(CudaBuf::kAllLogits);
    auto upload = [&](CudaBuf b, const std::vector<float>& v) {
        if (static_cast<int64_t>(v.size()) != layout_[b])
            throw Error(std::string("internal: memory plan buffer ") + CudaBuffers::name(b) + " holds " +
                        std::to_string(layout_[b]) + " floats, the RoPE table " + std::to_string(v.size()));
        float* d = take<float>(b);
        if (d) CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
        return d;
    };
    if (wd.head_sliding)
        kv_.inv_sliding = upload(CudaBuf::kRopeSliding, c_.rope_sliding.inverse_frequencies(wd.head_sliding));
    if (wd.head_full)
        kv_.inv_full = upload(CudaBuf::kRopeFull, c_.rope_full.inverse_frequencies(wd.head_full));
}

// All rows' logits [chunk][V] (prefill's all_logits, batched decode): allocated on first use by one sequence.
void CudaModel::ensure_all_logits() {
    if (!act_.all_logits) act_.all_logits = take<float>(CudaBuf::kAllLogits);
}
void CudaModel::release() {
    for (auto& kv : step_graphs_) cudaGraphExecDestroy(kv.second);
    step_graphs_.clear();
    for (auto& kv : batch_graphs_) cudaGraphExecDestroy(kv.second);
    batch_graphs_.clear();
    if (blas_) cublasDestroy(blas_);
    blas_ = nullptr;
    if (stream_) cudaStreamDestroy(stream_);
    stream_ = nullptr;
    if (moe_.stream2) cudaStreamDestroy(moe_.stream2);
    moe_.stream2 = nullptr;
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
                    static_cast<void*>(st_.h_pen)})
        if (p) cudaFreeHost(p);
    st_.h_sel_top = nullptr;
    st_.h_sel_info = nullptr;
    st_.h_pen = nullptr;
}
template char* CudaModel::alloc<char>(size_t);
template float* CudaModel::alloc<float>(size_t);
template int* CudaModel::alloc<int>(size_t);
template unsigned long long* CudaModel::alloc<unsigned long long>(size_t);

}  // namespace markbase::cuda
