// Helpers the backend-agreement tests share: relative error of two logits arrays, a seeded random prompt, and
// the logits of a prompt (batched, or token by token through the decode path).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "runtime/backend.h"

namespace markbase::testing {

// max |ref - got| / max |ref| (infinite when got has a non-finite value)
inline double rel_err(const std::vector<float>& ref, const std::vector<float>& got) {
    double mx = 0, diff = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        mx = std::max(mx, static_cast<double>(std::fabs(ref[i])));
        if (!std::isfinite(got[i])) return INFINITY;
        diff = std::max(diff, static_cast<double>(std::fabs(ref[i] - got[i])));
    }
    return mx > 0 ? diff / mx : diff;
}

// BOS (2), then n - 1 ids drawn from [0, vocab)
inline std::vector<int> random_ids(int n, int vocab, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int> ids(n);
    ids[0] = 2;
    for (int i = 1; i < n; ++i) ids[i] = static_cast<int>(rng() % static_cast<uint32_t>(vocab));
    return ids;
}

// [ids.size()][V] from an empty cache: one batched eval, or one eval per token
inline std::vector<float> all_logits(Backend& be, const std::vector<int>& ids, bool one_by_one) {
    const int64_t V = be.config().vocab_size;
    std::vector<float> out(ids.size() * V);
    be.reset();
    if (one_by_one) {
        for (size_t i = 0; i < ids.size(); ++i) be.eval(&ids[i], 1, out.data() + i * V, false);
    } else {
        be.eval(ids.data(), static_cast<int64_t>(ids.size()), out.data(), true);
    }
    return out;
}

}  // namespace markbase::testing
