// CudaModel's KV cache, bf16 or fp32 (--kv-cache-dtype, runtime/kv_dtype.h): one K and one V per layer with
// its own cache (sliding layers: a ring of min(ctx, window + chunk) positions; position p at p % cap), each
// slots deep; buffers.cu allocates it from the memory plan's kv_cap / kv_slot_stride.
#pragma once

#include <cstdint>
#include <vector>

namespace markbase::cuda {

struct LayerCache {
    void* k = nullptr;  // [slots][cap][nKV][d] of KvCache::elem_bytes each
    void* v = nullptr;
    int64_t cap = 0;
    int64_t slot_stride = 0;  // cap * nKV * d elements: one sequence slot's cache
};
struct KvCache {
    std::vector<LayerCache> layers;  // [L]; KV-shared layers point at their source's
    uint64_t bytes = 0;
    int elem_bytes = 2;                                 // 2: bf16, 4: fp32
    float *inv_sliding = nullptr, *inv_full = nullptr;  // RoPE inverse frequencies [head dim / 2]
};

}  // namespace markbase::cuda
