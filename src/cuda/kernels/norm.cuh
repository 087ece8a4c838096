// What norm_rope.cu and residual.cu share: a row's RMS factor by one block, and the block size of the row
// kernels. (In an unnamed namespace: each kernel file keeps its own copy, as when they were one file.)
#pragma once

#include "cuda/kernels/device_common.cuh"

namespace markbase::cuda {

namespace {

// The single-block row kernels are latency-bound (one block walks the row): loops are unrolled and the
// pointers __restrict__ so that several loads are in flight before the first use.
__device__ float row_inv_rms(const float* __restrict__ y, int H, float eps, float* red) {
    float ss = 0.0f;
#pragma unroll 4
    for (int k = threadIdx.x; k < H; k += blockDim.x) ss = fmaf(y[k], y[k], ss);
    ss = block_sum(ss, red);
    return 1.0f / sqrtf(ss / static_cast<float>(H) + eps);
}

int row_threads(int width) {
    return width >= 2048 ? 512 : width >= 512 ? 256 : 128;
}

}  // namespace

}  // namespace markbase::cuda
