// Matrix products of the CPU backend: activations in fp32, weights in the checkpoint's bf16 (HF Linear
// layout, [out][in] row-major), accumulation in fp32.
//
// Two regimes (see matmul.cpp): n <= 4 streams each weight row once straight from bf16 (decode is a memory
// problem: rows are split over the threads in contiguous blocks), n > 4 converts blocks of weight rows to
// fp32 once and reuses them across tokens in a register-blocked 4x4 micro-kernel (prefill is a compute
// problem).
#pragma once

#include <cstdint>

#include "cpu/thread_pool.h"
#include "model/bf16.h"

namespace markbase::cpu {

// y[t][o] = sum_i x[t][i] * w[o][i]
//   x: fp32 [n][in], w: bf16 [out][in], y: fp32 [n][out]; all row-major and dense. y must not alias x.
void matmul_bf16(ThreadPool& pool, const float* x, int64_t n, int64_t in, const bf16* w, int64_t out,
                 float* y);

// The same for an fp32 weight [out][in].
void matmul_f32(ThreadPool& pool, const float* x, int64_t n, int64_t in, const float* w, int64_t out,
                float* y);

// sum_i a[i] * b[i], fp32 accumulation in several independent lanes.
float dot_f32(const float* a, const float* b, int64_t n);

// The SIMD path this build compiled in: "avx512", "avx2" or "scalar".
const char* matmul_simd_path();

// matmul_bf16 / matmul_f32 / dot_f32 on the portable scalar kernels, whatever SIMD the build has: the
// reference the SIMD paths are tested against, and the path of a build without AVX2.
void matmul_bf16_scalar(ThreadPool& pool, const float* x, int64_t n, int64_t in, const bf16* w, int64_t out,
                        float* y);
void matmul_f32_scalar(ThreadPool& pool, const float* x, int64_t n, int64_t in, const float* w, int64_t out,
                       float* y);
float dot_f32_scalar(const float* a, const float* b, int64_t n);

}  // namespace markbase::cpu
