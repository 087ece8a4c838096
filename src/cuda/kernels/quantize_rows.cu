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

// The rewrite's values again from the rows (a copy that was not kept: copy_weights_to_host, and the products
// of prompt chunks and batched steps over dense projections without their copy), by the same expressions:
// FP8 f32(e4m3) x scale; int4 f32(code - zero) x scale (zero 8 where none is stored), each rounded once to
// bf16. A block a row, a thread 8 weights at a time: 8 (FP8) or 4 (int4) bytes in, 16 out.
template <bool Int4>
__global__ void __launch_bounds__(kThreads)
    dequantize_rows_kernel(const uint8_t* q, const float* scale, const uint8_t* zero, int K, uint16_t* out) {
    const int64_t r = blockIdx.x;
    const int G = static_cast<int>(int4_groups(K));
    uint4* orow = reinterpret_cast<uint4*>(out + r * K);
    for (int v = threadIdx.x; v < K / 8; v += kThreads) {
        float f[8];
        if constexpr (Int4) {
            const uint32_t w = reinterpret_cast<const uint32_t*>(q + r * (K / 2))[v];
            const int64_t g = r * G + (8 * v) / kInt4Group;
            const int z = zero ? zero[g] : kInt4SymmetricZero;
            const float s = scale[g];
#pragma unroll
            for (int i = 0; i < 8; ++i)
                f[i] = static_cast<float>(static_cast<int>((w >> (4 * i)) & 0xfu) - z) * s;
        } else {
            const uint2 w = reinterpret_cast<const uint2*>(q + r * K)[v];
            const float s = scale[r];
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const uint32_t word = i < 4 ? w.x : w.y;
                const auto c = static_cast<__nv_fp8_storage_t>((word >> (8 * (i & 3))) & 0xffu);
                f[i] = __half2float(__half(__nv_cvt_fp8_to_halfraw(c, __NV_E4M3))) * s;
            }
        }
        uint32_t p[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
            p[i] = static_cast<uint32_t>(float_to_bf16_bits(f[2 * i])) |
                   (static_cast<uint32_t>(float_to_bf16_bits(f[2 * i + 1])) << 16);
        orow[v] = make_uint4(p[0], p[1], p[2], p[3]);
    }
}

}  // namespace

void dequantize_rows(const uint8_t* q, const float* scale, const uint8_t* zero, int64_t rows, int K,
                     bool int4, uint16_t* out, cudaStream_t s) {
    if (rows <= 0) return;
    if (K % 8)
        throw Error("internal: dequantize_rows takes rows of a multiple of 8 weights, not " +
                    std::to_string(K));
    if (rows > 0x7fffffff) throw Error("internal: dequantize_rows of " + std::to_string(rows) + " rows");
    if (int4)
        dequantize_rows_kernel<true><<<static_cast<unsigned>(rows), kThreads, 0, s>>>(q, scale, zero, K, out);
    else
        dequantize_rows_kernel<false>
            <<<static_cast<unsigned>(rows), kThreads, 0, s>>>(q, scale, zero, K, out);
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
