#include "server/logprobs.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace markbase::server {

Logprobs compute_logprobs(const float* logits, int64_t vocab, float temperature, int chosen, int k) {
    const double inv_t = temperature > 0 ? 1.0 / temperature : 1.0;
    double m = -INFINITY;
    for (int64_t i = 0; i < vocab; ++i) m = std::max(m, static_cast<double>(logits[i]));
    double sum = 0;
    for (int64_t i = 0; i < vocab; ++i) sum += std::exp((logits[i] - m) * inv_t);
    const double log_sum = std::log(sum);
    auto lp = [&](int id) { return static_cast<float>((logits[id] - m) * inv_t - log_sum); };

    Logprobs out;
    out.chosen = lp(chosen);
    k = static_cast<int>(std::min<int64_t>(std::max(k, 0), vocab));
    if (k == 0) return out;
    std::vector<int> ids(static_cast<size_t>(vocab));
    std::iota(ids.begin(), ids.end(), 0);
    auto before = [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    std::nth_element(ids.begin(), ids.begin() + (k - 1), ids.end(), before);
    std::sort(ids.begin(), ids.begin() + k, before);
    for (int i = 0; i < k; ++i)
        out.top.emplace_back(ids[static_cast<size_t>(i)], lp(ids[static_cast<size_t>(i)]));
    return out;
}

}  // namespace markbase::server
