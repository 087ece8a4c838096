// bfloat16 as stored in checkpoints: the top 16 bits of an IEEE float32.
#pragma once

#include <cstdint>
#include <cstring>

namespace markbase {

using bf16 = uint16_t;

inline float bf16_to_float(bf16 v) {
    uint32_t bits = static_cast<uint32_t>(v) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

// Round to nearest even, as torch does when casting float32 to bfloat16.
inline bf16 float_to_bf16(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu))
        return static_cast<bf16>((bits >> 16) | 0x40);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return static_cast<bf16>(bits >> 16);
}

inline float round_to_bf16(float f) {
    return bf16_to_float(float_to_bf16(f));
}

}  // namespace markbase
