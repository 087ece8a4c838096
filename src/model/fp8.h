// FP8 weights: float8 e4m3fn (1 sign bit, 4 exponent bits with bias 7, 3 mantissa bits; no infinities, the
// one NaN pattern per sign 0x7f/0xff, largest finite 448) with one fp32 scale per output row, as the
// compressed-tensors FP8 checkpoints store them (strategy "channel"; a "tensor" scale is the same scale on
// every row): W[r][k] = decode(q[r][k]) * scale[r].
#pragma once

#include <cstdint>

#include "model/bf16.h"

namespace markbase {

constexpr float kFp8Max = 448.0f;

// Exact: every e4m3 value is a float. 0x7f and 0xff decode to NaN.
float fp8_e4m3_to_float(uint8_t v);

// Round to nearest even, saturating at +-448 (what compressed-tensors does: clamp, then cast); NaN -> 0x7f.
uint8_t float_to_fp8_e4m3(float f);

// Quantises one row of K bf16 weights: scale = max|w| / 448 (1 for an all-zero row), q = e4m3(w / scale).
// Returns the scale.
float quantize_row_fp8(const bf16* w, int64_t K, uint8_t* q);

// w[k] = bf16(decode(q[k]) * scale): the bf16 view of an FP8 row (the CPU backend's weights, and the
// prefill's on the GPU) rounds the exact product once.
void dequantize_row_fp8(const uint8_t* q, float scale, int64_t K, bf16* w);

}  // namespace markbase
