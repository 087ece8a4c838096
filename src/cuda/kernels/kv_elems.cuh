// The KV cache's elements as the attention kernels see them (AttnArgs.kv): 4 consecutive values of a row as
// loaded (a float4 of an fp32 row, 8 bytes of a bf16 row, 4 bytes of an e4m3 row) and widened exactly to a
// float4 where used, and qkv_post's one store (bf16: round to nearest even, as torch casts; e4m3: the same,
// saturating at +-448, as vLLM's fp8 cache with its default scale of 1). The kernels are templates over the
// element type (float, uint16_t for bf16, uint8_t for e4m3); kv_dispatch picks the instantiation at launch.
// (The decode pieces load a bf16 or e4m3 row 8 values at a time: attention.cuh's load_lane_row.)
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"

namespace markbase::cuda {

__device__ __forceinline__ float4 widen4(uint2 u) {
    return make_float4(bf16_lo(u.x), bf16_hi(u.x), bf16_lo(u.y), bf16_hi(u.y));
}
// 4 values as loaded, widened where used (a bf16 row's stay 8 bytes in registers until then)
template <class KvT>
struct KvVec;
template <>
struct KvVec<float> {
    using type = float4;
};
template <>
struct KvVec<uint16_t> {
    using type = uint2;
};
template <>
struct KvVec<uint8_t> {
    using type = uint32_t;
};
__device__ __forceinline__ float4 kv_raw4(const float* row, int c) {
    return __ldg(reinterpret_cast<const float4*>(row) + c);
}
__device__ __forceinline__ uint2 kv_raw4(const uint16_t* row, int c) {
    return __ldg(reinterpret_cast<const uint2*>(row) + c);
}
__device__ __forceinline__ uint32_t kv_raw4(const uint8_t* row, int c) {
    return __ldg(reinterpret_cast<const uint32_t*>(row) + c);
}
// 4 e4m3 values (byte i is value i), exactly: through f16, which holds every e4m3 value
__device__ __forceinline__ float2 fp8x2_to_float2(uint32_t two) {
    return __half22float2(
        __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3)));
}
__device__ __forceinline__ float4 widen4_fp8(uint32_t u) {
    const float2 lo = fp8x2_to_float2(u & 0xffffu), hi = fp8x2_to_float2(u >> 16);
    return make_float4(lo.x, lo.y, hi.x, hi.y);
}
__device__ __forceinline__ float4 as_float4(float4 v) {
    return v;
}
__device__ __forceinline__ float4 as_float4(uint2 u) {
    return widen4(u);
}
__device__ __forceinline__ float4 as_float4(uint32_t u) {
    return widen4_fp8(u);
}

__device__ __forceinline__ void kv_store(float* p, float v) {
    *p = v;
}
__device__ __forceinline__ void kv_store(uint16_t* p, float v) {
    *p = float_to_bf16_bits(v);
}
__device__ __forceinline__ void kv_store(uint8_t* p, float v) {
    *p = static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

// f(T{}) with T the cache's element type: float, uint16_t (bf16) or uint8_t (e4m3).
template <class F>
void kv_dispatch(KvElem e, F&& f) {
    if (e == KvElem::kBf16)
        f(uint16_t{});
    else if (e == KvElem::kFp8)
        f(uint8_t{});
    else
        f(float{});
}

// The cache row (nKV * d elements from the layer's base) holding position pos of sequence slot `slot`
// (QkvPost / AttnArgs): a paged layer's block table entry (kv_cache.h; slot 0 where the table pointer is
// already the slot's row), else the slot's ring of cap positions.
template <class Args>
__device__ __forceinline__ int64_t kv_row(const Args& a, int slot, int64_t pos) {
    if (a.block_table) {
        const int64_t b =
            __ldg(a.block_table + static_cast<int64_t>(slot) * a.table_stride + (pos >> a.block_shift));
        return (b << a.block_shift) + (pos & ((int64_t{1} << a.block_shift) - 1));
    }
    return static_cast<int64_t>(slot) * a.cap + pos % a.cap;
}

}  // namespace markbase::cuda
