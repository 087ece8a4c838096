// CudaModel's memory, graph and entry points: buffers sized once for the chunk and context, the KV cache, the
// decode graph (captured on first use, replayed per token), greedy decoding that never leaves the device, and
// the profiled step.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "cuda/cuda_model.h"
#include "loading/memory_plan.h"
#include "model/sliding_ring.h"

namespace markbase::cuda {

namespace {

// Decode attention: pieces of at least kDecodeMinSplit keys (attention.cu's split_len 0 rule), at most
// kMaxDecodePieces blocks per layer, so that short contexts still spread over many SMs and long ones stay
// bounded.
constexpr int kDecodeMinSplit = 32;
constexpr int kMaxDecodePieces = 512;

// MARKBASE_CUDA_ATTN_SPLIT: unset or "auto[:N]" -> {N (16), v2 kernel}, the default; "active[:N]" -> {N (16),
// the v1 kernel}; "legacy" -> {0}: pieces of >= 32 keys, up to 512 blocks per layer. N is the minimum of keys
// per piece. Measured on the H200 (bench/NOTES.md): auto:64 beat legacy by 0.2-0.6 ms per token on all four
// variants, auto:32 beat auto:64 by another 2-5% (also at a 2000-token context), auto:128/256 lost; auto:16
// beat auto:32 by 0.2-1.9% in two runs of all four (session 3). N only matters below the ~2-wave cap: on the
// sliding layers (512 keys) at any context, on the full layers at short contexts.
struct AttnPolicy {
    int min_keys = 0;  // 0: legacy
    bool v2 = false;
};
constexpr int kAutoMinKeys = 16;
AttnPolicy attn_policy_from_env() {
    const char* e = std::getenv("MARKBASE_CUDA_ATTN_SPLIT");
    if (!e || !*e) return {kAutoMinKeys, true};
    if (std::strcmp(e, "legacy") == 0) return {};
    for (const char* name : {"auto", "active"}) {
        const size_t len = std::strlen(name);
        if (std::strncmp(e, name, len) != 0) continue;
        AttnPolicy p{kAutoMinKeys, name[1] == 'u'};
        if (e[len] == 0) return p;
        if (e[len] == ':') {
            char* end = nullptr;
            const long n = std::strtol(e + len + 1, &end, 10);
            if (end != e + len + 1 && *end == 0 && n >= 1 && n <= (1 << 20)) {
                p.min_keys = static_cast<int>(n);
                return p;
            }
        }
    }
    throw Error(std::string("MARKBASE_CUDA_ATTN_SPLIT=") + e +
                ": expected legacy, auto, auto:N, active or active:N (N >= 1)");
}

// A 0/1 switch: `fallback` when unset, anything else refused by name.
bool env_flag(const char* name, bool fallback) {
    const char* e = std::getenv(name);
    if (!e) return fallback;
    if (std::strcmp(e, "0") != 0 && std::strcmp(e, "1") != 0)
        throw Error(std::string(name) + "=" + e + ": expected 0 or 1");
    return e[0] == '1';
}

// A whole number in [lo, hi]: `fallback` when unset, anything else refused by name.
int env_int(const char* name, int lo, int hi, int fallback) {
    const char* e = std::getenv(name);
    if (!e) return fallback;
    char* end = nullptr;
    const long v = std::strtol(e, &end, 10);
    if (!*e || *end || v < lo || v > hi)
        throw Error(std::string(name) + "=" + e + ": expected " + std::to_string(lo) + " to " +
                    std::to_string(hi));
    return static_cast<int>(v);
}

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

CudaModel::CudaModel(std::unique_ptr<DeviceWeights> dw, int64_t ctx, int chunk, const ShardContext* shard,
                     int slots)
    : dw_(std::move(dw)), c_(dw_->config), w_(dw_->w), ctx_(ctx), chunk_(chunk) {
    if (shard) shard_ = *shard;
    if (slots < 1) throw Error("--parallel: at least one sequence slot, found " + std::to_string(slots));
    if (slots > 1 && sharded())
        throw Error("batched decode (--parallel) does not combine with tensor parallelism yet");
    slots_ = slots;
    slot_pos_.assign(static_cast<size_t>(slots), 0);
    if (sharded() && !shard_.group) throw Error("internal: a sharded model without its NCCL group");
    try {
        const int H = c_.hidden, nH = c_.n_heads, L = c_.n_layers, P = c_.ple_dim;
        const int64_t LP = int64_t{L} * P, V = c_.vocab_size, n = chunk;
        int max_q = 0, max_kv = 0, max_I = 0, dmax = 0, d_sliding = 0, d_full = 0;
        int64_t max_pieces = n * nH * 4;
        gemv_variant_ = gemv_variant_from_env();
        // On by default for one GPU since session 7's H200 A/B (both apply at 8 chunks per lane only): 31B
        // 18.498 -> 17.542 and 18.695 -> 18.033 ms/token in two runs, E4B -1.2..-1.6%, E2B and 26B-A4B
        // unchanged. Not yet run with tensor parallelism, so a sharded model keeps them off unless asked.
        geglu_split_ = env_flag("MARKBASE_CUDA_GEGLU_SPLIT", !sharded());
        min_waves_ = env_int("MARKBASE_CUDA_GEMV_MIN_WAVES", 0, 64, sharded() ? 0 : 3);
        if (const char* e = std::getenv("MARKBASE_CUDA_SKIP"); e && *e) {
            for (std::string_view v(e); !v.empty();) {
                const size_t comma = v.find_first_of(",+");  // '+' too: gpu-check's A/B splits on ',
                if (comma) skip_.emplace_back(v.substr(0, comma));
                v = comma == std::string_view::npos ? std::string_view() : v.substr(comma + 1);
            }
            std::fprintf(
                stderr,
                "MARKBASE_CUDA_SKIP=%s: those kernels are not launched (a timing experiment; every output "
                "is wrong)\n",
                e);
        }
        // Unset on the MoE model on one GPU: asyncg (session 4's H200 A/B: 26B-A4B 4.164 -> 4.018 ms per
        // token; its dense GeGLU runs beside the experts, and the ring's 264 blocks leave them room; the
        // dense models measured +0.8..+3.6% with it, so they keep warpk)
        const char* gv = std::getenv("MARKBASE_CUDA_GEMV");
        if ((!gv || !*gv) && c_.moe && !sharded()) gemv_variant_ = kGemvVariantAsyncG;
        if (const char* e = std::getenv("MARKBASE_CUDA_GEMV_KSPLIT"))
            gemv_ksplit_ = std::clamp(std::atoi(e), 0, 64);
        const AttnPolicy policy = attn_policy_from_env();
        const int auto_min = policy.min_keys;
        int sms = 0;
        {
            int dev = 0;
            CUDA_CHECK(cudaGetDevice(&dev));
            CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        }
        if (auto_min > 0) {
            attn_min_split_ = auto_min;
            attn_active_only_ = true;
            attn_v2_ = policy.v2;
        }
        decode_splits_.resize(L);
        for (int i = 0; i < L; ++i) {
            const LayerSpec& s = c_.layers[i];
            max_q = std::max(max_q, nH * s.head_dim);
            max_kv = std::max(max_kv, s.n_kv_heads * s.head_dim);
            max_I = std::max(max_I, s.mlp_width);
            dmax = std::max(dmax, s.head_dim);
            (s.kind == AttentionKind::Sliding ? d_sliding : d_full) = s.head_dim;
            // Decode: a fixed number of pieces per head (the graph's grid), each taking an even share of the
            // current range (split_len 0), enough pieces to fill the SMs at long context.
            const int64_t range =
                s.kind == AttentionKind::Sliding ? std::min<int64_t>(c_.sliding_window, ctx) : ctx;
            if (auto_min > 0) {  // pieces of >= auto_min keys, at most ~2 waves of blocks over the SMs
                const int64_t cap_pieces = std::max(1, 2 * std::max(sms, 1) / nH);
                decode_splits_[i] =
                    static_cast<int>(std::clamp<int64_t>((range + auto_min - 1) / auto_min, 1, cap_pieces));
            } else {
                const int64_t cap_pieces = std::max(1, kMaxDecodePieces / nH);
                decode_splits_[i] = static_cast<int>(
                    std::clamp<int64_t>((range + kDecodeMinSplit - 1) / kDecodeMinSplit, 1, cap_pieces));
            }
            max_pieces = std::max<int64_t>(max_pieces, int64_t{nH} * decode_splits_[i]);
        }
        max_pieces_ = max_pieces;
        const int E = c_.moe ? c_.n_experts : 0, K = c_.moe ? c_.top_k : 0, Ie = c_.moe ? c_.expert_width : 0;
        const int split_w = std::max({H, max_q, max_I, P});
        gemv_prepare(std::max({H, max_q, max_I, P, Ie}));

        CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        CUBLAS_CHECK(cublasCreate(&blas_));
        CUBLAS_CHECK(cublasSetStream(blas_, stream_));

        d_state_ = alloc<int>(4);
        CUDA_CHECK(cudaMemset(d_state_, 0, 4 * sizeof(int)));
        CUDA_CHECK(cudaMallocHost(&h_state_, 4 * sizeof(int)));
        CUDA_CHECK(cudaMallocHost(&h_ids_, static_cast<size_t>(n) * sizeof(int)));
        d_ids_ = alloc<int>(n);
        d_out_ids_ = alloc<int>(ctx);
        d_argmax_ = alloc<unsigned long long>(1);

        if (const char* e = std::getenv("MARKBASE_CUDA_FUSE")) fuse_ = std::strcmp(e, "0") != 0;
        for (auto [name, value] : {std::pair{"MARKBASE_CUDA_GEMV_U4_MAXK", &u4_max_k_},
                                   std::pair{"MARKBASE_CUDA_GEGLU_U4_MAXK", &u4_max_k_geglu_}}) {
            if (const char* e = std::getenv(name)) {
                char* end = nullptr;
                const long k = std::strtol(e, &end, 10);
                if (!*e || *end || k < 0 || k > (1L << 20))
                    throw Error(std::string(name) + "=" + e + ": expected a width, 0..1048576");
                *value = static_cast<int>(k);
            }
        }
        x_ = alloc<float>(n * H);
        xb_ = alloc<float>(H);
        d_counter_ = alloc<unsigned int>(1);
        CUDA_CHECK(cudaMemset(d_counter_, 0, sizeof(unsigned int)));
        // Unset: no tails (session 5's H200 A/B without them: 31B -10.9%, E4B -11.4%, E2B -5.7%, 26B-A4B
        // +1.6%, so the MoE model kept its o_proj tail until session 8's run 5 measured it at -0.9% without)
        gemv_tail_ = false;
        gemv_tail_ = env_flag("MARKBASE_CUDA_GEMV_TAIL", gemv_tail_);
        tail_ = fuse_ && gemv_variant_is_rows(gemv_variant_) && gemv_tail_;
        // no tail with the warp-per-row GEMVs: the update as its own launch (gemv.cu's prologue would redo it
        // in every block of the next GEMV)
        residual_launch_ = !fuse_ || (gemv_variant_is_rows(gemv_variant_) && !gemv_tail_);
        // MARKBASE_CUDA_PRENORM (one GPU; on unless 0): a residual update also writes its consumer GEMV's
        // normalised input (xn_), so that GEMV's warps skip the norm. Session 8's H200 A/B on the dense
        // models: 31B -5.3% (17.43 -> 16.51 ms/token), E4B -5.6%, E2B -7.8%. Not yet run with tensor
        // parallelism, whose updates go through the ranks' sums.
        prenorm_ = env_flag("MARKBASE_CUDA_PRENORM", true) && fuse_ && !sharded();
        late_after_update_ = env_flag("MARKBASE_CUDA_LATE_AFTER_UPDATE", false);
        attn_kv_early_ = env_flag("MARKBASE_CUDA_ATTN_KV_EARLY", true);
        // MARKBASE_CUDA_ATTN_CLUSTER (on for the dense models, which session 15's H200 A/B measured at E2B
        // -2.3%, E4B -2.1%, 31B -1.0% below 256 keys and unchanged at 2000; the 26B-A4B read +1.6%, so it
        // keeps one graph): the short-range graph. Where clusters cannot run (before sm_90) the default falls
        // back to one graph; asked for by name, it is an error.
        const bool cluster_asked = std::getenv("MARKBASE_CUDA_ATTN_CLUSTER") != nullptr;
        if (env_flag("MARKBASE_CUDA_ATTN_CLUSTER", !c_.moe) && attn_active_only_ && attn_v2_ && fuse_ &&
            !sharded()) {
            int widest = 1;
            for (int i = 0; i < L; ++i)
                widest = std::max(widest, std::min(decode_splits_[i], kMaxAttnCluster));
            if (attention_cluster_fits(widest, nH, dmax))
                attn_short_keys_ = int64_t{kMaxAttnCluster} * attn_min_split_;
            else if (cluster_asked)
                throw Error("MARKBASE_CUDA_ATTN_CLUSTER=1: clusters of " + std::to_string(widest) +
                            " attention pieces cannot be scheduled on this GPU");
        }
        attn_group_ = env_flag("MARKBASE_CUDA_ATTN_GROUP", true);
        // session 13's H200 A/B, prefill of 512 tokens: 31B +24%, E4B +10%, 26B-A4B +10%, E2B (groups of 8
        // heads: one token per block either way) unchanged
        attn_group_tokens_ = env_flag("MARKBASE_CUDA_ATTN_GROUP_TOKENS", true);
        xn_ = alloc<float>(H);
        gemv_lean_ = env_flag("MARKBASE_CUDA_GEMV_LEAN", true);  // gemv_rows.cu: E4B -1.0..-1.1%
        // session 9's H200 A/B: 26B-A4B -4.4%, E2B -1.3%, 31B -0.9%, E4B +0.3% (bit-identical sums)
        gemv_lean8_ = env_flag("MARKBASE_CUDA_GEMV_LEAN8", true);
        geglu_lean8_ = env_flag("MARKBASE_CUDA_GEGLU_LEAN8", true);  // from K = 4096: the 31B -0.6%
        pdl_late_ = !env_flag("MARKBASE_CUDA_PDL_EARLY", true);  // device_common.cuh: pdl_begin_after_loads
        d_tail_counter_ = alloc<unsigned int>(1);
        CUDA_CHECK(cudaMemset(d_tail_counter_, 0, sizeof(unsigned int)));
        d_attn_counters_ = alloc<unsigned int>(nH);
        CUDA_CHECK(cudaMemset(d_attn_counters_, 0, nH * sizeof(unsigned int)));
        if (gemv_variant_ == kGemvVariantAsync || gemv_variant_ == kGemvVariantAsyncG) {
            // rows of the widest one-token GEMV: q + k + v, the MLP, the PLE projections, the router
            int rows = std::max({H, max_I, P, c_.moe ? c_.n_experts : 0, static_cast<int>(LP)});
            for (const LayerSpec& s : c_.layers) rows = std::max(rows, (nH + 2 * s.n_kv_heads) * s.head_dim);
            gemv_stream_.warps = gemv_async_prepare();
            gemv_stream_.rows = rows;
            gemv_stream_.part = alloc<float>(gemv_stream_.warps * 2 * 3);
            gemv_stream_.count = alloc<unsigned int>(rows);
            CUDA_CHECK(cudaMemset(gemv_stream_.count, 0, rows * sizeof(unsigned int)));
        }
        q_ = alloc<float>(n * max_q);
        k_ = alloc<float>(n * std::max(max_kv, 1));
        v_ = alloc<float>(n * std::max(max_kv, 1));
        attn_ = alloc<float>(n * max_q);
        o_ = alloc<float>(n * H);
        g_ = alloc<float>(n * std::max(max_I, P));
        u_ = alloc<float>(n * std::max(max_I, P));
        // sharded MoE: [n][H] dense partial, then [n][H] this rank's experts' weighted sum: one all-reduce
        m_ = alloc<float>((sharded() && c_.moe ? 2 : 1) * n * H);
        if (c_.moe) {  // the combine's weights for one already summed expert vector (MOE_DOWN_SUM, ranks)
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
        hi_ = alloc<bf16>(2 * n * split_w);
        gemm_stack_max_n_ = env_int("MARKBASE_CUDA_GEMM_STACK_MAXN", 0, 4096, kGemmStackMaxN);
        if (const int64_t rows = std::min<int64_t>(n, gemm_stack_max_n_); rows > 0) {
            // the dense GEMMs' widest output (lm_head's vocabulary, for all logits, keeps the two GEMMs)
            y2_cols_ = std::max<int64_t>({LP, max_q, max_kv, H, max_I, P});
            y2_ = alloc<float>(2 * rows * y2_cols_);
        }
        part_o_ = alloc<float>(max_pieces * dmax);
        part_ml_ = alloc<float>(2 * max_pieces);
        // Prefill attention as GEMMs (attention_gemm.cu): MARKBASE_CUDA_ATTN_GEMM=1 (the default: fp32
        // products), bf16x3 (bf16 tensor cores over hi/lo halves: session 13 measured prefill of 512 tokens
        // +4.5..+9.9% against fp32, but of 4096 tokens E2B -42% / 31B +6%, not yet explained), tf32, or 0
        // (the pieces kernels). MARKBASE_CUDA_ATTN_GEMM_ROWS (tests): the score rows of the longest key range
        // the scratch holds, default every head of a chunk, so that fewer force head and row batches.
        if (const char* e = std::getenv("MARKBASE_CUDA_ATTN_GEMM")) {
            if (std::strcmp(e, "0") != 0 && std::strcmp(e, "1") != 0 && std::strcmp(e, "tf32") != 0 &&
                std::strcmp(e, "bf16x3") != 0)
                throw Error(std::string("MARKBASE_CUDA_ATTN_GEMM=") + e + ": expected 0, 1, tf32 or bf16x3");
            attn_gemm_on_ = e[0] != '0';
            attn_gemm_.tf32 = e[0] == 't';
            attn_gemm_.bf16x3 = e[0] == 'b';
        }
        if (attn_gemm_on_) {
            const int64_t rows = env_int("MARKBASE_CUDA_ATTN_GEMM_ROWS", 16, 1 << 24,
                                         static_cast<int>(std::min<int64_t>(n * nH, 1 << 24)));
            attn_gemm_.blas = blas_;
            attn_gemm_.block_rows =
                env_int("MARKBASE_CUDA_ATTN_GEMM_BLOCK", 0, 4096, 0);  // measured, not kept: session 14
            attn_gemm_.s_floats = rows * attn_gemm_keys(c_, ctx, static_cast<int>(n));
            attn_gemm_.s = alloc<float>(static_cast<size_t>(attn_gemm_.s_floats));
            attn_gemm_.ptrs = alloc<void*>(6 * static_cast<size_t>(nH));
            if (attn_gemm_.bf16x3) {
                const int64_t keys = attn_gemm_keys(c_, ctx, static_cast<int>(n));
                attn_gemm_.keys3 = keys;
                attn_gemm_.q3 = alloc<uint16_t>(3 * n * max_q);
                attn_gemm_.k3 = alloc<uint16_t>(3 * keys * max_kv);
                attn_gemm_.v3 = alloc<uint16_t>(3 * keys * max_kv);
                attn_gemm_.p3 = alloc<uint16_t>(3 * static_cast<size_t>(attn_gemm_.s_floats));
            }
        }
        if (c_.moe) {
            rlogits_ = alloc<float>(n * E);
            sel_w_ = alloc<float>(n * K);
            sel_id_ = alloc<int>(n * K);
            if (const char* e = std::getenv("MARKBASE_CUDA_MOE_DECODE")) {
                if (std::strcmp(e, "rows") != 0 && std::strcmp(e, "groups") != 0)
                    throw Error(std::string("MARKBASE_CUDA_MOE_DECODE=") + e + ": expected rows or groups");
                moe_decode_rows_ = std::strcmp(e, "rows") == 0;
            }
            moe_wide_ = env_flag("MARKBASE_CUDA_MOE_WIDE", moe_wide_);
            if (const char* e = std::getenv("MARKBASE_CUDA_MOE_PREFILL")) {
                if (std::strcmp(e, "gemm") != 0 && std::strcmp(e, "gemv") != 0)
                    throw Error(std::string("MARKBASE_CUDA_MOE_PREFILL=") + e + ": expected gemm or gemv");
                moe_gemm_ = std::strcmp(e, "gemm") == 0;
            }
            // (A rank holds some of the experts: the passes' batched GEMMs would stream every expert, so a
            // rank runs its held experts' rows in the compact pass only, else the GEMV kernels;
            // prefill_experts.)
            // MOE_OVERLAP: on by default since session 4's H200 A/B (26B-A4B 4.335 -> 4.166 ms/token); on the
            // ranks too since session 10's two-GPU run (26B-A4B tp2 2.822 -> 2.736 ms/token, the same ids;
            // the tensor-parallel tests pass under it)
            moe_overlap_ = true;
            if (const char* e = std::getenv("MARKBASE_CUDA_MOE_OVERLAP"))
                moe_overlap_ = std::strcmp(e, "1") == 0;
            // Unset: 3 with the overlap (session 6's H200 A/B: 26B-A4B 3.567 -> 3.504 ms/token, -1.8%;
            // without the overlap 3.839 vs 3.842, no difference), else 2
            moe_gate_occ_ = moe_overlap_ ? 3 : 2;
            if (const char* e = std::getenv("MARKBASE_CUDA_MOE_GATE_OCC")) {
                if (std::strcmp(e, "2") != 0 && std::strcmp(e, "3") != 0)
                    throw Error(std::string("MARKBASE_CUDA_MOE_GATE_OCC=") + e + ": expected 2 or 3");
                moe_gate_occ_ = std::atoi(e);
            }
            // Unset: 6 with the overlap (session 7's H200 A/B: 26B-A4B -0.6% alone, -0.6% beside the ranked
            // top-K), else 4 (not measured without the overlap)
            moe_down_occ_ = moe_overlap_ ? 6 : 4;
            if (const char* e = std::getenv("MARKBASE_CUDA_MOE_DOWN_OCC")) {
                if (std::strcmp(e, "4") != 0 && std::strcmp(e, "6") != 0)
                    throw Error(std::string("MARKBASE_CUDA_MOE_DOWN_OCC=") + e + ": expected 4 or 6");
                moe_down_occ_ = std::atoi(e);
            }
            // MARKBASE_CUDA_MOE_DOWN_SUM (decode rows; on unless 0): the experts' down rows and their
            // weighted sum in one kernel (moe.cu), bit-identical to the slots summed by the combine. Session
            // 10's H200 A/B on the 26B-A4B: -0.2% alone, -0.4% beside MOE_PRENORM.
            moe_down_sum_ = env_flag("MARKBASE_CUDA_MOE_DOWN_SUM", true) && moe_decode_rows_;
            // MARKBASE_CUDA_MOE_DOWN_ROWS (1, 2, 4 or 8; 4 unless set): output rows per block of the down-sum
            // (moe.cu; bit-identical). The H200 A/B: 4 -1.6% per token against 1, 2 -0.6%.
            // Tensor parallelism runs the same kernel on its ranks' experts, unmeasured there.
            moe_down_rows_ = 4;
            if (const char* e = std::getenv("MARKBASE_CUDA_MOE_DOWN_ROWS")) {
                if (std::strcmp(e, "1") != 0 && std::strcmp(e, "2") != 0 && std::strcmp(e, "4") != 0 &&
                    std::strcmp(e, "8") != 0)
                    throw Error(std::string("MARKBASE_CUDA_MOE_DOWN_ROWS=") + e + ": expected 1, 2, 4 or 8");
                moe_down_rows_ = std::atoi(e);
            }
            // MARKBASE_CUDA_MOE_PRENORM (one GPU, with PRENORM; on unless 0): the router's and the experts'
            // inputs from the post-attention update (norm_rope.cu NormCopies), where that update is a launch
            // of its own (residual()). Session 10's A/B: 26B-A4B -1.1% (3.013 -> 2.980 ms/token).
            moe_prenorm_ = env_flag("MARKBASE_CUDA_MOE_PRENORM", true) && prenorm_ && residual_launch_;
            if (moe_prenorm_) xr_ = alloc<float>(H);
            if (moe_overlap_) {
                CUDA_CHECK(cudaStreamCreateWithFlags(&stream2_, cudaStreamNonBlocking));
                CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
                CUDA_CHECK(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
            }
            moe_cap_ = moe_prefill_rows_cap(static_cast<int>(n), E, K);
            const int64_t scratch_rows = int64_t{E} * moe_cap_;  // the memory plan's; a pass may use less
            if (const char* e = std::getenv("MARKBASE_CUDA_MOE_PREFILL_CAP"))  // entries per expert per pass
                moe_cap_ = std::clamp(std::atoi(e), 1, moe_cap_);
            const int64_t rows = scratch_rows;
            mx_ = alloc<float>(rows * H);  // = 2 x bf16 [rows][H] (hi, lo), later the fp32 [rows][H] output
            mg_ = alloc<float>(rows * Ie);
            mu_ = alloc<float>(rows * Ie);
            mh_ = alloc<bf16>(2 * rows * Ie);
            if (const int srows = std::min(moe_cap_, gemm_stack_max_n_); moe_gemm_ && srows > 0) {
                ey2_ = alloc<float>(int64_t{E} * 2 * srows * std::max(2 * Ie, H));
                // the compact pass reuses the scratch: [2 R][H] bf16 in mx_, [2 R][Ie] in mh_, ey2_ for both
                // GEMMs' outputs
                // session 13's H200 A/B: 26B-A4B prefill of 512 tokens 5.9k -> 13.3k tok/s, the same bits
                moe_compact_ = env_flag("MARKBASE_CUDA_MOE_COMPACT", true);
                moe_compact_rows_ = std::min<int64_t>(rows, int64_t{E} * srows);
                if (const int ns = env_int("MARKBASE_CUDA_MOE_COMPACT_STREAMS", 1, 4, 2); ns > 1) {
                    for (int k = 0; k < ns; ++k) {
                        cudaEvent_t ev = nullptr;
                        CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
                        moe_events_.push_back(ev);
                    }
                    for (int k = 1; k < ns; ++k) {
                        cudaStream_t st = nullptr;
                        CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
                        moe_streams_.push_back(st);
                        cublasHandle_t hb = nullptr;
                        CUBLAS_CHECK(cublasCreate(&hb));
                        moe_blas_.push_back(hb);
                        CUBLAS_CHECK(cublasSetStream(hb, st));
                    }
                }
                const size_t plan = 6 * static_cast<size_t>(E) * sizeof(void*) + (E + 1) * sizeof(int);
                CUDA_CHECK(cudaMallocHost(&h_mplan_, plan));
                d_mplan_ = alloc<char>(plan);
            }
            CUDA_CHECK(cudaMallocHost(&h_goff_, (E + 1) * sizeof(int)));
            gexp_ = alloc<int>(std::max(E, K) + 1);
            goff_ = alloc<int>(std::max(E, K) + 1);
            gent_ = alloc<int>(n * K);
            e_in_ = alloc<float>(n * H);
            eh_ = alloc<float>(n * K * Ie);
            eslots_ = alloc<float>(n * K * H);
        }

        cache_.resize(L);
        for (int i = 0; i < L; ++i) {
            const LayerSpec& s = c_.layers[i];
            if (!s.has_own_kv()) continue;
            LayerCache& lc = cache_[i];
            lc.cap =
                s.kind == AttentionKind::Sliding ? std::min<int64_t>(ctx, c_.sliding_window + chunk) : ctx;
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
        if (d_sliding) inv_sliding_ = upload(c_.rope_sliding.inverse_frequencies(d_sliding));
        if (d_full) inv_full_ = upload(c_.rope_full.inverse_frequencies(d_full));
        CUDA_CHECK(cudaDeviceSynchronize());
    } catch (...) {
        release();
        throw;
    }
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
    if (n <= gemm_stack_max_n_ && N <= y2_cols_) {  // one pass over W: [hi; lo] as 2n columns, then the sum
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
    a.group_heads = attn_group_;
    a.group_tokens = attn_group_tokens_;
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
