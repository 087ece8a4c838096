// What the CPU kernel labs share: their test data's values.
#pragma once

#include <cstdint>

namespace lab {

// Uniform [-1, 1) from a counter hash (splitmix64's finaliser): fast enough to fill a GB on two cores in well
// under a second, and the same values on every run.
inline float hash_unit(uint64_t i) {
    uint64_t z = i * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return static_cast<float>(z >> 40) / static_cast<float>(1 << 23) - 1.0f;
}

}  // namespace lab
