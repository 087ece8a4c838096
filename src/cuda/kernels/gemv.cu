// Decode-time matrix-vector products: y = W @ xn with W bf16 [rows, K] and xn fp32.
// Layout: a block of 8 warps stages the (optionally RMS-normalised) input in shared memory once, then each
// warp streams R whole rows with 16-byte loads, U chunks per row in flight before the first use, and reduces
// with shuffles. A grid-stride loop over row groups keeps the grid at a few blocks per SM however tall W is,
// so the staging cost stays small even for the 262144-row lm_head. Epilogues fuse what follows each product
// (GeGLU, the PLE gate, softcap + argmax), so those intermediates never make a round trip through memory.
//
// The decode step's plain, GeGLU and PLE-gate products at one token run in gemv_rows.cu (GemvKernel::kRows);
// this file keeps lm_head (softcap + argmax + the step's end) and products over several tokens (the prefill
// router), 2 rows per warp with 4 chunks per row in flight. The tile variants that lost to the warp-per-row
// kernel (resident grids, other R x U, a balanced split-K) are the kernel lab's v2 and v6..v10
// (bench/kernels/gemv_lab.cu).
#include <algorithm>
#include <mutex>
#include <string>
#include <unordered_map>

#include "cuda/check.h"
#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"
#include "cuda/kernels/launch.h"

namespace markbase::cuda {

namespace {

enum Mode { kStore = 0, kGeglu = 1, kGeluMul = 2, kLogits = 3 };

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kR = 2;  // rows per warp
constexpr int kU = 4;  // 16-byte chunks per row in flight

struct Params {
    GemvInput in;
    GemvSeg seg[3];
    int seg_end[3] = {0, 0, 0};  // cumulative row counts
    int nseg = 0;
    int total_rows = 0;
    const bf16* w2 = nullptr;    // kGeglu: the up projection
    const float* aux = nullptr;  // kGeluMul: the multiplier
    float softcap = 0.0f;        // kLogits
    unsigned long long* argmax = nullptr;
    uint32_t id_base =
        0;              // kLogits: the id of row 0 (a rank's first vocabulary row under tensor parallelism)
    StepFinish finish;  // kLogits: state == nullptr for none
};

// Stage the input in shared memory, then optionally xn = x * rsqrt(mean(x^2) + eps) * w * scale.
__device__ void stage_input(const GemvInput& in, const float* x, float* xs, float* red) {
    const int K = in.K;
    for (int k = threadIdx.x; k < K; k += blockDim.x) xs[k] = x[k];
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

// Weights never depend on the previous kernel: before waiting for it, pull this block's first row group
// toward L2, so the streaming loop starts on lines already in flight.
template <int M>
__device__ __forceinline__ void prefetch_first_group(const Params& p) {
    constexpr int R = kR;
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

// A warp's R rows of a group (from row0): their weight rows (wu: kGeglu's up rows), outputs, and whether
// they exist (a row past the end reads row 0 and stores nothing).
template <int M>
__device__ __forceinline__ void group_rows(const Params& p, int tok, int row0, const uint4* (&wr)[kR],
                                           const uint4* (&wu)[kR], float* (&yp)[kR], bool (&valid)[kR]) {
#pragma unroll
    for (int r = 0; r < kR; ++r) {
        const int row = row0 + r;
        valid[r] = row < p.total_rows;
        int s = 0;
        while (s + 1 < p.nseg && row >= p.seg_end[s]) ++s;
        const int local = row - (s ? p.seg_end[s - 1] : 0);
        const int lr = valid[r] ? local : 0;
        wr[r] = reinterpret_cast<const uint4*>(p.seg[s].w + static_cast<int64_t>(lr) * p.in.K);
        wu[r] =
            M == kGeglu ? reinterpret_cast<const uint4*>(p.w2 + static_cast<int64_t>(lr) * p.in.K) : wr[r];
        yp[r] = p.seg[s].y + tok * p.seg[s].ldy + lr;
    }
}

// The R rows' dot products with the staged input over chunks [c_lo, c_hi) (this lane's chunks base + u 32 +
// lane), U chunks per row requested before the first use; not yet reduced over the warp.
template <int M>
__device__ __forceinline__ void group_dots(const float4* xs4, const uint4* const (&wr)[kR],
                                           const uint4* const (&wu)[kR], const bool (&valid)[kR], int c_lo,
                                           int c_hi, int lane, float (&acc_out)[kR], float (&acc2_out)[kR]) {
    constexpr int R = kR, U = kU;
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
                const float4 a = xs4[2 * c], b = xs4[2 * c + 1];
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
        acc_out[r] = acc[r];
        acc2_out[r] = acc2[r];
    }
}

// The rows' outputs (lane 0), by mode; kLogits also keeps the largest argmax key in `best`.
template <int M>
__device__ __forceinline__ void group_store(const Params& p, int row0, float* const (&yp)[kR],
                                            const bool (&valid)[kR], const float (&acc)[kR],
                                            const float (&acc2)[kR], unsigned long long& best) {
#pragma unroll
    for (int r = 0; r < kR; ++r) {
        if (!valid[r]) continue;
        if constexpr (M == kStore) {
            *yp[r] = acc[r];
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

// kLogits: the block's largest key into the global argmax; with a StepFinish, the last block to finish turns
// the argmax into the next token.
__device__ __forceinline__ void logits_finish(const Params& p, unsigned long long (&best_s)[kWarps],
                                              unsigned long long best, int lane, int warp) {
    if (lane == 0) best_s[warp] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long b = 0;
        for (int w = 0; w < kWarps; ++w) b = best_s[w] > b ? best_s[w] : b;
        if (b) atomicMax(p.argmax, b);
        if (p.finish.state) {
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

template <int M>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const Params p) {
    constexpr int R = kR;
    extern __shared__ float4 smem4[];
    float* xs = reinterpret_cast<float*>(smem4);
    __shared__ float red[32];
    __shared__ unsigned long long best_s[kWarps];

    const int tok = blockIdx.y;
    if (tok == 0 && blockIdx.x * kWarps * R < p.total_rows) prefetch_first_group<M>(p);
    pdl_begin();
    stage_input(p.in, p.in.x + tok * p.in.ldx, xs, red);

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nchunk = p.in.K >> 3;
    const int groups = (p.total_rows + kWarps * R - 1) / (kWarps * R);
    unsigned long long best = 0;

    for (int g = blockIdx.x; g < groups; g += gridDim.x) {
        const int c_lo = 0, c_hi = nchunk;
        const int row0 = (g * kWarps + warp) * R;
        const uint4* wr[R];
        const uint4* wu[R];
        float* yp[R];
        bool valid[R];
        group_rows<M>(p, tok, row0, wr, wu, yp, valid);
        float acc[R], acc2[R];
        group_dots<M>(smem4, wr, wu, valid, c_lo, c_hi, lane, acc, acc2);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            acc[r] = warp_sum(acc[r]);
            if constexpr (M == kGeglu) acc2[r] = warp_sum(acc2[r]);
        }
        if (lane == 0) group_store<M>(p, row0, yp, valid, acc, acc2, best);
    }
    if constexpr (M == kLogits) logits_finish(p, best_s, best, lane, warp);
}

int sm_count() {
    static int n = [] {
        int dev = 0, v = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
        return v;
    }();
    return n;
}

// A few blocks per SM (as many as the staged input leaves room for, at most 8), capped by the row groups;
// each block loops over row groups.
template <int M>
void launch(Params& p, int ntok, cudaStream_t s) {
    if (p.in.K % 8 != 0)
        throw Error("internal: GEMV input width " + std::to_string(p.in.K) + " is not a multiple of 8");
    p.total_rows = 0;
    for (int i = 0; i < p.nseg; ++i) p.seg_end[i] = (p.total_rows += p.seg[i].rows);
    if (p.total_rows == 0 || ntok == 0) return;
    const size_t smem = static_cast<size_t>(p.in.K) * sizeof(float);
    const int groups = (p.total_rows + kWarps * kR - 1) / (kWarps * kR);
    const int per_sm = std::max(1, std::min(8, static_cast<int>((200 * 1024) / (smem + 2048))));
    const int blocks = std::min(groups, sm_count() * per_sm);
    launch_kernel(gemv_kernel<M>, dim3(blocks, ntok), dim3(kThreads), smem, s, p);
    CUDA_CHECK_LAUNCH();
}

}  // namespace

void gemv_prepare(int max_K) {
    sm_count();  // query the device now: launches may later run inside a graph capture
    gemv_quant_prepare();
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
    for (const void* fn : {reinterpret_cast<const void*>(gemv_kernel<kStore>),
                           reinterpret_cast<const void*>(gemv_kernel<kGeglu>),
                           reinterpret_cast<const void*>(gemv_kernel<kGeluMul>),
                           reinterpret_cast<const void*>(gemv_kernel<kLogits>)})
        CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    prepared[dev] = bytes;
}

void gemv(const GemvInput& in, const GemvSeg* segs, int nseg, int ntok, cudaStream_t s) {
    if (nseg > 0 && segs[0].q.q) {
        if (ntok != 1) throw Error("internal: quantised weights are read at one token only");
        return gemv_quant(in, segs, nseg, s);
    }
    if (in.kernel != GemvKernel::kTiles && ntok == 1) return gemv_rows(in, segs, nseg, s);
    Params p;
    p.in = in;
    p.nseg = nseg;
    for (int i = 0; i < nseg; ++i) p.seg[i] = segs[i];
    launch<kStore>(p, ntok, s);
}

void gemv_geglu(const GemvInput& in, const bf16* wg, const bf16* wu, int rows, float* y, cudaStream_t s) {
    if (in.kernel != GemvKernel::kTiles) return gemv_rows_geglu(in, wg, wu, rows, y, s);
    Params p;
    p.in = in;
    p.nseg = 1;
    p.seg[0] = {wg, y, rows, 0};
    p.w2 = wu;
    launch<kGeglu>(p, 1, s);
}

void gemv_gelu_mul(const GemvInput& in, const bf16* w, int rows, const float* aux, float* y, cudaStream_t s) {
    if (in.kernel != GemvKernel::kTiles) return gemv_rows_gelu_mul(in, w, rows, aux, y, s);
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
