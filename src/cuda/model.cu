// CudaModel's construction and entry points: what the tuning and the shape decide for the decode step, the
// decode graphs (captured on first use, replayed per token), one token (its logits to the host, or the
// device's top-k for sampling) and greedy decoding that never leaves the device. The buffers are
// buffers.cu's; the step itself step.cu's.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cuda/model.h"
#include "model/sliding_ring.h"

namespace markbase::cuda {

CudaModel::CudaModel(std::unique_ptr<DeviceWeights> dw, int64_t ctx, int chunk, const Tuning& tuning,
                     KvDtype kv_dtype, const ShardContext* shard, int slots, int64_t kv_blocks)
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
        if (c_.moe) moe_gemm_prepare();
        tile_gemm_prepare();
        CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        CUBLAS_CHECK(cublasCreate(&blas_));
        CUBLAS_CHECK(cublasSetStream(blas_, stream_));
        CudaBufferSpec spec;
        spec.ctx = ctx_;
        spec.chunk = chunk_;
        spec.slots = slots_;
        spec.sharded = sharded();
        spec.gemv_ring = plan_.gemv_kernel == GemvKernel::kRowsAsyncGeglu;
        spec.attn_gemm_rows = tuning.attn_gemm_rows;
        spec.kv_elem_bytes = kv_.elem_bytes = gpu_kv_bytes(kv_dtype, slots);
        spec.kv_blocks = kv_blocks;
        layout_ = cuda_buffers(c_, spec);
        alloc_step();
        if (c_.moe) alloc_moe();
        alloc_cache(wd);
        check_layout();
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
    plan_.gemv_kernel = async_geglu ? GemvKernel::kRowsAsyncGeglu : GemvKernel::kRows;
    // One GPU (both at 8 chunks per lane only): 31B -3.5..-5.2% together, E4B -1.1..-1.2%. Not yet run with
    // tensor parallelism, so a sharded model keeps them off.
    plan_.geglu_split = !sharded();
    plan_.min_waves = sharded() ? 0 : 3;
    plan_.fp8_long_buffers = !c_.moe;
    plan_.prenorm = !sharded();
    plan_.moe_prenorm = plan_.prenorm && c_.moe;
    hooks_.skip = tuning.skip;
    if (!hooks_.skip.empty()) {
        std::string names;
        for (const std::string& k : hooks_.skip) names += (names.empty() ? "" : "+") + k;
        std::fprintf(stderr,
                     "tuning skip=%s: those kernels are not launched (a timing experiment; every output is "
                     "wrong)\n",
                     names.c_str());
    }
    int sms = 0, dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    plan_.batch_attn_keys = tuning.batch_attn_keys;
    plan_.batch_attn_heads = tuning.batch_attn_heads;
    plan_.batch_attn_mma = tuning.batch_attn == Tuning::BatchAttn::kMma;
    // decode_attn=auto: past 4,096 keys (E2B on an H100: level with the fp32 pieces there, 4.4% behind the
    // bf16 pieces at 1,024, 38% ahead at 32,768) and an eighth of the context (the long graph's fixed pieces
    // span the whole context: at least one in eight holds keys)
    if (tuning.decode_attn == Tuning::DecodeAttn::kMma)
        plan_.attn_long_keys = 1;
    else if (tuning.decode_attn == Tuning::DecodeAttn::kAuto)
        plan_.attn_long_keys = std::max<int64_t>(4096, ctx_ / 8);
    plan_.stream_gemm_max = tuning.stream_gemm;
    // tile_gemm's machine code is sm_90a's (wgmma): on any other device its PTX traps, so cuBLAS takes them
    int cc_major = 0, cc_minor = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&cc_minor, cudaDevAttrComputeCapabilityMinor, dev));
    plan_.tile_gemm_max = cc_major == 9 && cc_minor == 0 ? tuning.tile_gemm : 0;
    plan_.batch_experts_max = tuning.batch_experts;
    plan_.moe_gemm = tuning.moe_gemm;
    plan_.gemm_bf16 = tuning.gemm_inputs == Tuning::GemmInputs::kBf16;
    plan_.sms = sms;
    // Decode: a fixed number of pieces per head (the graph's grid), each taking an even share of the current
    // range (split_len 0): pieces of >= kAttnMinKeys keys, at most ~2 waves of blocks over the SMs (and never
    // more than the memory plan's kMaxDecodePieces, which sizes their scratch).
    int64_t max_pieces = int64_t{chunk_} * nH * 4;
    plan_.decode_splits.resize(L);
    int widest = 1, dmax = 0;
    for (int i = 0; i < L; ++i) {
        const LayerSpec& s = c_.layers[i];
        const int64_t range =
            s.kind == AttentionKind::Sliding ? std::min<int64_t>(c_.sliding_window, ctx_) : ctx_;
        plan_.decode_splits[i] = decode_attention_splits(range, nH, std::max(sms, 1));
        max_pieces = std::max<int64_t>(max_pieces, int64_t{nH} * plan_.decode_splits[i]);
        widest = std::max(widest, std::min(plan_.decode_splits[i], kMaxAttnCluster));
        dmax = std::max(dmax, s.head_dim);
    }
    act_.max_pieces = max_pieces;
    // The short-range graph with clustered attention: the dense models on one GPU (E2B -2.3%, E4B -2.1%, 31B
    // -1.0% below 256 keys, unchanged at 2000; the 26B-A4B read +1.6%, so it keeps one graph). Where clusters
    // cannot run (before sm_90) the default falls back to one graph; asked for, it is an error.
    const bool cluster = tuning.attn_cluster == Tuning::Choice::kOn ||
                         (tuning.attn_cluster == Tuning::Choice::kAuto && !c_.moe);
    if (cluster && !sharded()) {
        if (attention_cluster_fits(widest, nH, dmax))
            plan_.attn_short_keys = int64_t{kMaxAttnCluster} * kAttnMinKeys;
        else if (tuning.attn_cluster == Tuning::Choice::kOn)
            throw Error("--tuning attn_cluster=1: clusters of " + std::to_string(widest) +
                        " attention pieces cannot be scheduled on this GPU");
    }
}
CudaModel::~CudaModel() {
    release();
}
void CudaModel::attention_args(int i, AttnArgs& a) const {
    const LayerSpec& s = c_.layers[i];
    a.q = act_.q;
    bind_cache(i, a);
    a.nH = c_.n_heads;
    a.nKV = s.n_kv_heads;
    a.d = s.head_dim;
    a.window = s.kind == AttentionKind::Sliding ? c_.sliding_window : 0;
    a.pos_base = st_.d_state + 1;
    a.part_o = act_.part_o;
    a.part_ml = act_.part_ml;
    a.out = act_.attn;
}

cudaGraph_t CudaModel::capture_step(StepRange range) {
    cudaGraph_t g = nullptr;
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    rec_range_ = range;
    try {
        record_step(nullptr);
    } catch (...) {
        rec_range_ = StepRange::kGeneral;
        cudaStreamEndCapture(stream_, &g);
        if (g) cudaGraphDestroy(g);
        throw;
    }
    rec_range_ = StepRange::kGeneral;
    CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
    return g;
}

cudaGraphExec_t instantiate_graph(cudaGraph_t g) {
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
    CUDA_CHECK(e);
    return exec;
}

cudaGraphExec_t CudaModel::ensure_graph(StepRange range) {
    const auto key = std::make_pair(cur_slot_, range);
    const auto it = step_graphs_.find(key);
    if (it != step_graphs_.end()) return it->second;
    return step_graphs_.emplace(key, instantiate_graph(capture_step(range))).first->second;
}

cudaGraphExec_t CudaModel::step_graph(int64_t pos) {
    return ensure_graph(step_range(pos));
}

bool CudaModel::truncate(int64_t n) {
    if (n < 0 || n > n_past) return false;
    // full layers hold every position (cap == ctx_) and never wrap
    for (int i = 0; i < c_.n_layers; ++i)
        if (c_.layers[i].has_own_kv() && kv_.layers[i].cap < ctx_ &&
            !ring_can_roll_back(n_past, n, kv_.layers[i].cap, c_.sliding_window))
            return false;
    n_past = n;
    return true;
}

void CudaModel::launch_step(int id) {
    if (n_past >= ctx_)
        throw Error("context full: " + std::to_string(n_past) +
                    " tokens fill the context (raise --ctx-size)");
    cudaGraphExec_t exec = step_graph(n_past);
    st_.h_state[0] = id;
    st_.h_state[1] = static_cast<int>(n_past);
    CUDA_CHECK(cudaMemcpyAsync(st_.d_state, st_.h_state, 2 * sizeof(int), cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaGraphLaunch(exec, stream_));
}

void CudaModel::decode(int id, float* logits) {
    launch_step(id);
    if (logits) logits_to_host(logits, act_.logits, 1);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    ++n_past;
}

bool CudaModel::decode_select(int id, const int* pen, int n_pen, float rp, float pp, float fp, int k,
                              std::vector<Sampler::Top>* top, int64_t* n_finite, float* logits) {
    if (!st_.d_sel_top || k < 1 || k > kTopKMax || n_pen < 0 || n_pen > kMaxPenaltyIds)
        throw Error("internal: decode_select cannot serve k = " + std::to_string(k) + " with " +
                    std::to_string(n_pen) + " penalty ids");
    launch_step(id);
    if (sharded()) {  // this rank's vocabulary columns only, as local ids (st_.h_pen is free: see below)
        const int64_t vb = shard_.vocab_begin, V = c_.vocab_size;
        int m = 0;
        for (int i = 0; i < n_pen; ++i)
            if (pen[i] >= vb && pen[i] < vb + V) {
                st_.h_pen[m] = static_cast<int>(pen[i] - vb);
                st_.h_pen[kMaxPenaltyIds + m] = pen[n_pen + i];
                ++m;
            }
        std::copy(st_.h_pen + kMaxPenaltyIds, st_.h_pen + kMaxPenaltyIds + m,
                  st_.h_pen + m);  // ids, then counts
        n_pen = m;
        if (n_pen)
            CUDA_CHECK(cudaMemcpyAsync(st_.d_pen, st_.h_pen, 2 * n_pen * sizeof(int), cudaMemcpyHostToDevice,
                                       stream_));
    } else if (n_pen) {  // st_.h_pen is free: the previous call synchronised before returning
        std::copy(pen, pen + 2 * n_pen, st_.h_pen);
        CUDA_CHECK(
            cudaMemcpyAsync(st_.d_pen, st_.h_pen, 2 * n_pen * sizeof(int), cudaMemcpyHostToDevice, stream_));
    }
    topk_select(act_.logits, static_cast<int>(c_.vocab_size), st_.d_pen, n_pen, rp, pp, fp, k,
                st_.d_sel_slices, st_.d_sel_top, st_.d_sel_info, stream_);
    CUDA_CHECK(cudaMemcpyAsync(st_.h_sel_top, st_.d_sel_top, k * sizeof(unsigned long long),
                               cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(
        cudaMemcpyAsync(st_.h_sel_info, st_.d_sel_info, 2 * sizeof(int), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    ++n_past;
    if (st_.h_sel_info[1]) {  // NaN or +inf: the host sampler names the id from the full row
        if (logits) copy_logits(logits);
        return false;
    }
    *n_finite = st_.h_sel_info[0];
    unpack_top(st_.h_sel_top, k, shard_.vocab_begin, top);
    return true;
}

void CudaModel::unpack_top(const unsigned long long* keys, int k, int64_t id_offset,
                           std::vector<Sampler::Top>* top) {
    top->clear();
    for (int i = 0; i < k; ++i) {
        const unsigned long long key = keys[i];
        if (!key) break;
        // argmax_key inverted: the high word is the float's bits made order-preserving, the low word ~id
        const uint32_t hi = static_cast<uint32_t>(key >> 32);
        const uint32_t bits = (hi & 0x80000000u) ? (hi & 0x7fffffffu) : ~hi;
        float v;
        std::memcpy(&v, &bits, sizeof v);
        const int local = static_cast<int>(0xffffffffu - static_cast<uint32_t>(key & 0xffffffffull));
        top->push_back({v, static_cast<int>(local + id_offset)});
    }
}

std::vector<int> CudaModel::decode_greedy(int steps, float* last_logits) {
    if (steps <= 0) return {};
    if (n_past + steps > ctx_)
        throw Error("context full: " + std::to_string(n_past) + " + " + std::to_string(steps) +
                    " tokens exceed the context of " + std::to_string(ctx_) + " (raise --ctx-size)");
    // every range's graph the steps reach captured before any step is queued (a capture is not made between
    // queued launches); the ranges follow each other as the position grows
    const int first = static_cast<int>(step_range(n_past)),
              last = static_cast<int>(step_range(n_past + steps - 1));
    for (int r = first; r <= last; ++r) ensure_graph(static_cast<StepRange>(r));
    CUDA_CHECK(cudaMemsetAsync(st_.d_state + 2, 0, sizeof(int), stream_));
    for (int i = 0; i < steps; ++i) CUDA_CHECK(cudaGraphLaunch(step_graph(n_past + i), stream_));
    std::vector<int> ids(steps);
    CUDA_CHECK(
        cudaMemcpyAsync(ids.data(), st_.d_out_ids, steps * sizeof(int), cudaMemcpyDeviceToHost, stream_));
    if (last_logits) logits_to_host(last_logits, act_.logits, 1);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    n_past += steps;
    return ids;
}

void CudaModel::copy_logits(float* host) {
    logits_to_host(host, act_.logits, 1);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
}

}  // namespace markbase::cuda
