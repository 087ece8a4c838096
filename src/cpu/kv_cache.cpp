#include "cpu/kv_cache.h"

#include <algorithm>

#include "model/sliding_ring.h"

namespace markbase::cpu {

KvCache::KvCache(const ModelConfig& c, int64_t ctx, int chunk) : max_ctx(ctx), max_chunk(chunk) {
    layers.resize(c.n_layers);
    for (int i = 0; i < c.n_layers; ++i) {
        const LayerSpec& s = c.layers[i];
        if (!s.has_own_kv()) continue;
        LayerCache& l = layers[i];
        l.n_kv = s.n_kv_heads;
        l.d = s.head_dim;
        l.capacity =
            s.kind == AttentionKind::Sliding ? std::min<int64_t>(ctx, c.sliding_window + chunk) : ctx;
        l.k.assign(static_cast<size_t>(l.capacity) * l.n_kv * l.d, 0.0f);
        l.v.assign(l.k.size(), 0.0f);
    }
}

bool KvCache::truncate(int64_t n, int sliding_window) {
    if (n < 0 || n > n_past) return false;
    // full layers hold every position (capacity == max_ctx) and never wrap
    for (const LayerCache& l : layers)
        if (l.capacity > 0 && l.capacity < max_ctx && !ring_can_roll_back(n_past, n, l.capacity, sliding_window))
            return false;
    n_past = n;
    return true;
}

uint64_t KvCache::bytes() const {
    uint64_t b = 0;
    for (const auto& l : layers) b += (l.k.size() + l.v.size()) * sizeof(float);
    return b;
}

}  // namespace markbase::cpu
