// tile_gemm's quantised weight rows (tile_gemm.cu): a stage's rows as they travel the ring, and each
// thread's A fragments converted from them in registers to the values of the model's bf16 copy, so the
// tensor cores (wgmma with A from registers) compute the copy's products over fewer bytes.
//  - FP8: e4m3 with a scale per row; 64 bytes a row a stage at a stride of 80, so that the 8 rows a warp's
//    16-bit loads read start in banks 20 apart (distinct); value = f32(e4m3) x scale, rounded to bf16
//    (model/fp8.cpp's and quantize_rows.cu's rule).
//  - int4: nibbles (k even in the low one) with a scale and zero point per group of 128 along K; 32 bytes a
//    row a stage at a stride of 48 (banks 12 apart); value = (nibble - zero) x scale in fp32, rounded to
//    bf16 (quantize_rows.cu's rule; the host's dequantize_row_int4 rounds the exact product, which can
//    differ in a tie's last bit).
// Thread l of warp w holds A rows 16 w + l / 4 and 8 on in each m64 tile, columns 2 (l & 3) + 16 kk (+1)
// and those + 8 of the stage's k16 step kk (wgmma.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/kernels/wgmma.cuh"
#include "model/weights.h"

namespace markbase::cuda::tile {

constexpr int kFp8Row = 80;
constexpr int kInt4Row = 48;

template <WeightFormat F>
constexpr int quant_row() {
    return F == WeightFormat::kInt4 ? kInt4Row : kFp8Row;
}

__device__ __forceinline__ uint32_t bf16_pair(float lo, float hi) {
    const __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&b);
}

// Two e4m3 codes at shared `addr` (the first in the low byte) times their row's scale.
__device__ __forceinline__ uint32_t fp8_pair(uint32_t addr, float scale) {
    uint16_t two;
    asm volatile("ld.shared.u16 %0, [%1];" : "=h"(two) : "r"(addr) : "memory");
    const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(two, __NV_E4M3)));
    return bf16_pair(f.x * scale, f.y * scale);
}

// The two nibbles of the byte at shared `addr` less the zero point, times the group's scale. zf: 2^23 +
// zero, so that (2^23 + nibble) - zf, both exact floats, is nibble - zero exactly.
__device__ __forceinline__ uint32_t int4_pair(uint32_t addr, float zf, float scale) {
    uint32_t b;
    asm volatile("ld.shared.u8 %0, [%1];" : "=r"(b) : "r"(addr) : "memory");
    const float lo = __uint_as_float(0x4b000000u | (b & 15u)) - zf;
    const float hi = __uint_as_float(0x4b000000u | (b >> 4)) - zf;
    return bf16_pair(lo * scale, hi * scale);
}

// The per-row numbers a stage's conversion takes for the thread's rows [mt][h] (h: the row 8 on): FP8 the
// row's scale; int4 the scale and 2^23 + zero of the stage's group.
template <int MT>
struct RowScales {
    float scale[MT][2];
    float zf[MT][2];
};

// One stage of quantised rows at shared `ws` against the tokens' swizzled rows at `xs`: the thread's A
// fragments for the stage's 4 k16 steps, then the warpgroup's MMAs; they complete before it returns.
template <WeightFormat F, int MT, int NT>
__device__ __forceinline__ void mma_stage_quant(float (&acc)[MT][NT * 4], uint32_t ws, uint32_t xs,
                                                const RowScales<MT>& rs) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint32_t a[4][MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = mt * 64 + warp * 16 + (lane >> 2) + 8 * h;
            const float s = rs.scale[mt][h];
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                if constexpr (F == WeightFormat::kInt4) {
                    // k 16 kk + 2 t is byte 8 kk + t of the row's 32; + 8 is 4 bytes on
                    const uint32_t at = ws + row * kInt4Row + 8 * kk + (lane & 3);
                    a[kk][mt][h] = int4_pair(at, rs.zf[mt][h], s);
                    a[kk][mt][2 + h] = int4_pair(at + 4, rs.zf[mt][h], s);
                } else {
                    const uint32_t at = ws + row * kFp8Row + 16 * kk + 2 * (lane & 3);
                    a[kk][mt][h] = fp8_pair(at, s);
                    a[kk][mt][2 + h] = fp8_pair(at + 8, s);
                }
            }
        }
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) wgmma_bf16_rs<NT * 8>(acc[mt], a[kk][mt], wgmma_desc(xs + kk * 32));
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) wgmma_pin(acc[mt]);
    // the A registers live until the MMAs that read them asynchronously are done: the compiler sees each
    // wgmma's inputs consumed when it is issued, and could otherwise give them to a later value
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int r = 0; r < 4; ++r) asm volatile("" : "+r"(a[kk][mt][r])::"memory");
}

}  // namespace markbase::cuda::tile
