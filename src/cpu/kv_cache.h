// The CPU backend's KV cache. Full-attention layers keep every position; sliding layers keep a ring of
// W + max_chunk slots (the window, plus room for one prefill chunk to be written before its queries read
// the older keys they still need). KV-shared layers store nothing: they read their source layer's cache.
// Entries are fp32, post-norm and post-RoPE, as attention consumes them; with bf16_values each is rounded to
// bf16 first, the function of the GPU's bf16 cache.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace markbase::cpu {

struct LayerCache {
    int64_t capacity = 0;  // slots; position p lives in slot p % capacity
    int n_kv = 0, d = 0;
    std::vector<float> k, v;  // [capacity][n_kv][d]
    float* k_at(int64_t pos) { return k.data() + (pos % capacity) * n_kv * d; }
    float* v_at(int64_t pos) { return v.data() + (pos % capacity) * n_kv * d; }
};

struct KvCache {
    int64_t max_ctx = 0;             // positions this cache can hold in total
    int max_chunk = 0;               // the most tokens one forward call may add
    int64_t n_past = 0;              // positions already in the cache
    bool bf16_values = false;        // keys and values rounded to bf16 when written (--kv-cache-dtype bf16)
    std::vector<LayerCache> layers;  // [L]; empty (capacity 0) on KV-shared layers

    KvCache(const ModelConfig& c, int64_t max_ctx, int max_chunk);
    uint64_t bytes() const;
    void clear() { n_past = 0; }
    // Keeps positions [0, n). Possible while no sliding ring has overwritten a slot that a query at n still
    // reads.
    bool truncate(int64_t n, int sliding_window);
};

}  // namespace markbase::cpu
