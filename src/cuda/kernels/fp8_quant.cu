// Weights to FP8 on the device (model/fp8.h's rule, bit for bit): a scale per row, max |w| / 448, each weight
// rounded to the nearest e4m3 (ties to even, saturating), and the row's bf16 rewritten as the FP8 value times
// its scale rounded to bf16, so that the paths reading bf16 (prefill, batched steps) compute the model the
// FP8 decode step computes. For random weights drawn on the GPU (bench at real widths); a checkpoint's FP8
// weights come from the host (loading/).
#include <cuda_fp8.h>

#include "cuda/check.h"
#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"

namespace markbase::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    quantize_rows_kernel(uint16_t* w, int K, uint8_t* q, float* scale) {
    __shared__ float part[kThreads / 32];
    uint16_t* row = w + static_cast<int64_t>(blockIdx.x) * K;
    uint8_t* qrow = q + static_cast<int64_t>(blockIdx.x) * K;
    float m = 0.0f;
    for (int k = threadIdx.x; k < K; k += kThreads) m = fmaxf(m, fabsf(bf16_at(row, k)));
    m = warp_max(m);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = m;
    __syncthreads();
    m = 0.0f;
#pragma unroll
    for (int i = 0; i < kThreads / 32; ++i) m = fmaxf(m, part[i]);
    const float s = m > 0.0f ? m / 448.0f : 1.0f;
    for (int k = threadIdx.x; k < K; k += kThreads) {
        const __nv_fp8_storage_t c = __nv_cvt_float_to_fp8(bf16_at(row, k) / s, __NV_SATFINITE, __NV_E4M3);
        qrow[k] = c;
        const __half_raw h = __nv_cvt_fp8_to_halfraw(c, __NV_E4M3);
        row[k] = float_to_bf16_bits(__half2float(__half(h)) * s);
    }
    if (threadIdx.x == 0) scale[blockIdx.x] = s;
}

}  // namespace

void quantize_rows_fp8(uint16_t* w, int64_t rows, int K, uint8_t* q, float* scale, cudaStream_t s) {
    if (rows <= 0) return;
    quantize_rows_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(w, K, q, scale);
    CUDA_CHECK_LAUNCH();
}

}  // namespace markbase::cuda
