// The CPU backend's KV cache. Full-attention layers keep every position; sliding layers keep a ring of
// W + max_chunk slots (the window, plus room for one prefill chunk to be written before its queries read
// the older keys they still need). KV-shared layers store nothing: they read their source layer's cache.
// Entries are fp32, post-norm and post-RoPE, as attention consumes them; with `values` bf16 or fp8 each is
// rounded to that type first (runtime/kv_dtype.h), the function of the GPU's bf16 or fp8 cache.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "runtime/kv_dtype.h"

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
    KvDtype values = KvDtype::kF32;  // what keys and values are rounded to when written (--kv-cache-dtype)
    std::vector<LayerCache> layers;  // [L]; empty (capacity 0) on KV-shared layers

    KvCache(const ModelConfig& c, int64_t max_ctx, int max_chunk);
    uint64_t bytes() const;
    void clear() { n_past = 0; }
    // Keeps positions [0, n). Possible while no sliding ring has overwritten a slot that a query at n still
    // reads.
    bool truncate(int64_t n, int sliding_window);
};

}  // namespace markbase::cpu
