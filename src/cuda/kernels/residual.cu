// The sandwich-norm residual updates: x = (x + RMSNorm(y) * w) * scale over n rows, the one-token wide form
// that also writes the next GEMV's normalised input (and, on the MoE, the router's and the experts'), and
// the MoE's combine of the dense MLP with the experts' weighted sum. One block per row, fp32 throughout.
#include <algorithm>

#include "cuda/check.h"
#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"
#include "cuda/kernels/launch.h"
#include "cuda/kernels/norm.cuh"

namespace markbase::cuda {

namespace {

// The next product's bf16 input from the row an update has just written (RowSplit): the values split_rows
// writes from that row, bit for bit (ss is the row's sum of squares each thread took in split_rows' order,
// the block of split_rows' size), so the product after the update needs no launch of its own.
__device__ __forceinline__ void split_row(const float* __restrict__ xr, int H, float ss, float eps,
                                          const RowSplit& sp, int64_t o, float* red) {
    float inv = 1.0f;
    if (sp.norm) inv = 1.0f / sqrtf(block_sum(ss, red) / static_cast<float>(H) + eps);
    for (int k = threadIdx.x; k < H; k += blockDim.x) {
        float v = xr[k];  // this thread's own store
        if (sp.norm) {
            v *= inv;
            if (sp.w) v *= bf16_at(sp.w, k);
        }
        split_store(v, sp.hi, sp.lo, o + k);
    }
}

// Split: the update also writes the next product's input (split_row).
template <bool Split>
__global__ void residual_kernel(float* __restrict__ x, const float* __restrict__ y,
                                const bf16* __restrict__ w, int H, float eps, float scale, RowSplit sp) {
    pdl_begin();
    __shared__ float red[32];
    const int64_t off = static_cast<int64_t>(blockIdx.x) * H;
    const float inv = row_inv_rms(y + off, H, eps, red);
    float ss = 0.0f;
#pragma unroll 4
    for (int k = threadIdx.x; k < H; k += blockDim.x) {
        const float v = y[off + k] * inv * bf16_at(w, k);
        const float nx = (x[off + k] + v) * scale;
        x[off + k] = nx;
        if constexpr (Split) ss = fmaf(nx, nx, ss);
    }
    if constexpr (Split) split_row(x + off, H, ss, eps, sp, off, red);
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

// dynamic smem: 2*H floats (the expert sum, then the combined m'). Split: as residual_kernel's.
template <bool Split>
__global__ void residual_moe_kernel(float* __restrict__ x, const float* __restrict__ m,
                                    const float* __restrict__ slots, const float* __restrict__ sel_w, int K,
                                    const bf16* __restrict__ w1, const bf16* __restrict__ w2,
                                    const bf16* __restrict__ w, int H, float eps, float scale, RowSplit sp) {
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
    float ss = 0.0f;
#pragma unroll 4
    for (int k = threadIdx.x; k < H; k += blockDim.x) {
        const float nx = (x[off + k] + mm[k] * inv * bf16_at(w, k)) * scale;
        x[off + k] = nx;
        if constexpr (Split) ss = fmaf(nx, nx, ss);
    }
    if constexpr (Split) split_row(x + off, H, ss, eps, sp, off, red);
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

}  // namespace

void residual_add_norm(float* x, const float* y, const bf16* w, int H, int n, float eps, float scale,
                       cudaStream_t s, const bf16* next_w, float* xn, const NormCopies& more,
                       const RowSplit& split) {
    if (more.out[1] && !more.out[0])
        throw Error("internal: the update's normalised copies fill slot 0 first");
    if (n == 1 && !split.hi && H <= kWideThreads * kWideResidualPer) {
        const size_t smem = more.out[0] ? 2 * static_cast<size_t>(H) * sizeof(bf16) : 0;  // <= 24 KB
        launch_kernel(residual_wide_kernel, dim3(1), dim3(kWideThreads), smem, s, x, y, w, H, eps, scale,
                      next_w, xn, more);
        CUDA_CHECK_LAUNCH();
        return;
    }
    if (next_w || more.out[0])
        throw Error("internal: the residual update writes a normalised copy at one token only");
    if (split.hi)
        launch_kernel(residual_kernel<true>, dim3(n), dim3(row_threads(H)), 0, s, x, y, w, H, eps, scale,
                      split);
    else
        launch_kernel(residual_kernel<false>, dim3(n), dim3(row_threads(H)), 0, s, x, y, w, H, eps, scale,
                      split);
    CUDA_CHECK_LAUNCH();
}

void residual_moe_combine(float* x, const float* m, const float* slots, const float* sel_w, int K,
                          const bf16* w1, const bf16* w2, const bf16* w, int H, int n, float eps, float scale,
                          cudaStream_t s, bool wide, const bf16* next_w, float* xn, const RowSplit& split) {
    if (wide && !split.hi && n == 1 && H <= kWideThreads * kWideCombinePer && K <= kWideMaxK) {
        launch_kernel(residual_moe_wide_kernel, dim3(1), dim3(kWideThreads), 0, s, x, m, slots, sel_w, K, w1,
                      w2, w, H, eps, scale, next_w, xn);
        CUDA_CHECK_LAUNCH();
        return;
    }
    if (next_w) throw Error("internal: the MoE combine writes a normalised copy in its wide form only");
    const size_t smem = 2 * static_cast<size_t>(H) * sizeof(float);
    if (smem > 48 * 1024) throw Error("internal: MoE combine needs hidden <= 6144");
    if (split.hi)
        launch_kernel(residual_moe_kernel<true>, dim3(n), dim3(row_threads(H)), smem, s, x, m, slots, sel_w,
                      K, w1, w2, w, H, eps, scale, split);
    else
        launch_kernel(residual_moe_kernel<false>, dim3(n), dim3(row_threads(H)), smem, s, x, m, slots, sel_w,
                      K, w1, w2, w, H, eps, scale, split);
    CUDA_CHECK_LAUNCH();
}

}  // namespace markbase::cuda
