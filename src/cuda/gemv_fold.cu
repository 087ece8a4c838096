// A sandwich-norm residual update folded into the decode GEMV that consumes it (MARKBASE_CUDA_FOLD, one
// token). Session 14's SKIP runs put each of E2B's three residual launches per layer at 1.9 us inside the
// graph (0.2 ms of its 2.0 ms step) for ~20 KB of work: the cost is the launch boundary, not the update.
// Here the consumer computes the product straight from the stream before the update (x) and the producer's
// output (y), with no prologue and no extra launch:
//   x'  = (x + y * inv_y * w_res) * s,                inv_y  = rsqrt(mean(y^2) + eps)
//   out = W . (x' * inv_x' * w_n)                     inv_x' = rsqrt(mean(x'^2) + eps)   (consumer's norm)
//       = inv_x' * s * (W . (x * w_n) + inv_y * W . (y * w_res * w_n))
// so each warp streams its weight row once against two activation vectors (A = W . (x w_n), B = W . (y w_res
// w_n)) and also sums y^2, x^2, x . (y w_res) and (y w_res)^2 over the whole input, which give both scalars:
//   sum(x'^2) = s^2 (sum x^2 + 2 inv_y sum x (y w_res) + inv_y^2 sum (y w_res)^2).
// No barrier before the first product, no cross-block step: the block's warps split the sums between them
// and add them up through shared memory after their products. The new stream x' goes to another buffer (other blocks still read
// x), each block writing its share. Without a consumer norm (the PLE gate) out = s (A + inv_y B).
// Not bit-identical to the update launch (other sums in another order): the CUDA-vs-CPU tests bound it.
#include <string>

#include "cuda/check.h"
#include "cuda/device_common.cuh"
#include "cuda/kernels.h"
#include "cuda/launch.h"

namespace markbase::cuda {

namespace {

enum FoldMode { kFoldStore = 0, kFoldGeluMul = 1 };
constexpr int kFoldWarps = 8;
constexpr int kFoldU = 4;  // 16-byte weight chunks per lane in flight

struct FoldParams {
    GemvInput in;
    GemvSeg seg[3];
    int seg_end[3] = {0, 0, 0};
    int nseg = 0;
    int total_rows = 0;
    const float* aux = nullptr;  // kFoldGeluMul: the multiplier
};

template <int M, int W, bool Norm>
__global__ void __launch_bounds__(kFoldWarps * 32, Norm ? 3 : 4) fold_kernel(const FoldParams p) {
    static_assert(W == 1 || W == 2 || W == 4 || W == 8, "warps per row");
    constexpr int kGroups = kFoldWarps / W;  // row groups per block: W warps per row, one row each
    __shared__ float partial[kFoldWarps][6];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int group = warp / W, part = warp % W;
    const int row = blockIdx.x * kGroups + group;
    const bool active = row < p.total_rows;
    const int K = p.in.K, nchunk = K >> 3;
    const int per = (nchunk + W - 1) / W;
    const int c_lo = part * per, c_hi = min(nchunk, c_lo + per);  // this warp's chunks of the row
    int s = 0;
    while (s + 1 < p.nseg && row >= p.seg_end[s]) ++s;
    const int local = active ? row - (s ? p.seg_end[s - 1] : 0) : 0;
    const uint4* w = reinterpret_cast<const uint4*>(p.seg[s].w + static_cast<int64_t>(local) * K);

    uint4 v[kFoldU];
    auto load = [&](int base) {
#pragma unroll
        for (int u = 0; u < kFoldU; ++u) {
            const int c = base + u * 32 + lane;
            v[u] = active && c < c_hi ? ld_stream(w + c) : make_uint4(0, 0, 0, 0);
        }
    };
    pdl_begin_late(p.in.pdl_late);
    load(c_lo);                               // weights only: safe before the previous kernel has finished
    pdl_begin_after_loads(K, p.in.pdl_late);  // from here on x and y may be read

    const float4* x4 = reinterpret_cast<const float4*>(p.in.x);
    const float4* y4 = reinterpret_cast<const float4*>(p.in.fold.y);
    const uint4* r4 = reinterpret_cast<const uint4*>(p.in.fold.w);
    const uint4* n4 = reinterpret_cast<const uint4*>(p.in.norm_w);
    // A, B (this row's), then sum y^2, sum x^2, sum x (y w_res), sum (y w_res)^2 (the last three for the
    // consumer's norm only). The sums do not depend on the row, so each 32-chunk round of the input is summed
    // by one row group of the block only (round j by group j % kGroups: the block's warps cover the input
    // once), which keeps the extra arithmetic at 1/kGroups per warp; the block adds them up at the end.
    float acc[6] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int round = 0;
    for (int base = c_lo; base < c_hi; base += 32 * kFoldU) {
        if (base != c_lo) load(base);
#pragma unroll
        for (int u = 0; u < kFoldU; ++u, ++round) {
            const int c = base + u * 32 + lane;
            const bool sums = round % kGroups == group;  // the same for the whole warp
            if (c < c_hi) {  // inactive warps still sum x and y: their share of the block's sums
                float4 xa = __ldg(x4 + 2 * c), xb = __ldg(x4 + 2 * c + 1);
                float4 ya = __ldg(y4 + 2 * c), yb = __ldg(y4 + 2 * c + 1);
                if (sums) acc[2] = sq8(ya, yb, acc[2]);
                scale8(ya, yb, __ldg(r4 + c));  // y * w_res
                if constexpr (Norm) {
                    if (sums) {
                        acc[3] = sq8(xa, xb, acc[3]);
                        acc[4] += xa.x * ya.x + xa.y * ya.y + xa.z * ya.z + xa.w * ya.w + xb.x * yb.x +
                                  xb.y * yb.y + xb.z * yb.z + xb.w * yb.w;
                        acc[5] = sq8(ya, yb, acc[5]);
                    }
                    if (n4) {
                        const uint4 n = __ldg(n4 + c);
                        scale8(xa, xb, n);
                        scale8(ya, yb, n);
                    }
                }
                acc[0] += dot8(v[u], xa, xb);
                acc[1] += dot8(v[u], ya, yb);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 6; ++i) acc[i] = warp_sum(acc[i]);
    // fixed-order totals (so the result does not depend on timing): A and B over the row's W warps, the
    // sums over all of the block's warps
    if (lane == 0) {
#pragma unroll
        for (int i = 0; i < 6; ++i) partial[warp][i] = acc[i];
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        float t = 0.0f;
#pragma unroll
        for (int j = 0; j < W; ++j) t += partial[group * W + j][i];
        acc[i] = t;
    }
#pragma unroll
    for (int i = 2; i < 6; ++i) {
        float t = 0.0f;
#pragma unroll
        for (int j = 0; j < kFoldWarps; ++j) t += partial[j][i];
        acc[i] = t;
    }

    const float Kf = static_cast<float>(K), sc = p.in.fold.scale;
    const float inv_y = 1.0f / sqrtf(acc[2] / Kf + p.in.eps);
    float out = sc * (acc[0] + inv_y * acc[1]);
    if constexpr (Norm) {
        const float ss = sc * sc * (acc[3] + 2.0f * inv_y * acc[4] + inv_y * inv_y * acc[5]);
        out *= 1.0f / sqrtf(ss / Kf + p.in.eps) * p.in.norm_scale;
    }
    if (lane == 0 && part == 0 && active) {
        float* y = p.seg[s].y + local;
        if constexpr (M == kFoldStore)
            *y = out;
        else
            *y = gelu_tanh(out) * p.aux[row];
    }

    // x' = (x + y * inv_y * w_res) * s for this block's share of the elements
    const int share = (K + static_cast<int>(gridDim.x) - 1) / static_cast<int>(gridDim.x);
    const int k0 = static_cast<int>(blockIdx.x) * share, k1 = min(K, k0 + share);
    for (int k = k0 + static_cast<int>(threadIdx.x); k < k1; k += blockDim.x)
        p.in.fold.x_out[k] = (p.in.x[k] + p.in.fold.y[k] * inv_y * bf16_at(p.in.fold.w, k)) * sc;
}

// Warps per row: the fewest (a power of 2, at most 8) that keep a warp's share of the row within two rounds
// of kFoldU chunks per lane (K = 1536: 1; 2560: 2; 5376: 4).
int fold_warps(int K) {
    const int nchunk = K / 8;
    int w = 1;
    while (w < 8 && (nchunk + w - 1) / w > 2 * 32 * kFoldU) w *= 2;
    return w;
}

template <int M, bool Norm>
void launch_fold_norm(FoldParams& p, int W, cudaStream_t s) {
    const unsigned blocks = static_cast<unsigned>((int64_t{p.total_rows} * W + kFoldWarps - 1) / kFoldWarps);
    const dim3 grid(blocks), block(kFoldWarps * 32);
    switch (W) {
        case 1: launch_kernel(fold_kernel<M, 1, Norm>, grid, block, 0, s, p); break;
        case 2: launch_kernel(fold_kernel<M, 2, Norm>, grid, block, 0, s, p); break;
        case 4: launch_kernel(fold_kernel<M, 4, Norm>, grid, block, 0, s, p); break;
        default: launch_kernel(fold_kernel<M, 8, Norm>, grid, block, 0, s, p); break;
    }
    CUDA_CHECK_LAUNCH();
}

void check_fold_aligned(const void* p, const char* what) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
        throw Error(std::string("internal: ") + what + " of a folded GEMV is not 16-byte aligned");
}

template <int M>
void launch_fold(FoldParams& p, cudaStream_t s) {
    const GemvInput& in = p.in;
    if (in.K <= 0 || in.K % 8 != 0)  // (K > 0: the kernel's PDL wait is behind a branch on it)
        throw Error("internal: folded GEMV input width " + std::to_string(in.K) +
                    " is not a positive multiple of 8");
    if (!in.x || !in.fold.y || !in.fold.w || !in.fold.x_out)
        throw Error("internal: a folded GEMV needs x, y, the update's norm weight and an output for x'");
    if (in.fold.x_out == in.x || in.fold.x_out == in.fold.y)
        throw Error("internal: a folded GEMV writes x' to a buffer it does not read");
    if (in.res_y) throw Error("internal: a folded GEMV takes no residual prologue");
    check_fold_aligned(in.x, "the input x");
    check_fold_aligned(in.fold.y, "the update's y");
    check_fold_aligned(in.fold.w, "the update's norm weight");
    if (in.norm_w) check_fold_aligned(in.norm_w, "the input norm weight");
    p.total_rows = 0;
    for (int i = 0; i < p.nseg; ++i) {
        check_fold_aligned(p.seg[i].w, "a weight matrix");
        p.seg_end[i] = (p.total_rows += p.seg[i].rows);
    }
    if (p.total_rows == 0) return;
    const int W = fold_warps(in.K);
    if (in.norm)
        launch_fold_norm<M, true>(p, W, s);
    else
        launch_fold_norm<M, false>(p, W, s);
}

}  // namespace

void gemv_fold(const GemvInput& in, const GemvSeg* segs, int nseg, cudaStream_t s) {
    if (nseg < 1 || nseg > 3) throw Error("internal: a folded GEMV takes 1-3 output segments");
    FoldParams p;
    p.in = in;
    p.nseg = nseg;
    for (int i = 0; i < nseg; ++i) p.seg[i] = segs[i];
    launch_fold<kFoldStore>(p, s);
}

void gemv_fold_gelu_mul(const GemvInput& in, const bf16* w, int rows, const float* aux, float* y,
                        cudaStream_t s) {
    FoldParams p;
    p.in = in;
    p.nseg = 1;
    p.seg[0] = {w, y, rows, 0};
    p.aux = aux;
    launch_fold<kFoldGeluMul>(p, s);
}

}  // namespace markbase::cuda
