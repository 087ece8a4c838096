// Dense products of FP8 rows (e4m3, a scale per row) on moe_gemm.cu's tiles, for a batched step's
// projections with FP8 weights: blocks of 128 weight rows x 32 input rows, the inputs one f16 of x / 16
// (f16_rows), no hi/lo halves. The experts' entry points are in kernels.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "model/weights.h"

namespace markbase::cuda {

// The kernels' shared-memory limits, once, before any graph capture (CudaModel's set-up).
void moe_gemm_prepare();

bool fp8_gemm_fits(int N, int K);   // N % 128 == 0, K % 64 == 0
bool fp8_geglu_fits(int I, int K);  // I % 64 == 0, K % 64 == 0
// y[t][0, N) (row stride ldy) = the FP8 rows w [N][K] against input row t of x16 [n][K], scaled.
void fp8_gemm(const uint16_t* x16, int K, int n, const QuantMatrix& w, int N, float* y, int64_t ldy,
              cudaStream_t s);
// h16[t][0, I) = f16(gelu(gate . x_t) * (up . x_t) / 16): the input of the down product's fp8_gemm.
void fp8_geglu(const uint16_t* x16, int K, int n, const QuantMatrix& gate, const QuantMatrix& up, int I,
               uint16_t* h16, cudaStream_t s);

}  // namespace markbase::cuda
