// A GEMV block's input staged in shared memory, shared by gemv.cu's staged kernels and gemv_rows.cu's
// prologue launches (MARKBASE_CUDA_GEMV_PROLOGUE).
#pragma once

#include "cuda/device_common.cuh"
#include "cuda/kernels.h"

namespace markbase::cuda {

// xs[0, K) = x, or the pending residual update x' = (res_x + RMSNorm(res_y) * res_w) * res_scale (block (0,
// 0) also stores x' to res_out, never to res_x: other blocks are still reading it); then, with in.norm, xs =
// RMSNorm(xs) * norm_w * norm_scale. Each thread reads back only its own elements until the last barrier, so
// the update and its sum of squares share a pass. red: 32 floats of shared scratch.
inline __device__ void stage_input(const GemvInput& in, const float* x, float* xs, float* red) {
    const int K = in.K, T = blockDim.x;
    float ss = 0.0f;
    if (in.res_y) {
#pragma unroll 4
        for (int k = threadIdx.x; k < K; k += T) {
            const float y = in.res_y[k];
            xs[k] = y;
            ss = fmaf(y, y, ss);
        }
        ss = block_sum(ss, red);
        const float inv_y = 1.0f / sqrtf(ss / static_cast<float>(K) + in.eps);
        const bool writer = blockIdx.x == 0 && blockIdx.y == 0;
        ss = 0.0f;
#pragma unroll 4
        for (int k = threadIdx.x; k < K; k += T) {
            const float v = (in.res_x[k] + xs[k] * inv_y * bf16_at(in.res_w, k)) * in.res_scale;
            xs[k] = v;
            ss = fmaf(v, v, ss);
            if (writer) in.res_out[k] = v;
        }
    } else {
#pragma unroll 4
        for (int k = threadIdx.x; k < K; k += T) {
            const float v = x[k];
            xs[k] = v;
            ss = fmaf(v, v, ss);
        }
    }
    if (in.norm) {
        ss = block_sum(ss, red);
        const float inv = 1.0f / sqrtf(ss / static_cast<float>(K) + in.eps);
        for (int k = threadIdx.x; k < K; k += T) {
            float v = xs[k] * inv;
            if (in.norm_w) v *= bf16_at(in.norm_w, k);
            if (in.norm_scale != 1.0f) v *= in.norm_scale;
            xs[k] = v;
        }
    }
    __syncthreads();
}

}  // namespace markbase::cuda
