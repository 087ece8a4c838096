#include "model/int4.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cfloat>
#include <cmath>

namespace markbase {

namespace {

// The signed range of 4-bit ints (compressed-tensors' calculate_range: -2^3 .. 2^3 - 1).
constexpr float kMin = -8.0f, kMax = 7.0f;

// torch on bf16 tensors: the operation in fp32, the result rounded to bf16 (nearest even).
float bf(float x) {
    return round_to_bf16(x);
}

// calculate_qparams clamps scales to fp32's epsilon (2^-23, exact in bf16), so an all-zero group gets a
// tiny scale and codes of 0 rather than a division by zero.
float clamp_scale(float s) {
    return std::max(s, FLT_EPSILON);
}

// _quantize: clamp, then torch.round (half to even under the default rounding mode), offset by 8 to pack.
uint8_t code_of(float scaled) {
    return static_cast<uint8_t>(static_cast<int>(std::nearbyint(std::clamp(scaled, kMin, kMax))) + 8);
}

void quantize_group(const bf16* w, int64_t n, uint8_t* q, int64_t k0, float* scale, uint8_t* zero) {
    float lo = 0.0f, hi = 0.0f;  // min and max widened to include 0, as calculate_qparams does
    bool finite = true;
    for (int64_t k = 0; k < n; ++k) {
        const float v = bf16_to_float(w[k]);
        finite = finite && std::isfinite(v);
        lo = std::min(lo, v);
        hi = std::max(hi, v);
    }
    if (!finite) {
        *scale = NAN;
        if (zero) *zero = kInt4SymmetricZero;
        for (int64_t k = 0; k < n; ++k) int4_set(q, k0 + k, kInt4SymmetricZero);
        return;
    }
    float z = 0.0f;
    float s = 0.0f;
    if (!zero) {
        s = clamp_scale(bf(std::max(-lo, hi) / 7.5f));  // max |w| over half the range of 15 steps
    } else {
        s = clamp_scale(bf(bf(hi - lo) / 15.0f));
        z = std::nearbyint(std::clamp(bf(kMin - bf(lo / s)), kMin, kMax));
        *zero = static_cast<uint8_t>(static_cast<int>(z) + 8);
    }
    *scale = s;
    for (int64_t k = 0; k < n; ++k) {
        float x = bf(bf16_to_float(w[k]) / s);
        if (zero) x = bf(x + z);
        int4_set(q, k0 + k, code_of(x));
    }
}

}  // namespace

uint8_t int4_packed_zero_at(const uint8_t* packed, int64_t G, int64_t r, int64_t g) {
    const uint8_t* word = packed + 4 * ((r / 8) * G + g);
    const uint32_t v = static_cast<uint32_t>(word[0]) | static_cast<uint32_t>(word[1]) << 8 |
                       static_cast<uint32_t>(word[2]) << 16 | static_cast<uint32_t>(word[3]) << 24;
    return static_cast<uint8_t>((v >> (4 * (r % 8))) & 0xf);
}

void quantize_row_int4(const bf16* w, int64_t K, uint8_t* q, float* scale, uint8_t* zero) {
    for (int64_t g = 0; g * kInt4Group < K; ++g) {
        const int64_t k0 = g * kInt4Group;
        quantize_group(w + k0, std::min(kInt4Group, K - k0), q, k0, scale + g, zero ? zero + g : nullptr);
    }
}

void dequantize_row_int4(const uint8_t* q, const float* scale, const uint8_t* zero, int64_t K, bf16* w) {
    std::array<bf16, 16> value{};
    for (int64_t g = 0; g * kInt4Group < K; ++g) {
        const int z = zero ? zero[g] : kInt4SymmetricZero;
        for (int c = 0; c < 16; ++c)
            value[static_cast<size_t>(c)] = double_to_bf16(static_cast<double>(c - z) * scale[g]);
        const int64_t end = std::min(K, (g + 1) * kInt4Group);
        for (int64_t k = g * kInt4Group; k < end; ++k) w[k] = value[int4_at(q, k)];
    }
}

bf16 double_to_bf16(double d) {
    if (!std::isfinite(d)) return float_to_bf16(static_cast<float>(d));
    // Round the 52-bit significand to bf16's 7 in the double (half to even: the carry may move into the
    // exponent, as it should); the value then converts to float and to bf16 without rounding again.
    constexpr int kDrop = 52 - 7;
    uint64_t b = std::bit_cast<uint64_t>(d);
    b += (uint64_t{1} << (kDrop - 1)) - 1 + ((b >> kDrop) & 1);
    b &= ~((uint64_t{1} << kDrop) - 1);
    const double r = std::bit_cast<double>(b);
    if (std::fabs(r) > FLT_MAX) return std::signbit(r) ? bf16{0xff80} : bf16{0x7f80};  // past bf16's range
    return float_to_bf16(static_cast<float>(r));
}

}  // namespace markbase
