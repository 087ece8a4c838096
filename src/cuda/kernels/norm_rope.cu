// Row-wise kernels around the projections: embedding lookup, per-layer-input mixing, the sandwich-norm
// residual updates, fp32 -> bf16 hi/lo splitting for the prefill GEMMs, and the fused q/k norm + RoPE + cache
// write. One block per row (or per head), fp32 throughout, the Gemma 4 math as GEMMA4.md section 2 states it.
#include <algorithm>

#include "cuda/check.h"
#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"
#include "cuda/kernels/launch.h"

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

// The single-block row kernels are latency-bound (one block walks the row): loops are unrolled and the
// pointers __restrict__ so that several loads are in flight before the first use.
__device__ float row_inv_rms(const float* __restrict__ y, int H, float eps, float* red) {
    float ss = 0.0f;
#pragma unroll 4
    for (int k = threadIdx.x; k < H; k += blockDim.x) ss = fmaf(y[k], y[k], ss);
    ss = block_sum(ss, red);
    return 1.0f / sqrtf(ss / static_cast<float>(H) + eps);
}

__global__ void residual_kernel(float* __restrict__ x, const float* __restrict__ y,
                                const bf16* __restrict__ w, int H, float eps, float scale) {
    pdl_begin();
    __shared__ float red[32];
    const int64_t off = static_cast<int64_t>(blockIdx.x) * H;
    const float inv = row_inv_rms(y + off, H, eps, red);
#pragma unroll 4
    for (int k = threadIdx.x; k < H; k += blockDim.x) {
        const float v = y[off + k] * inv * bf16_at(w, k);
        x[off + k] = (x[off + k] + v) * scale;
    }
}

// The same update at one token by 1024 threads holding <= 6 elements each, their loads in one batch (the
// norm weights before the PDL wait): the kernel above walks H in dependent L2 round trips (31B: ~11 per
// pass). With next_w (one GPU: prenorm), it also writes the next GEMV's normalised input,
// xn = RMSNorm(x) * next_w, from the x it holds: that GEMV then reads one vector per 16 weight bytes instead
// of x, the norm weights and a sum of squares in every warp.
constexpr int kWideThreads = 1024;   // the one-token update kernels (this one, residual_moe_wide_kernel)
constexpr int kWideResidualPer = 6;  // H <= 6144

// rsqrt(mean(v^2) + eps) over the block's H values, thread t holding v[j] (value t + j * kWideThreads, 0
// past H)
template <int Per>
__device__ __forceinline__ float block_inv_rms(const float (&v)[Per], int H, float eps, float* red) {
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < Per; ++j) ss = fmaf(v[j], v[j], ss);
    ss = block_sum(ss, red);
    return 1.0f / sqrtf(ss / static_cast<float>(H) + eps);
}

// xn[k] = v * rsqrt(mean(v^2) + eps) * weight(j, k), laid out as block_inv_rms's: the next GEMV's normalised
// input, from the new x an update kernel holds.
template <int Per, class Weight>
__device__ __forceinline__ void store_normalised(const float (&v)[Per], int H, float eps, Weight weight,
                                                 float* red, float* xn) {
    const float inv = block_inv_rms(v, H, eps, red);
#pragma unroll
    for (int j = 0; j < Per; ++j) {
        const int k = threadIdx.x + j * kWideThreads;
        if (k < H) xn[k] = v[j] * inv * weight(j, k);
    }
}

__global__ void __launch_bounds__(kWideThreads)
    residual_wide_kernel(float* __restrict__ x, const float* __restrict__ y, const bf16* __restrict__ w,
                         int H, float eps, float scale, const bf16* __restrict__ next_w,
                         float* __restrict__ xn, NormCopies more) {
    __shared__ float red[32];
    // more's weights [2][H] in dynamic shared memory, staged before the wait (each thread reads back its own
    // elements); 0 bytes when there are no copies. (Static, the 24 KB came with every update of the dense
    // models too: E2B and E4B read 0.5% and 0.8% slower with it.)
    extern __shared__ bf16 mw[];
    float wv[kWideResidualPer], yv[kWideResidualPer], xv[kWideResidualPer], nv[kWideResidualPer];
#pragma unroll
    for (int j = 0; j < kWideResidualPer; ++j) {
        const int k = threadIdx.x + j * kWideThreads;
        wv[j] = k < H ? bf16_at(w, k) : 0.0f;
        nv[j] = next_w && k < H ? bf16_at(next_w, k) : 0.0f;
#pragma unroll
        for (int c = 0; c < 2; ++c)
            if (more.out[c] && k < H) mw[c * H + k] = more.w[c][k];
    }
    pdl_begin();
#pragma unroll
    for (int j = 0; j < kWideResidualPer; ++j) {
        const int k = threadIdx.x + j * kWideThreads;
        yv[j] = k < H ? y[k] : 0.0f;
        xv[j] = k < H ? x[k] : 0.0f;
    }
    const float inv = block_inv_rms(yv, H, eps, red);
#pragma unroll
    for (int j = 0; j < kWideResidualPer; ++j) {
        const int k = threadIdx.x + j * kWideThreads;
        xv[j] = (xv[j] + yv[j] * inv * wv[j]) * scale;  // 0 past H: xv, yv and wv are 0 there
        if (k < H) x[k] = xv[j];
    }
    if (!more.out[0]) {
        if (next_w)
            store_normalised(
                xv, H, eps, [&](int j, int) { return nv[j]; }, red, xn);
        return;
    }
    const float inv_x = block_inv_rms(xv, H, eps, red);  // store_normalised's factor, for every copy
#pragma unroll
    for (int j = 0; j < kWideResidualPer; ++j) {
        const int k = threadIdx.x + j * kWideThreads;
        if (k >= H) continue;
        const float v = xv[j] * inv_x;
        if (next_w) xn[k] = v * nv[j];
#pragma unroll
        for (int c = 0; c < 2; ++c)
            if (more.out[c]) more.out[c][k] = v * bf16_at(mw + c * H, k) * more.scale[c];
    }
}

// dynamic smem: 2*H floats (the expert sum, then the combined m')
__global__ void residual_moe_kernel(float* __restrict__ x, const float* __restrict__ m,
                                    const float* __restrict__ slots, const float* __restrict__ sel_w, int K,
                                    const bf16* __restrict__ w1, const bf16* __restrict__ w2,
                                    const bf16* __restrict__ w, int H, float eps, float scale) {
    pdl_begin();
    extern __shared__ float sm[];
    __shared__ float red[32];
    float* e = sm;
    float* mm = sm + H;
    const int t = blockIdx.x;
    const int64_t off = static_cast<int64_t>(t) * H;
#pragma unroll 2
    for (int k = threadIdx.x; k < H; k += blockDim.x) {
        float acc = 0.0f;
#pragma unroll 8
        for (int s = 0; s < K; ++s)
            acc += sel_w[t * K + s] * slots[(static_cast<int64_t>(t) * K + s) * H + k];
        e[k] = acc;
    }
    __syncthreads();
    const float inv_e = row_inv_rms(e, H, eps, red);
    const float inv_m = row_inv_rms(m + off, H, eps, red);
#pragma unroll 4
    for (int k = threadIdx.x; k < H; k += blockDim.x)
        mm[k] = m[off + k] * inv_m * bf16_at(w1, k) + e[k] * inv_e * bf16_at(w2, k);
    __syncthreads();
    const float inv = row_inv_rms(mm, H, eps, red);
#pragma unroll 4
    for (int k = threadIdx.x; k < H; k += blockDim.x)
        x[off + k] = (x[off + k] + mm[k] * inv * bf16_at(w, k)) * scale;
}

// The same update at one token (decode) by 1024 threads, each holding <= 3
// elements: the 256-thread kernel above walks H = 2816 in ~12 dependent L2 round trips (the profile's
// ffn_combine: ~18 us per layer on the 26B); here each thread issues its loads in three batches (slots and m,
// the norm weights, x). The expert sum adds the slots in the same order as above, so e is bit-identical; the
// norms' sums are in another order.
constexpr int kWideCombinePer = 3;  // H <= 3072
constexpr int kWideMaxK = 8;
static_assert(kWideThreads * kWideCombinePer == kMoeWideMaxHidden && kWideMaxK == kMoeWideMaxK);
// The three norm weights go to shared memory before the PDL wait and x joins the first batch of loads, so
// the update costs one dependent round trip instead of three (see qkv_post_kernel for the A/B).
__global__ void __launch_bounds__(kWideThreads)
    residual_moe_wide_kernel(float* __restrict__ x, const float* __restrict__ m,
                             const float* __restrict__ slots, const float* __restrict__ sel_w, int K,
                             const bf16* __restrict__ w1, const bf16* __restrict__ w2,
                             const bf16* __restrict__ w, int H, float eps, float scale,
                             const bf16* __restrict__ next_w, float* __restrict__ xn) {
    __shared__ float red[32];
    __shared__ bf16 sw1[kWideCombinePer * kWideThreads], sw2[kWideCombinePer * kWideThreads],
        sww[kWideCombinePer * kWideThreads], snw[kWideCombinePer * kWideThreads];
    __shared__ float sx[kWideCombinePer * kWideThreads];
    // each thread stages and reads back only its own elements: no barrier needed
#pragma unroll
    for (int j = 0; j < kWideCombinePer; ++j) {
        const int k = threadIdx.x + j * kWideThreads;
        if (k < H) {
            sw1[k] = w1[k];
            sw2[k] = w2[k];
            sww[k] = w[k];
            if (next_w) snw[k] = next_w[k];
        }
    }
    pdl_begin();
    float sw[kWideMaxK];
#pragma unroll
    for (int s = 0; s < kWideMaxK; ++s) sw[s] = s < K ? sel_w[s] : 0.0f;
    float e[kWideCombinePer], mv[kWideCombinePer];
    float se = 0.0f, sm = 0.0f;
#pragma unroll
    for (int j = 0; j < kWideCombinePer; ++j) {
        const int k = threadIdx.x + j * kWideThreads;
        const bool ok = k < H;
        float acc = 0.0f;
#pragma unroll
        for (int s = 0; s < kWideMaxK; ++s)
            if (s < K && ok) acc += sw[s] * slots[static_cast<int64_t>(s) * H + k];
        e[j] = acc;
        mv[j] = ok ? m[k] : 0.0f;
        se = fmaf(e[j], e[j], se);
        sm = fmaf(mv[j], mv[j], sm);
    }
#pragma unroll
    for (int j = 0; j < kWideCombinePer; ++j) {
        const int k = threadIdx.x + j * kWideThreads;
        if (k < H) sx[k] = x[k];
    }
    se = block_sum(se, red);
    sm = block_sum(sm, red);
    const float inv_e = 1.0f / sqrtf(se / static_cast<float>(H) + eps);
    const float inv_m = 1.0f / sqrtf(sm / static_cast<float>(H) + eps);
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kWideCombinePer; ++j) {
        const int k = threadIdx.x + j * kWideThreads;
        const bool ok = k < H;
        mv[j] = ok ? mv[j] * inv_m * bf16_at(sw1, k) + e[j] * inv_e * bf16_at(sw2, k) : 0.0f;
        ss = fmaf(mv[j], mv[j], ss);
    }
    ss = block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(H) + eps);
#pragma unroll
    for (int j = 0; j < kWideCombinePer; ++j) {
        const int k = threadIdx.x + j * kWideThreads;
        if (k < H) {
            mv[j] = (sx[k] + mv[j] * inv * bf16_at(sww, k)) * scale;  // the new x (0 past H)
            x[k] = mv[j];
        }
    }
    if (next_w)
        store_normalised(
            mv, H, eps, [&](int, int k) { return bf16_at(snw, k); }, red, xn);
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

__global__ void split_rows_kernel(const float* x, int64_t ld_in, int width, bool norm, const bf16* w,
                                  float eps, bf16* hi, bf16* lo) {
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
template <bool Batched>
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
    const int64_t slot_off = Batched ? static_cast<int64_t>(p.tok_slot[t]) * p.slot_stride : 0;
    const float* in;
    float* out;
    if (b < p.nH) {
        in = p.q + (static_cast<int64_t>(t) * p.nH + b) * d;
        out = p.q + (static_cast<int64_t>(t) * p.nH + b) * d;
    } else if (kv < p.nKV) {
        in = p.kraw + (static_cast<int64_t>(t) * p.nKV + kv) * d;
        out = p.k_cache + slot_off + ((pos % p.cap) * p.nKV + kv) * d;
    } else {
        const int g = kv - p.nKV;
        in = p.vraw + (static_cast<int64_t>(t) * p.nKV + g) * d;
        out = p.v_cache + slot_off + ((pos % p.cap) * p.nKV + g) * d;
    }
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
                out[j] = a * c - bb * sn;
                out[j + half] = bb * c + a * sn;
            }
        }
    } else {
        for (int j = threadIdx.x; j < d; j += kPostThreads) out[j] = buf[j];
    }
}

int row_threads(int width) {
    return width >= 2048 ? 512 : width >= 512 ? 256 : 128;
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

void residual_add_norm(float* x, const float* y, const bf16* w, int H, int n, float eps, float scale,
                       cudaStream_t s, const bf16* next_w, float* xn, const NormCopies& more) {
    if (more.out[1] && !more.out[0])
        throw Error("internal: the update's normalised copies fill slot 0 first");
    if (n == 1 && H <= kWideThreads * kWideResidualPer) {
        const size_t smem = more.out[0] ? 2 * static_cast<size_t>(H) * sizeof(bf16) : 0;  // <= 24 KB
        launch_kernel(residual_wide_kernel, dim3(1), dim3(kWideThreads), smem, s, x, y, w, H, eps, scale,
                      next_w, xn, more);
        CUDA_CHECK_LAUNCH();
        return;
    }
    if (next_w || more.out[0])
        throw Error("internal: the residual update writes a normalised copy at one token only");
    launch_kernel(residual_kernel, dim3(n), dim3(row_threads(H)), 0, s, x, y, w, H, eps, scale);
    CUDA_CHECK_LAUNCH();
}

void residual_moe_combine(float* x, const float* m, const float* slots, const float* sel_w, int K,
                          const bf16* w1, const bf16* w2, const bf16* w, int H, int n, float eps, float scale,
                          cudaStream_t s, bool wide, const bf16* next_w, float* xn) {
    if (wide && n == 1 && H <= kWideThreads * kWideCombinePer && K <= kWideMaxK) {
        launch_kernel(residual_moe_wide_kernel, dim3(1), dim3(kWideThreads), 0, s, x, m, slots, sel_w, K, w1,
                      w2, w, H, eps, scale, next_w, xn);
        CUDA_CHECK_LAUNCH();
        return;
    }
    if (next_w) throw Error("internal: the MoE combine writes a normalised copy in its wide form only");
    const size_t smem = 2 * static_cast<size_t>(H) * sizeof(float);
    if (smem > 48 * 1024) throw Error("internal: MoE combine needs hidden <= 6144");
    launch_kernel(residual_moe_kernel, dim3(n), dim3(row_threads(H)), smem, s, x, m, slots, sel_w, K, w1, w2,
                  w, H, eps, scale);
    CUDA_CHECK_LAUNCH();
}

void rmsnorm_rows(const float* x, const bf16* w, int H, int n, float eps, float* out, cudaStream_t s) {
    launch_kernel(rmsnorm_rows_kernel, dim3(n), dim3(row_threads(H)), 0, s, x, w, H, eps, out);
    CUDA_CHECK_LAUNCH();
}

void split_rows(const float* x, int64_t ld_in, int width, int n, bool norm, const bf16* w, float eps,
                bf16* hi, bf16* lo, cudaStream_t s) {
    launch_kernel(split_rows_kernel, dim3(n), dim3(row_threads(width)), 0, s, x, ld_in, width, norm, w, eps,
                  hi, lo);
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
    if (p.tok_pos)
        launch_kernel(qkv_post_kernel<true>, dim3(heads, n), dim3(kPostThreads), smem, s, p);
    else
        launch_kernel(qkv_post_kernel<false>, dim3(heads, n), dim3(kPostThreads), smem, s, p);
    CUDA_CHECK_LAUNCH();
}

}  // namespace markbase::cuda
