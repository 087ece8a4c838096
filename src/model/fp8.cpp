#include "model/fp8.h"

#include <array>
#include <bit>
#include <cmath>

namespace markbase {

namespace {

// Every code's value, built once: the loader decodes billions of weights (a 31B checkpoint holds 30 G).
std::array<float, 256> decode_table() {
    std::array<float, 256> t{};
    for (int v = 0; v < 256; ++v) {
        const int sign = v >> 7, exp = (v >> 3) & 0xf, man = v & 7;
        // subnormals: man / 8 * 2^-6; normals: (1 + man / 8) * 2^(exp - 7)
        const float mag = exp == 0 ? std::ldexp(static_cast<float>(man), -9)
                                   : std::ldexp(static_cast<float>(8 + man), exp - 10);
        t[v] = exp == 0xf && man == 7 ? NAN : sign ? -mag : mag;
    }
    return t;
}

const std::array<float, 256>& table() {
    static const std::array<float, 256> t = decode_table();
    return t;
}

}  // namespace

float fp8_e4m3_to_float(uint8_t v) {
    return table()[v];
}

uint8_t float_to_fp8_e4m3(float f) {
    uint32_t bits = std::bit_cast<uint32_t>(f);
    const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80);
    bits &= 0x7fffffffu;
    if (bits > 0x7f800000u) return 0x7f;          // NaN
    if (bits >= 0x43e00000u) return sign | 0x7e;  // >= 448 (and inf): saturate
    if (bits < 0x3c800000u) {                     // below 2^-6: subnormal codes, units of 2^-9
        const float units =
            std::nearbyint(std::bit_cast<float>(bits) * 512.0f);  // exact scaling, ties to even
        return sign | static_cast<uint8_t>(units);                // 8 units is code 0x08, the smallest normal
    }
    // Normals: round the float's 23 mantissa bits to e4m3's 3, half to even; a carry moves into the exponent
    // as it should. Then (exponent << 3 | mantissa) rebiased from 127 to 7 is the code.
    bits += 0x7ffffu + ((bits >> 20) & 1u);
    const uint32_t code = (bits >> 20) - ((127u - 7u) << 3);
    return sign | static_cast<uint8_t>(code > 0x7eu ? 0x7eu : code);  // 464 and up rounded past 448
}

float quantize_row_fp8(const bf16* w, int64_t K, uint8_t* q) {
    float amax = 0.0f;
    for (int64_t k = 0; k < K; ++k) amax = std::fmax(amax, std::fabs(bf16_to_float(w[k])));
    const float scale = amax > 0.0f ? amax / kFp8Max : 1.0f;
    for (int64_t k = 0; k < K; ++k) q[k] = float_to_fp8_e4m3(bf16_to_float(w[k]) / scale);
    return scale;
}

void dequantize_row_fp8(const uint8_t* q, float scale, int64_t K, bf16* w) {
    const std::array<float, 256>& t = table();
    for (int64_t k = 0; k < K; ++k) w[k] = float_to_bf16(t[q[k]] * scale);
}

}  // namespace markbase
