// Int4 weights: compressed-tensors' W4A16 scheme ("pack-quantized", num_bits 4, type int, strategy group,
// group_size 128), as llm-compressor writes it and vLLM reads it. Each run of 128 weights along K has an
// fp32 scale and, when asymmetric, a zero point; the weights are 4-bit codes, held unsigned (0..15: the
// signed value -8..7 plus 8, compressed-tensors' packing offset), two to a byte with k even in the low
// nibble: W[r][k] = (code - zero) * scale, zero = 8 when symmetric. The int32 words of a checkpoint's
// weight_packed hold eight codes each, code i at bits 4i, so their little-endian bytes are this layout as
// they are.
#pragma once

#include <cstdint>

#include "model/bf16.h"

namespace markbase {

constexpr int64_t kInt4Group = 128;
constexpr uint8_t kInt4SymmetricZero = 8;  // the code of 0 where no zero point is stored

// Groups of a row of K weights; the last one is short where K is not a multiple of 128 (compressed-tensors
// allows that only for K < 128; such matrices are dequantised at load and have no int4 form).
constexpr int64_t int4_groups(int64_t K) {
    return (K + kInt4Group - 1) / kInt4Group;
}

// Code k of a row (k even: low nibble).
inline uint8_t int4_at(const uint8_t* q, int64_t k) {
    return static_cast<uint8_t>((q[k >> 1] >> ((k & 1) * 4)) & 0xf);
}
inline void int4_set(uint8_t* q, int64_t k, uint8_t code) {
    const int shift = static_cast<int>(k & 1) * 4;
    q[k >> 1] = static_cast<uint8_t>((q[k >> 1] & ~(0xf << shift)) | ((code & 0xf) << shift));
}

// A zero point of compressed-tensors' weight_zero_point, which packs the [rows, G] zero points along the
// output dimension: int32 word [r / 8][g] holds rows r..r+7 of group g, row r % 8 at bits 4 (r % 8), with the
// same +8 offset as the weights. `packed` is the tensor's bytes (little-endian, any alignment).
uint8_t int4_packed_zero_at(const uint8_t* packed, int64_t G, int64_t r, int64_t g);

// Quantises a row of K bf16 weights as compressed-tensors does for a bf16 model (a short last group where K
// is not a multiple of 128, which compressed-tensors allows for K < 128):
// torch computes every step in the weight's dtype, so each is rounded to bf16 as it is made.
//  - symmetric (zero null): scale = max |w| / 7.5, at least fp32 epsilon; code = round(clamp(w / scale,
//    -8, 7)) + 8.
//  - asymmetric: min and max widened to include 0, scale = (max - min) / 15 (at least epsilon), zero point
//    z = round(clamp(-8 - min / scale, -8, 7)); code = round(clamp(w / scale + z, -8, 7)) + 8, zero = z + 8.
// Round is half to even (torch.round). A group holding NaN or Inf gets a NaN scale (its values dequantise to
// NaN, which the loader reports). Writes q [ceil(K/2)], scale and, when not null, zero [int4_groups(K)].
void quantize_row_int4(const bf16* w, int64_t K, uint8_t* q, float* scale, uint8_t* zero);

// w[k] = bf16((code - zero) * scale): the exact product rounded once (16 values a group, made in double).
// zero null: symmetric (8). Any K: a short last group uses its own scale.
void dequantize_row_int4(const uint8_t* q, const float* scale, const uint8_t* zero, int64_t K, bf16* w);

// The double rounded to bf16 once, to nearest even (exact for any product of a code and an fp32 scale, whose
// 28 significant bits a double holds). Below 2^-126, where bf16 is subnormal, it may round twice.
bf16 double_to_bf16(double d);

}  // namespace markbase
