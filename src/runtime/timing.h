// Wall-clock timing shared by the generation loop, the loaders and the benchmark commands.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace markbase {

// Seconds on a monotonic clock (for differences only).
inline double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The median of repeated measurements (upper median for an even count); 0 for none.
inline double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace markbase
