// Device-side building blocks shared by the kernels: bf16 decoding, warp and block reductions, GELU, and the
// streaming 16-byte weight load.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

namespace markbase::cuda {

__device__ __forceinline__ float bf16_lo(uint32_t w) {
    return __uint_as_float(w << 16);
}
__device__ __forceinline__ float bf16_hi(uint32_t w) {
    return __uint_as_float(w & 0xffff0000u);
}
__device__ __forceinline__ float bf16_at(const uint16_t* p, int64_t i) {
    return __uint_as_float(static_cast<uint32_t>(p[i]) << 16);
}

// Round to nearest even, as torch casts float32 to bfloat16 (NaN kept quiet).
__device__ __forceinline__ uint16_t float_to_bf16_bits(float f) {
    uint32_t b = __float_as_uint(f);
    if ((b & 0x7f800000u) == 0x7f800000u && (b & 0x007fffffu)) return static_cast<uint16_t>((b >> 16) | 0x40);
    b += 0x7fffu + ((b >> 16) & 1u);
    return static_cast<uint16_t>(b >> 16);
}

// An fp32 value as two bf16 halves for the prefill GEMMs: hi = bf16(v), lo = bf16(v - hi).
__device__ __forceinline__ void split_store(float v, uint16_t* hi, uint16_t* lo, int64_t i) {
    const uint16_t h = float_to_bf16_bits(v);
    hi[i] = h;
    lo[i] = float_to_bf16_bits(v - __uint_as_float(static_cast<uint32_t>(h) << 16));
}

// f16(v / 16), the input of the MMAs whose weights are FP8 rows (f16 on the way in): the 2^-4 lets f16's
// range hold |v| up to 2^20, the reader multiplies its sums by 16. One f16 keeps 2^-11 of v, against the
// 2^-4 an e4m3 weight keeps of itself (vLLM's FP8 path rounds the activations to e4m3 too).
__device__ __forceinline__ void store_f16_sixteenth(float v, uint16_t* out, int64_t i) {
    out[i] = __half_as_ushort(__float2half_rn(v * 0.0625f));
}

// Two e4m3 codes (the low 16 bits: the first in the low byte) as an f16 pair, exactly (every e4m3 value,
// subnormals too, is an f16 normal): one instruction on sm_89 and later.
__device__ __forceinline__ uint32_t fp8x2_to_f16x2(uint32_t two) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
    return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

// mma.sync m16n8k16 with fp32 accumulation: A's rows g (a0, a2) and g + 8 (a1, a3; 0 where a kernel uses
// 8 rows), B's k pairs (b0, b1), both bf16 (mma_bf16) or f16 (mma_f16: FP8 and int4 weights converted on the
// way in). The two differ only in the operands' type.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define MARKBASE_MMA_16816(T)                                                 \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." T "." T             \
                 ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};" \
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])             \
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))
#else
#define MARKBASE_MMA_16816(T) ((void)c, (void)a0, (void)a1, (void)a2, (void)a3, (void)b0, (void)b1, __trap())
#endif
__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    MARKBASE_MMA_16816("bf16");
}
__device__ __forceinline__ void mma_f16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                        uint32_t b0, uint32_t b1) {
    MARKBASE_MMA_16816("f16");
}
#undef MARKBASE_MMA_16816

// Weights are read exactly once per step: bypass L1 so they do not evict the activations staged there.
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

// dot of 8 bf16 (one 16-byte chunk) with 8 fp32 values
__device__ __forceinline__ float dot8(const uint4 w, const float4 a, const float4 b) {
    float s = bf16_lo(w.x) * a.x;
    s = fmaf(bf16_hi(w.x), a.y, s);
    s = fmaf(bf16_lo(w.y), a.z, s);
    s = fmaf(bf16_hi(w.y), a.w, s);
    s = fmaf(bf16_lo(w.z), b.x, s);
    s = fmaf(bf16_hi(w.z), b.y, s);
    s = fmaf(bf16_lo(w.w), b.z, s);
    s = fmaf(bf16_hi(w.w), b.w, s);
    return s;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the total.
// `scratch` holds 32 floats of shared memory; the call ends with a barrier so scratch can be reused.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < nwarps ? scratch[lane] : 0.0f;
    t = warp_sum(t);
    __syncthreads();
    return t;
}

// Max over the block, as block_sum (every thread gets it; ends with a barrier).
__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_max(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < nwarps ? scratch[lane] : -FLT_MAX;
    t = warp_max(t);
    __syncthreads();
    return t;
}

// sum of squares of 8 inputs; the 8 inputs times 8 bf16 norm weights (the RMSNorm folded into a GEMV's x)
__device__ __forceinline__ float sq8(const float4 a, const float4 b, float s) {
    s = fmaf(a.x, a.x, s);
    s = fmaf(a.y, a.y, s);
    s = fmaf(a.z, a.z, s);
    s = fmaf(a.w, a.w, s);
    s = fmaf(b.x, b.x, s);
    s = fmaf(b.y, b.y, s);
    s = fmaf(b.z, b.z, s);
    return fmaf(b.w, b.w, s);
}

__device__ __forceinline__ void scale8(float4& a, float4& b, const uint4 n) {
    a.x *= bf16_lo(n.x);
    a.y *= bf16_hi(n.x);
    a.z *= bf16_lo(n.y);
    a.w *= bf16_hi(n.y);
    b.x *= bf16_lo(n.z);
    b.y *= bf16_hi(n.z);
    b.z *= bf16_lo(n.w);
    b.w *= bf16_hi(n.w);
}

__device__ __forceinline__ float gelu_tanh(float x) {
    const float k = 0.7978845608028654f;  // sqrt(2/pi)
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

// Orders floats as unsigned integers (larger float, larger key); the low 32 bits hold ~index so that equal
// values resolve to the lower index under atomicMax, as std::max_element does.
__device__ __forceinline__ unsigned long long argmax_key(float v, uint32_t idx) {
    uint32_t u = __float_as_uint(v);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return (static_cast<unsigned long long>(u) << 32) | static_cast<unsigned long long>(0xffffffffu - idx);
}

}  // namespace markbase::cuda

namespace markbase::cuda {

// Programmatic dependent launch (launch.h): wait for the previous kernel's completion and memory, then let
// the next kernel be scheduled. Both are no-ops when the kernel was launched without the attribute.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// Let the next kernel be scheduled, then wait. The wait returns only once the previous grid has completed
// and flushed, so results cannot depend on the order; what the early trigger buys is that kernel N + 1's
// launch and its early weight loads overlap kernel N's wait for N - 1 (triggering after the wait, they
// started only once N - 1 had finished: the H200 A/B, decode E2B -3.1%, E4B -2.7%, 26B-A4B -1.2%, 31B -0.6%,
// the same greedy ids; the graph timeline had E2B's one-block updates at 2.0-2.6 us instead of 3.1-3.8).
// Safe because every access a kernel makes before its wait is to data no kernel of the same step writes
// (weights, norm weights, and the KV cache of earlier positions; the current position is read again after
// the wait), and because the next grid is scheduled only once all of this grid's blocks have started (so a
// later grid can never hold the SMs an earlier one still needs). A kernel that reads data written two kernels
// back (the MoE down-sum's expert ids) waits before reading it.
__device__ __forceinline__ void pdl_begin() {
    pdl_launch_dependents();
    pdl_wait();
}
// The PDL wait after loads that do not depend on the previous kernel (weights; the KV cache of earlier
// steps). Written as a plain call after them, the wait does not keep them above it: ptxas sinks such loads
// below griddepcontrol.wait (in the SASS of every warp-per-row GEMV no weight load came before the wait, so
// the weights never streamed during the previous kernel's tail; with this form: E2B -2.8%, E4B -2.4%, 26B-A4B
// -1.9%, 31B -1.2%). A branch on `nonzero` (a value the caller knows is not 0 and the compiler cannot fold)
// puts the wait in a block of its own, and the loads stay above it.
__device__ __forceinline__ void pdl_begin_after_loads(int nonzero) {
    if (nonzero != 0) pdl_begin();
}
// The end of a step: the argmax key (see argmax_key) becomes the next token; the position advances; greedy
// decoding appends the id. Key 0 means no finite logit was seen: feed pad (0) rather than an out-of-range id.
__device__ __forceinline__ void finish_token(unsigned long long key, int* state, int advance, int* out_ids,
                                             int out_cap) {
    const int tok = key ? static_cast<int>(0xffffffffu - static_cast<uint32_t>(key & 0xffffffffull)) : 0;
    state[0] = tok;
    state[1] += advance;
    if (out_ids) {
        const int k = state[2];
        if (k < out_cap) out_ids[k] = tok;
        state[2] = k + 1;
    }
}

__device__ __forceinline__ void prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

}  // namespace markbase::cuda
