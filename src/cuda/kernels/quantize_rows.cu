// Weights quantised on the device, each row's bf16 then rewritten as the quantised values rounded to bf16, so
// that the paths reading bf16 (prefill, batched steps) compute the model the quantised decode step computes.
// For random weights drawn on the GPU (bench at real widths); a checkpoint's quantised weights come from the
// host (loading/).
//  - FP8 (model/fp8.h's rule, bit for bit): a scale per row, max |w| / 448, each weight rounded to the
//    nearest e4m3 (ties to even, saturating).
//  - int4 (model/int4.h's symmetric rule): a scale per group of 128 along K, max |w| / 7.5 (1 for an
//    all-zero group), q = clamp(round-to-even(w / scale), -8, 7), stored as q + 8 in a nibble (k even in
//    the low one).
#include <cuda_fp8.h>

#include <algorithm>
#include <string>

#include "cuda/check.h"
#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"
#include "model/int4.h"

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

// int4: a warp per group of 128 (the row's last may be short), 4 weights a lane.
__global__ void __launch_bounds__(kThreads)
    quantize_int4_kernel(uint16_t* w, int K, uint8_t* q, float* scale) {
    const int G = static_cast<int>(int4_groups(K)), lane = threadIdx.x & 31;
    uint16_t* row = w + static_cast<int64_t>(blockIdx.x) * K;
    uint8_t* qrow = q + static_cast<int64_t>(blockIdx.x) * (K / 2);
    for (int g = threadIdx.x >> 5; g < G; g += kThreads / 32) {
        const int k0 = g * 128 + 4 * lane;
        float v[4];
        float m = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            v[i] = k0 + i < K ? bf16_at(row, k0 + i) : 0.0f;
            m = fmaxf(m, fabsf(v[i]));
        }
        m = warp_max(m);
        const float s = m > 0.0f ? m / 7.5f : 1.0f;
        if (lane == 0) scale[static_cast<int64_t>(blockIdx.x) * G + g] = s;
        if (k0 >= K) continue;
        uint32_t u[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float r = fminf(fmaxf(rintf(v[i] / s), -8.0f), 7.0f);
            u[i] = static_cast<uint32_t>(static_cast<int>(r) + 8);
            row[k0 + i] = float_to_bf16_bits(r * s);
        }
        qrow[k0 / 2] = static_cast<uint8_t>(u[0] | (u[1] << 4));
        qrow[k0 / 2 + 1] = static_cast<uint8_t>(u[2] | (u[3] << 4));
    }
}

// The rewrite's values again from the rows (a copy that was freed, for the host: copy_weights_to_host), by
// the same expressions: FP8 f32(e4m3) x scale; int4 f32(code - zero) x scale (zero 8 where none is stored),
// each rounded once to bf16. A thread a weight.
__global__ void __launch_bounds__(kThreads)
    dequantize_rows_kernel(const uint8_t* q, const float* scale, const uint8_t* zero, int64_t rows, int K,
                           bool int4, uint16_t* out) {
    const int64_t n = rows * K;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * kThreads) {
        const int64_t r = i / K;
        const int k = static_cast<int>(i - r * K);
        float v;
        if (int4) {
            const int64_t G = int4_groups(K), g = r * G + k / kInt4Group;
            const uint8_t b = q[r * (K / 2) + k / 2];
            const int code = (k & 1) ? b >> 4 : b & 0xf;
            const int z = zero ? zero[g] : kInt4SymmetricZero;
            v = static_cast<float>(code - z) * scale[g];
        } else {
            const __half_raw h = __nv_cvt_fp8_to_halfraw(q[i], __NV_E4M3);
            v = __half2float(__half(h)) * scale[r];
        }
        out[i] = float_to_bf16_bits(v);
    }
}

}  // namespace

void dequantize_rows(const uint8_t* q, const float* scale, const uint8_t* zero, int64_t rows, int K,
                     bool int4, uint16_t* out, cudaStream_t s) {
    if (rows <= 0) return;
    if (int4 && K % 2) throw Error("internal: int4 rows of an odd width " + std::to_string(K));
    const int64_t blocks = std::min<int64_t>((rows * K + kThreads - 1) / kThreads, 65536);
    dequantize_rows_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(q, scale, zero, rows, K, int4,
                                                                              out);
    CUDA_CHECK_LAUNCH();
}

void quantize_rows_fp8(uint16_t* w, int64_t rows, int K, uint8_t* q, float* scale, cudaStream_t s) {
    if (rows <= 0) return;
    quantize_rows_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(w, K, q, scale);
    CUDA_CHECK_LAUNCH();
}

void quantize_rows_int4(uint16_t* w, int64_t rows, int K, uint8_t* q, float* scale, cudaStream_t s) {
    if (rows <= 0) return;
    if (K % 64) throw Error("internal: int4 rows take multiples of 64 weights, not " + std::to_string(K));
    quantize_int4_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(w, K, q, scale);
    CUDA_CHECK_LAUNCH();
}

}  // namespace markbase::cuda
