// CudaModel's KV cache, fp32, bf16 or e4m3 (--kv-cache-dtype, runtime/kv_dtype.h): one K and one V per layer
// with its own cache. Sliding layers: a ring of min(ctx, window + chunk) positions per slot (position p at p
// % cap). Full layers: one sequence's whole context, or with several slots a pool of blocks of kKvBlock
// positions (loading/memory_plan.h) that each slot's block table maps its positions into (the serving
// engine's runtime/kv_blocks.h tables; by default slot s holds blocks [s * stride, (s + 1) * stride)).
// buffers.cu allocates it from the memory plan's kv_cap / kv_elems / kv_paged.
#pragma once

#include <cstdint>
#include <vector>

namespace markbase::cuda {

struct LayerCache {
    void* k = nullptr;  // [slots][cap][nKV][d], or paged [blocks][kKvBlock][nKV][d], of KvCache::elem_bytes
    void* v = nullptr;
    int64_t cap = 0;          // positions a slot holds (a paged layer: the context)
    int64_t slot_stride = 0;  // cap * nKV * d elements: one slot's ring (0 when paged)
    bool paged = false;
};
struct KvCache {
    std::vector<LayerCache> layers;  // [L]; KV-shared layers point at their source's
    uint64_t bytes = 0;
    int elem_bytes = 2;                                 // 1: e4m3, 2: bf16, 4: fp32
    float *inv_sliding = nullptr, *inv_full = nullptr;  // RoPE inverse frequencies [head dim / 2]
    // the paged layers' block tables: slot s's block number b at table[s * table_stride + b]
    int* table = nullptr;         // device
    std::vector<int> host_table;  // what the device's will hold once uploaded
    bool table_dirty = false;     // host_table changed since the last upload
    int64_t table_stride = 0;
    int64_t pool_blocks = 0;  // 0: not paged
    void* gather = nullptr;   // prefill: one slot's K then V rows of a paged (or fp8) layer, contiguous
};

}  // namespace markbase::cuda
