// What a backend's device-side selection (DeviceSelect) must give for a logits row, computed on the host: the
// penalties applied as the host sampler applies them (one fma), then the k best by logit descending, id
// ascending, and how many logits are not -inf after the penalties.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "runtime/backend.h"

namespace markbase::testing {

inline DeviceSelection host_select(const float* row, int64_t V, const DeviceSelect& s) {
    std::vector<float> l(row, row + V);
    for (size_t i = 0; i < s.pen_ids.size(); ++i) {
        float& x = l[static_cast<size_t>(s.pen_ids[i])];
        x = x > 0.0f ? x / s.repeat_penalty : x * s.repeat_penalty;
        x -= std::fma(s.frequency_penalty, static_cast<float>(s.pen_counts[i]), s.presence_penalty);
    }
    std::vector<Sampler::Top> all;
    for (int64_t i = 0; i < V; ++i)
        if (l[static_cast<size_t>(i)] != -INFINITY)
            all.push_back({l[static_cast<size_t>(i)], static_cast<int>(i)});
    DeviceSelection out;
    out.n_finite = static_cast<int64_t>(all.size());
    const auto k = static_cast<std::ptrdiff_t>(std::min(all.size(), static_cast<size_t>(s.k)));
    std::partial_sort(all.begin(), all.begin() + k, all.end(),
                      [](const Sampler::Top& a, const Sampler::Top& b) {
                          return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
                      });
    out.top.assign(all.begin(), all.begin() + k);
    out.ok = true;
    return out;
}

}  // namespace markbase::testing
