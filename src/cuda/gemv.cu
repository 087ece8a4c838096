// Decode-time matrix-vector products: y = W @ xn with W bf16 [rows, K] and xn fp32.
// Layout: a block of 8 warps stages the (optionally RMS-normalised) input in shared memory once, then each
// warp streams R whole rows with 16-byte loads, U chunks per row in flight before the first use, and reduces
// with shuffles. A grid-stride loop over row groups keeps the grid at a few blocks per SM however tall W is,
// so the staging cost stays small even for the 262144-row lm_head. Epilogues fuse what follows each product
// (GeGLU, the PLE gate, softcap + argmax), so those intermediates never make a round trip through memory.
//
// Since the H200 A/B the decode step's plain, GeGLU and PLE-gate products at one token run in gemv_rows.cu
// (MARKBASE_CUDA_GEMV unset or =warp); this file keeps lm_head (softcap + argmax + the step's end), products
// over several tokens, and the older variants for A/B runs. MARKBASE_CUDA_GEMV=legacy|r2u4|... selects one
// (read when a model is built; legacy is the layout described above): rows per warp R, chunks per row in
// flight U, the grid either the legacy "a few blocks per SM, capped by groups" or exactly the blocks that can
// be resident at once (one wave, every block loops, the input staged once per block), and for plain products
// at one token a balanced split-K (the K range of each row group cut into S slices, partial sums added with
// atomicAdd into a zeroed y) so that short-wide matrices (31B down, o_proj) end without a tail. See
// gemv_variant_name().
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>

#include "cuda/check.h"
#include "cuda/device_common.cuh"
#include "cuda/kernels.h"
#include "cuda/launch.h"

namespace markbase::cuda {

namespace {

enum Mode { kStore = 0, kGeglu = 1, kGeluMul = 2, kLogits = 3 };

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

struct Params {
    GemvInput in;
    GemvSeg seg[3];
    int seg_end[3] = {0, 0, 0};  // cumulative row counts
    int nseg = 0;
    int total_rows = 0;
    int ksplit = 1;              // K slices per row group (> 1: kStore only, y zeroed, atomicAdd)
    const bf16* w2 = nullptr;    // kGeglu: the up projection
    const float* aux = nullptr;  // kGeluMul: the multiplier
    float softcap = 0.0f;        // kLogits
    unsigned long long* argmax = nullptr;
    uint32_t id_base =
        0;              // kLogits: the id of row 0 (a rank's first vocabulary row under tensor parallelism)
    StepFinish finish;  // kLogits: state == nullptr for none
};

// Stage the input in shared memory: x itself, or the fused residual update, then optionally
// xn = x * rsqrt(mean(x^2) + eps) * w * scale.
__device__ void stage_input(const GemvInput& in, const float* x, float* xs, float* red) {
    const int K = in.K;
    if (in.res_y) {
        float ss = 0.0f;
        for (int k = threadIdx.x; k < K; k += blockDim.x) ss = fmaf(in.res_y[k], in.res_y[k], ss);
        ss = block_sum(ss, red);
        const float inv_y = 1.0f / sqrtf(ss / static_cast<float>(K) + in.eps);
        const bool writer = blockIdx.x == 0 && blockIdx.y == 0;
        for (int k = threadIdx.x; k < K; k += blockDim.x) {
            const float v = (in.res_x[k] + in.res_y[k] * inv_y * bf16_at(in.res_w, k)) * in.res_scale;
            xs[k] = v;
            if (writer) in.res_out[k] = v;
        }
    } else {
        for (int k = threadIdx.x; k < K; k += blockDim.x) xs[k] = x[k];
    }
    __syncthreads();
    if (in.norm) {
        float ss = 0.0f;
        for (int k = threadIdx.x; k < K; k += blockDim.x) ss = fmaf(xs[k], xs[k], ss);
        ss = block_sum(ss, red);
        const float inv = 1.0f / sqrtf(ss / static_cast<float>(K) + in.eps);
        for (int k = threadIdx.x; k < K; k += blockDim.x) {
            float v = xs[k] * inv;
            if (in.norm_w) v *= bf16_at(in.norm_w, k);
            if (in.norm_scale != 1.0f) v *= in.norm_scale;
            xs[k] = v;
        }
        __syncthreads();
    }
}

template <int M, int R, int U>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const Params p) {
    extern __shared__ float4 smem4[];
    float* xs = reinterpret_cast<float*>(smem4);
    __shared__ float red[32];
    __shared__ unsigned long long best_s[kWarps];

    const int tok = blockIdx.y;
    // Weights never depend on the previous kernel: before waiting for it, pull this block's first row group
    // toward L2, so the streaming loop below starts on lines already in flight.
    if (tok == 0 && p.ksplit == 1 && blockIdx.x * kWarps * R < p.total_rows) {
        const int lane = threadIdx.x & 31, row0 = (blockIdx.x * kWarps + (threadIdx.x >> 5)) * R;
        const int64_t row_bytes = 2 * static_cast<int64_t>(p.in.K);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int row = row0 + r;
            if (row >= p.total_rows) break;
            int s = 0;
            while (s + 1 < p.nseg && row >= p.seg_end[s]) ++s;
            const int local = row - (s ? p.seg_end[s - 1] : 0);
            const char* a = reinterpret_cast<const char*>(p.seg[s].w) + local * row_bytes;
            const char* b = M == kGeglu ? reinterpret_cast<const char*>(p.w2) + local * row_bytes : nullptr;
            for (int64_t off = lane * 128; off < row_bytes; off += 32 * 128) {
                prefetch_l2(a + off);
                if (b) prefetch_l2(b + off);
            }
        }
    }
    pdl_begin();
    stage_input(p.in, p.in.x + tok * p.in.ldx, xs, red);

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nchunk = p.in.K >> 3;
    const int groups = (p.total_rows + kWarps * R - 1) / (kWarps * R);
    const int S = p.ksplit;
    const int slice_len = (nchunk + S - 1) / S;  // chunks per K slice
    unsigned long long best = 0;

    for (int unit = blockIdx.x; unit < groups * S; unit += gridDim.x) {
        const int g = S == 1 ? unit : unit / S;
        const int c_lo = S == 1 ? 0 : (unit - g * S) * slice_len;
        const int c_hi = S == 1 ? nchunk : min(nchunk, c_lo + slice_len);
        const int row0 = (g * kWarps + warp) * R;
        const uint4* wr[R];
        const uint4* wu[R];
        float* yp[R];
        bool valid[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int row = row0 + r;
            valid[r] = row < p.total_rows;
            int s = 0;
            while (s + 1 < p.nseg && row >= p.seg_end[s]) ++s;
            const int local = row - (s ? p.seg_end[s - 1] : 0);
            const int lr = valid[r] ? local : 0;
            wr[r] = reinterpret_cast<const uint4*>(p.seg[s].w + static_cast<int64_t>(lr) * p.in.K);
            wu[r] = M == kGeglu ? reinterpret_cast<const uint4*>(p.w2 + static_cast<int64_t>(lr) * p.in.K)
                                : wr[r];
            yp[r] = p.seg[s].y + tok * p.seg[s].ldy + lr;
        }
        float acc[R], acc2[R];
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] = acc2[r] = 0.0f;

        for (int base = c_lo; base < c_hi; base += 32 * U) {
            uint4 wv[R][U], wv2[R][U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int c = base + u * 32 + lane;
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const bool ok = valid[r] && c < c_hi;
                    wv[r][u] = ok ? ld_stream(wr[r] + c) : make_uint4(0, 0, 0, 0);
                    if constexpr (M == kGeglu) wv2[r][u] = ok ? ld_stream(wu[r] + c) : make_uint4(0, 0, 0, 0);
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int c = base + u * 32 + lane;
                if (c < c_hi) {
                    const float4 a = smem4[2 * c], b = smem4[2 * c + 1];
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        acc[r] += dot8(wv[r][u], a, b);
                        if constexpr (M == kGeglu) acc2[r] += dot8(wv2[r][u], a, b);
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            acc[r] = warp_sum(acc[r]);
            if constexpr (M == kGeglu) acc2[r] = warp_sum(acc2[r]);
        }
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < R; ++r) {
                if (!valid[r]) continue;
                if constexpr (M == kStore) {
                    if (S == 1)
                        *yp[r] = acc[r];
                    else
                        atomicAdd(yp[r], acc[r]);
                } else if constexpr (M == kGeglu) {
                    *yp[r] = gelu_tanh(acc[r]) * acc2[r];
                } else if constexpr (M == kGeluMul) {
                    *yp[r] = gelu_tanh(acc[r]) * p.aux[row0 + r];
                } else {
                    const float v = p.softcap > 0.0f ? p.softcap * tanhf(acc[r] / p.softcap) : acc[r];
                    *yp[r] = v;
                    const unsigned long long key = argmax_key(v, p.id_base + static_cast<uint32_t>(row0 + r));
                    best = key > best ? key : best;
                }
            }
        }
    }
    if constexpr (M == kLogits) {
        if (lane == 0) best_s[warp] = best;
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned long long b = 0;
            for (int w = 0; w < kWarps; ++w) b = best_s[w] > b ? best_s[w] : b;
            if (b) atomicMax(p.argmax, b);
            if (p.finish.state) {  // the last block to finish turns the argmax into the next token
                __threadfence();
                const unsigned int ticket = atomicAdd(p.finish.counter, 1u);
                if (ticket == gridDim.x * gridDim.y - 1) {
                    __threadfence();
                    const unsigned long long key = atomicAdd(p.argmax, 0ull);
                    finish_token(key, p.finish.state, p.finish.advance, p.finish.out_ids, p.finish.out_cap);
                    *p.finish.counter = 0u;
                }
            }
        }
    }
}

// ---- variants (MARKBASE_CUDA_GEMV) ----
struct VariantSpec {
    const char* name;
    int R, U;
    bool resident;  // grid = blocks resident at once (one wave), else the legacy sizing
    bool splitk;    // balanced split-K for kStore at one token
};
constexpr VariantSpec kSpecs[] = {
    {"legacy", 2, 4, false, false},  // 0: the default
    {"r2u4", 2, 4, true, false},     // 1
    {"r1u8", 1, 8, true, false},     // 2
    {"r4u2", 4, 2, true, false},     // 3
    {"r1u8k", 1, 8, true, true},     // 4
    {"r2u4k", 2, 4, true, true},     // 5
    {"warp", 2, 4, false, false},    // 6 = kGemvVariantWarp: gemv_rows.cu (here: lm_head, several tokens)
    {"warpk", 2, 4, false, false},   // 7 = kGemvVariantWarpK: gemv_rows.cu with K shared by warps
    {"async", 2, 4, false, false},   // 8 = kGemvVariantAsync: gemv_rows.cu, warps streaming through cp.async
    {"asyncg", 2, 4, false, false},  // 9 = kGemvVariantAsyncG: async for the GeGLU launches only
};
constexpr int kNumVariants = static_cast<int>(sizeof(kSpecs) / sizeof(kSpecs[0]));

int sm_count() {
    static int n = [] {
        int dev = 0, v = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
        return v;
    }();
    return n;
}

// Register and static shared-memory use of each instantiation, read in gemv_prepare (outside any graph
// capture), for the resident-grid sizing.
struct FuncRes {
    int regs = 0;
    size_t static_smem = 0;
};
std::unordered_map<const void*, FuncRes>& func_res() {
    static std::unordered_map<const void*, FuncRes> m;
    return m;
}

// Blocks of a kernel that fit on one SM at once (Hopper: 64K registers, 228 KB shared memory with 1 KB
// reserved per block, 2048 threads, 32 blocks); 0 when unknown.
int resident_blocks(const void* fn, size_t dyn_smem) {
    const auto it = func_res().find(fn);
    if (it == func_res().end() || it->second.regs == 0) return 0;
    const int regs_per_warp = ((it->second.regs * 32 + 255) / 256) * 256;
    const int by_regs = 65536 / (regs_per_warp * kWarps);
    const int by_smem = static_cast<int>((228 * 1024) / (dyn_smem + it->second.static_smem + 1024));
    return std::max(1, std::min({by_regs, by_smem, 2048 / kThreads, 32}));
}

template <int M, int R, int U>
void launch_rt(Params& p, int ntok, const VariantSpec& v, cudaStream_t s) {
    const size_t smem = static_cast<size_t>(p.in.K) * sizeof(float);
    const int groups = (p.total_rows + kWarps * R - 1) / (kWarps * R);
    int blocks = 0;
    p.ksplit = 1;
    const void* fn = reinterpret_cast<const void*>(gemv_kernel<M, R, U>);
    const int res = v.resident ? resident_blocks(fn, smem) : 0;
    if (res > 0) {
        blocks = sm_count() * res;
        if (M == kStore && v.splitk && ntok == 1)
            p.ksplit = p.in.ksplit > 0 ? std::min(p.in.ksplit, std::max(1, p.in.K >> 3))
                                       : choose_ksplit(groups, blocks, p.in.K >> 3, U);
        blocks = std::min(blocks, groups * p.ksplit);
    } else {
        const int per_sm = std::max(1, std::min(8, static_cast<int>((200 * 1024) / (smem + 2048))));
        blocks = std::min(groups, sm_count() * per_sm);
    }
    if (p.ksplit > 1)
        for (int i = 0; i < p.nseg; ++i)
            CUDA_CHECK(cudaMemsetAsync(p.seg[i].y, 0, static_cast<size_t>(p.seg[i].rows) * sizeof(float), s));
    launch_kernel(gemv_kernel<M, R, U>, dim3(blocks, ntok), dim3(kThreads), smem, s, p);
    CUDA_CHECK_LAUNCH();
}

template <int M>
void launch(Params& p, int ntok, cudaStream_t s) {
    if (p.in.K % 8 != 0)
        throw Error("internal: GEMV input width " + std::to_string(p.in.K) + " is not a multiple of 8");
    p.total_rows = 0;
    for (int i = 0; i < p.nseg; ++i) p.seg_end[i] = (p.total_rows += p.seg[i].rows);
    if (p.total_rows == 0 || ntok == 0) return;
    const int vi = p.in.variant >= 0 && p.in.variant < kNumVariants ? p.in.variant : 0;
    const VariantSpec& v = kSpecs[vi];
    if (v.R == 1)
        launch_rt<M, 1, 8>(p, ntok, v, s);
    else if (v.R == 4)
        launch_rt<M, 4, 2>(p, ntok, v, s);
    else
        launch_rt<M, 2, 4>(p, ntok, v, s);
}

template <int M, int R, int U>
void prepare_one(int bytes) {
    CUDA_CHECK(
        cudaFuncSetAttribute(gemv_kernel<M, R, U>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    cudaFuncAttributes fa{};
    CUDA_CHECK(cudaFuncGetAttributes(&fa, gemv_kernel<M, R, U>));
    func_res()[reinterpret_cast<const void*>(gemv_kernel<M, R, U>)] = {fa.numRegs, fa.sharedSizeBytes};
}

template <int M>
void prepare_mode(int bytes) {
    prepare_one<M, 2, 4>(bytes);
    prepare_one<M, 1, 8>(bytes);
    prepare_one<M, 4, 2>(bytes);
}

}  // namespace

int gemv_variant_from_env() {
    const char* e = std::getenv("MARKBASE_CUDA_GEMV");
    // warpk, the default since session 3's H200 A/B (bench/NOTES.md): -1.6..-3.4% per token vs warp
    if (!e || !*e) return kGemvVariantWarpK;
    for (int i = 0; i < kNumVariants; ++i)
        if (std::strcmp(e, kSpecs[i].name) == 0 || std::to_string(i) == e) return i;
    throw Error(std::string("MARKBASE_CUDA_GEMV=") + e +
                ": unknown variant (legacy|r2u4|r1u8|r4u2|r1u8k|r2u4k|warp|warpk|async|asyncg or 0..9)");
}

const char* gemv_variant_name(int v) {
    return v >= 0 && v < kNumVariants ? kSpecs[v].name : "?";
}

void gemv_prepare(int max_K) {
    sm_count();  // query the device now: launches may later run inside a graph capture
    const size_t smem = static_cast<size_t>(max_K) * sizeof(float);
    if (smem > 220 * 1024)
        throw Error("GEMV input width " + std::to_string(max_K) + " exceeds the shared-memory staging limit");
    const int bytes = static_cast<int>(std::max<size_t>(smem, 48 * 1024));
    // Per device (a function's attributes belong to the current device's context), only ever raised: another
    // live model may need the larger limit. Tensor-parallel ranks build their models on several threads.
    static std::mutex mu;
    static std::unordered_map<int, int> prepared;
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    std::lock_guard<std::mutex> lock(mu);
    if (bytes <= prepared[dev]) return;
    prepare_mode<kStore>(bytes);
    prepare_mode<kGeglu>(bytes);
    prepare_mode<kGeluMul>(bytes);
    prepare_mode<kLogits>(bytes);
    prepared[dev] = bytes;
}

void gemv(const GemvInput& in, const GemvSeg* segs, int nseg, int ntok, cudaStream_t s) {
    if (gemv_variant_is_rows(in.variant) && ntok == 1 && !in.res_y)
        return gemv_rows(in, segs, nseg, nullptr, s);
    Params p;
    p.in = in;
    p.nseg = nseg;
    for (int i = 0; i < nseg; ++i) p.seg[i] = segs[i];
    launch<kStore>(p, ntok, s);
}

void gemv_geglu(const GemvInput& in, const bf16* wg, const bf16* wu, int rows, float* y, cudaStream_t s) {
    if (gemv_variant_is_rows(in.variant) && !in.res_y) return gemv_rows_geglu(in, wg, wu, rows, y, s);
    Params p;
    p.in = in;
    p.nseg = 1;
    p.seg[0] = {wg, y, rows, 0};
    p.w2 = wu;
    launch<kGeglu>(p, 1, s);
}

void gemv_gelu_mul(const GemvInput& in, const bf16* w, int rows, const float* aux, float* y, cudaStream_t s) {
    if (gemv_variant_is_rows(in.variant) && !in.res_y) return gemv_rows_gelu_mul(in, w, rows, aux, y, s);
    Params p;
    p.in = in;
    p.nseg = 1;
    p.seg[0] = {w, y, rows, 0};
    p.aux = aux;
    launch<kGeluMul>(p, 1, s);
}

void gemv_logits(const GemvInput& in, const bf16* w, int rows, float softcap, float* logits,
                 unsigned long long* argmax_key_out, cudaStream_t s, const StepFinish* finish,
                 int64_t id_base) {
    Params p;
    p.id_base = static_cast<uint32_t>(id_base);
    if (finish) p.finish = *finish;
    p.in = in;
    p.nseg = 1;
    p.seg[0] = {w, logits, rows, 0};
    p.softcap = softcap;
    p.argmax = argmax_key_out;
    launch<kLogits>(p, 1, s);
}

}  // namespace markbase::cuda
