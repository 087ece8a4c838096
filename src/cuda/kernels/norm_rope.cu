// Row-wise kernels around the projections: embedding lookup, per-layer-input mixing, fp32 -> bf16 hi/lo
// splitting for the prefill GEMMs, and the fused q/k norm + RoPE + cache write (the sandwich-norm residual
// updates: residual.cu). One block per row (or per head), fp32 throughout, the Gemma 4 math as GEMMA4.md
// section 2 states it.
#include <algorithm>

#include "cuda/check.h"
#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"
#include "cuda/kernels/kv_elems.cuh"
#include "cuda/kernels/launch.h"
#include "cuda/kernels/norm.cuh"

namespace markbase::cuda {

namespace {

__global__ void embed_kernel(const int* ids, const bf16* embed, int H, float scale, float* x,
                             unsigned long long* argmax, int64_t vocab_begin, int64_t vocab_rows) {
    pdl_begin();
    const int t = blockIdx.x;
    if (t == 0 && threadIdx.x == 0 && argmax) *argmax = 0;
    const int64_t id = ids[t] - vocab_begin;
    float* xt = x + static_cast<int64_t>(t) * H;
    if (vocab_rows >= 0 && (id < 0 || id >= vocab_rows)) {  // another rank's row
        for (int k = threadIdx.x; k < H; k += blockDim.x) xt[k] = 0.0f;
        return;
    }
    const bf16* row = embed + id * H;
    for (int k = threadIdx.x; k < H; k += blockDim.x) xt[k] = bf16_at(row, k) * scale;
}

// grid (L, n); one block per (token, layer) slice of P values.
__global__ void ple_mix_kernel(const float* ctx, const int* ids, const bf16* ple_embed, const bf16* norm_w,
                               int L, int P, float proj_scale, float tok_scale, float mix, float eps,
                               float* ple) {
    pdl_begin();
    __shared__ float red[32];
    const int l = blockIdx.x, t = blockIdx.y;
    const int64_t LP = static_cast<int64_t>(L) * P;
    const float* c = ctx + t * LP + static_cast<int64_t>(l) * P;
    const bf16* tok = ple_embed + static_cast<int64_t>(ids[t]) * LP + static_cast<int64_t>(l) * P;
    float* out = ple + t * LP + static_cast<int64_t>(l) * P;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < P; j += blockDim.x) {
        const float v = c[j] * proj_scale;
        ss = fmaf(v, v, ss);
    }
    ss = block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(P) + eps);
    for (int j = threadIdx.x; j < P; j += blockDim.x) {
        const float v = c[j] * proj_scale * inv * bf16_at(norm_w, j);
        out[j] = (v + bf16_at(tok, j) * tok_scale) * mix;
    }
}

__global__ void rmsnorm_rows_kernel(const float* x, const bf16* w, int H, float eps, float* out) {
    pdl_begin();
    __shared__ float red[32];
    const int64_t off = static_cast<int64_t>(blockIdx.x) * H;
    const float inv = row_inv_rms(x + off, H, eps, red);
    for (int k = threadIdx.x; k < H; k += blockDim.x) {
        float v = x[off + k] * inv;
        if (w) v *= bf16_at(w, k);
        out[off + k] = v;
    }
}

template <bool F16>
__global__ void split_rows_kernel(const float* x, int64_t ld_in, int width, bool norm, const bf16* w,
                                  float eps, uint16_t* hi, uint16_t* lo) {
    pdl_begin();
    __shared__ float red[32];
    const float* xr = x + static_cast<int64_t>(blockIdx.x) * ld_in;
    const float inv = norm ? row_inv_rms(xr, width, eps, red) : 1.0f;
    const int64_t o = static_cast<int64_t>(blockIdx.x) * width;
    for (int k = threadIdx.x; k < width; k += blockDim.x) {
        float v = xr[k];
        if (norm) {
            v *= inv;
            if (w) v *= bf16_at(w, k);
        }
        if constexpr (F16)
            store_f16_sixteenth(v, hi, o + k);  // (lo unused)
        else
            split_store(v, hi, lo, o + k);
    }
}

__global__ void geglu_split_kernel(const float* a, const float* b, int64_t ld_b, int width, bf16* hi,
                                   bf16* lo) {
    pdl_begin();
    const int64_t o = static_cast<int64_t>(blockIdx.x) * width;
    const float* br = b + static_cast<int64_t>(blockIdx.x) * ld_b;
    for (int k = threadIdx.x; k < width; k += blockDim.x)
        split_store(gelu_tanh(a[o + k]) * br[k], hi, lo, o + k);
}

__global__ void sum_halves_kernel(const float* __restrict__ y2, int n, int N, float* __restrict__ Y,
                                  int64_t ldy) {
    pdl_begin();
    const int64_t total = int64_t{n} * N, half = total;
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
         i += int64_t{gridDim.x} * blockDim.x) {
        const int64_t t = i / N, j = i - t * N;
        Y[t * ldy + j] = y2[i] + y2[half + i];
    }
}

// grid (nH + 2*nKV, n), kPostThreads threads, each holding kPostPer elements of the head (d <= 512);
// dynamic smem d floats.
// Batched: per-token positions and cache slots (QkvPost.tok_pos); a separate instantiation, so the decode
// step's kernel is unchanged.
constexpr int kPostThreads = 128;
constexpr int kPostPer = 4;
// This thread's elements of a head's norm weights (1 without weights) and RoPE frequencies (0 without).
__device__ __forceinline__ void post_consts(const bf16* w, const float* inv_freq, int d,
                                            float (&wv)[kPostPer], float (&fv)[kPostPer / 2]) {
#pragma unroll
    for (int i = 0; i < kPostPer; ++i) {
        const int j = threadIdx.x + i * kPostThreads;
        wv[i] = w && j < d ? bf16_at(w, j) : 1.0f;
    }
#pragma unroll
    for (int i = 0; i < kPostPer / 2; ++i) {
        const int j = threadIdx.x + i * kPostThreads;
        fv[i] = inv_freq && j < d / 2 ? inv_freq[j] : 0.0f;
    }
}
template <bool Batched, class KvT>
__global__ void __launch_bounds__(kPostThreads) qkv_post_kernel(const QkvPost p) {
    extern __shared__ float buf[];
    __shared__ float red[32];
    const int t = blockIdx.y, b = blockIdx.x, d = p.d, half = d / 2;
    const int kv = b - p.nH;  // >= 0: a KV head (k if < nKV, else v)
    const bf16* w = b < p.nH ? p.q_norm : kv < p.nKV ? p.k_norm : nullptr;
    const bool rope = b < p.nH + p.nKV;
    // the head's norm weights and RoPE frequencies: constants, so before the PDL wait (the H200 A/B of this
    // and the MoE combine's early weights: E2B -0.4%, E4B -0.3%, 26B-A4B -1.0%, 31B -0.1%)
    float wv[kPostPer], fv[kPostPer / 2];
    post_consts(w, rope ? p.inv_freq : nullptr, d, wv, fv);
    pdl_begin();
    const int64_t pos =
        Batched ? static_cast<int64_t>(p.tok_pos[t]) : static_cast<int64_t>(p.pos_base[0]) + t;
    const int64_t row = kv_row(p, Batched ? p.tok_slot[t] : 0, pos);
    const float* in;
    float* outq = nullptr;  // a query head: in place, fp32
    KvT* outkv = nullptr;   // a key or value head: its cache row
    if (b < p.nH) {
        in = p.q + (static_cast<int64_t>(t) * p.nH + b) * d;
        outq = p.q + (static_cast<int64_t>(t) * p.nH + b) * d;
    } else if (kv < p.nKV) {
        in = p.kraw + (static_cast<int64_t>(t) * p.nKV + kv) * d;
        outkv = static_cast<KvT*>(p.k_cache) + (row * p.nKV + kv) * d;
    } else {
        const int g = kv - p.nKV;
        in = p.vraw + (static_cast<int64_t>(t) * p.nKV + g) * d;
        outkv = static_cast<KvT*>(p.v_cache) + (row * p.nKV + g) * d;
    }
    auto put = [&](int j, float v) {
        if (outq)
            outq[j] = v;
        else
            kv_store(outkv + j, v);
    };
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < kPostPer; ++i) {
        const int j = threadIdx.x + i * kPostThreads;
        if (j < d) {
            const float v = in[j];
            buf[j] = v;
            ss = fmaf(v, v, ss);
        }
    }
    ss = block_sum(ss, red);  // ends with a barrier: buf is complete
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(d) + p.eps);
#pragma unroll
    for (int i = 0; i < kPostPer; ++i) {
        const int j = threadIdx.x + i * kPostThreads;
        if (j < d) buf[j] = buf[j] * inv * wv[i];  // wv = 1 without a weight (v): exact
    }
    __syncthreads();
    if (rope) {
        const float fpos = static_cast<float>(pos);
#pragma unroll
        for (int i = 0; i < kPostPer / 2; ++i) {
            const int j = threadIdx.x + i * kPostThreads;
            if (j < half) {
                const float ang = fpos * fv[i];
                const float c = cosf(ang), sn = sinf(ang);
                const float a = buf[j], bb = buf[j + half];
                put(j, a * c - bb * sn);
                put(j + half, bb * c + a * sn);
            }
        }
    } else {
        for (int j = threadIdx.x; j < d; j += kPostThreads) put(j, buf[j]);
    }
}

}  // namespace

void embed_rows(const int* ids, int n, const bf16* embed, int H, float scale, float* x,
                unsigned long long* argmax_key, cudaStream_t s, int64_t vocab_begin, int64_t vocab_rows) {
    launch_kernel(embed_kernel, dim3(n), dim3(row_threads(H)), 0, s, ids, embed, H, scale, x, argmax_key,
                  vocab_begin, vocab_rows);
    CUDA_CHECK_LAUNCH();
}

void ple_mix(const float* ctx, const int* ids, int n, const bf16* ple_embed, const bf16* norm_w, int L, int P,
             int H, float eps, float* ple, cudaStream_t s) {
    const float proj_scale = 1.0f / std::sqrt(static_cast<float>(H));
    const float tok_scale = round_to_bf16(std::sqrt(static_cast<float>(P)));
    const float mix = 1.0f / std::sqrt(2.0f);
    launch_kernel(ple_mix_kernel, dim3(L, n), dim3(128), 0, s, ctx, ids, ple_embed, norm_w, L, P, proj_scale,
                  tok_scale, mix, eps, ple);
    CUDA_CHECK_LAUNCH();
}

void rmsnorm_rows(const float* x, const bf16* w, int H, int n, float eps, float* out, cudaStream_t s) {
    launch_kernel(rmsnorm_rows_kernel, dim3(n), dim3(row_threads(H)), 0, s, x, w, H, eps, out);
    CUDA_CHECK_LAUNCH();
}

void split_rows(const float* x, int64_t ld_in, int width, int n, bool norm, const bf16* w, float eps,
                bf16* hi, bf16* lo, cudaStream_t s) {
    launch_kernel(split_rows_kernel<false>, dim3(n), dim3(row_threads(width)), 0, s, x, ld_in, width, norm, w,
                  eps, hi, lo);
    CUDA_CHECK_LAUNCH();
}

void f16_rows(const float* x, int64_t ld_in, int width, int n, bool norm, const bf16* w, float eps,
              uint16_t* out, cudaStream_t s) {
    launch_kernel(split_rows_kernel<true>, dim3(n), dim3(row_threads(width)), 0, s, x, ld_in, width, norm, w,
                  eps, out, nullptr);
    CUDA_CHECK_LAUNCH();
}

void geglu_split(const float* a, const float* b, int64_t ld_b, int width, int n, bf16* hi, bf16* lo,
                 cudaStream_t s) {
    launch_kernel(geglu_split_kernel, dim3(n), dim3(row_threads(width)), 0, s, a, b, ld_b, width, hi, lo);
    CUDA_CHECK_LAUNCH();
}

void sum_halves(const float* y2, int n, int N, float* Y, int64_t ldy, cudaStream_t s) {
    const int64_t total = int64_t{n} * N;
    const int threads = 256;
    const int blocks = static_cast<int>(std::min<int64_t>((total + threads - 1) / threads, 65535));
    launch_kernel(sum_halves_kernel, dim3(blocks), dim3(threads), 0, s, y2, n, N, Y, ldy);
    CUDA_CHECK_LAUNCH();
}

void qkv_post(const QkvPost& p, int n, cudaStream_t s) {
    if (p.d > kPostThreads * kPostPer || p.d % 2)
        throw Error("internal: head dim " + std::to_string(p.d) + " is odd or above " +
                    std::to_string(kPostThreads * kPostPer));
    const int heads = p.nH + (p.kraw ? 2 * p.nKV : 0);
    const size_t smem = static_cast<size_t>(p.d) * sizeof(float);
    kv_dispatch(p.kv, [&](auto e) {
        using KvT = decltype(e);
        if (p.tok_pos)
            launch_kernel(qkv_post_kernel<true, KvT>, dim3(heads, n), dim3(kPostThreads), smem, s, p);
        else
            launch_kernel(qkv_post_kernel<false, KvT>, dim3(heads, n), dim3(kPostThreads), smem, s, p);
    });
    CUDA_CHECK_LAUNCH();
}

}  // namespace markbase::cuda
