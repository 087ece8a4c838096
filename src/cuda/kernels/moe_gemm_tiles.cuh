// moe_gemm.cu's block loop: a block's operands (128 weight rows of one expert and a column tile of BN of its
// entries' inputs) through a 3-stage cp.async ring of 64 k a stage, and each stage's MMAs on the warps' two
// 16-row tiles: bf16 rows against both bf16 halves of the inputs, FP8 and int4 rows converted to f16 against
// one f16 of x / 16 (int4: a group's two stages summed apart, then times the rows' scales). Shared rows are
// XOR-swizzled in 16-byte chunks so that a warp's loads of 8 rows hit distinct banks.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/quant_operands.cuh"
#include "cuda/kernels/smem_ring.cuh"
#include "model/weights.h"

namespace markbase::cuda::moe_tiles {

constexpr int kRows = 128;     // weight rows a block (gate/up: 64 gate rows and their 64 up rows)
constexpr int kKc = 64;        // k a stage: a 128-byte shared row of bf16
constexpr int kStages = 3;     // the cp.async ring
constexpr int kThreads = 256;  // 8 warps: 4 row groups x 2 entry halves

using Fmt = WeightFormat;

// A block's operands: the 128 weight rows a thread loads (bf16: rows (tid >> 3) + 32 i, 128 bytes of a stage
// each; FP8: rows (tid >> 2) + 64 i, 64 bytes; int4: row tid >> 1, 32 bytes) and its input rows (tid >> 3) +
// 32 i of the column tile (bf16: hi, with lo at lo_off elements; quantised rows: f16), zeros past nj.
template <int BN>
struct Operands {
    const uint8_t* w[4];
    const uint16_t* x[BN / 32];
    bool x_ok[BN / 32];
    int64_t lo_off;
};

// FP8 weight rows in shared memory: 64 bytes (64 k), 16-byte chunks XOR-swizzled by (row >> 1) & 3.
__device__ __forceinline__ uint32_t swz64(int row, int c) {
    return static_cast<uint32_t>(row * 64 + ((c ^ ((row >> 1) & 3)) << 4));
}
// int4 weight rows: 32 bytes (64 k), the 2 chunks swapped from row 4 of every 8 on, so that the 8 rows a
// warp's 16-bit loads read start 8 or 4 + 8 banks apart (distinct).
__device__ __forceinline__ uint32_t swz32(int row, int c) {
    return static_cast<uint32_t>(row * 32 + ((c ^ ((row >> 2) & 1)) << 4));
}

// One stage's k [k0, k0 + 64): the weight rows, then the inputs (bf16: hi and lo; quantised rows: one f16
// array).
template <int BN, Fmt F>
__device__ __forceinline__ void load_stage(uint32_t st, const Operands<BN>& op, int k0) {
    constexpr bool Fp8 = F == Fmt::kFp8;
    const int r8 = threadIdx.x >> 3, c8 = threadIdx.x & 7;
    uint32_t xs;
    if constexpr (F == Fmt::kInt4) {
        const int r2 = threadIdx.x >> 1, c2 = threadIdx.x & 1;
        cp16(st + swz32(r2, c2), op.w[0] + k0 / 2 + c2 * 16, true);
        xs = st + kRows * 32;
    } else if constexpr (Fp8) {
        const int r4 = threadIdx.x >> 2, c4 = threadIdx.x & 3;
#pragma unroll
        for (int i = 0; i < 2; ++i) cp16(st + swz64(r4 + 64 * i, c4), op.w[i] + k0 + c4 * 16, true);
        xs = st + kRows * 64;
    } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) cp16(st + swz(r8 + 32 * i, c8), op.w[i] + 2 * (k0 + c8 * 8), true);
        xs = st + kRows * 128;
    }
#pragma unroll
    for (int i = 0; i < BN / 32; ++i) {
        const int row = r8 + 32 * i;
        const uint16_t* src = op.x[i] + k0 + c8 * 8;
        cp16(xs + swz(row, c8), src, op.x_ok[i]);
        if constexpr (F == Fmt::kBf16) cp16(xs + BN * 128 + swz(row, c8), src + op.lo_off, op.x_ok[i]);
    }
}

// A warp's MMAs over one bf16 stage: two 16-row tiles (shared rows ra0, ra1) against NT tiles of 8 entries
// (shared rows from rn), both halves.
template <int BN, int NT>
__device__ __forceinline__ void mma_stage_bf16(float (&acc)[2][NT][4], uint32_t st, int ra0, int ra1,
                                               int rn) {
    const int lane = threadIdx.x & 31;
    const uint32_t xs = st + kRows * 128, ls = xs + BN * 128;
#pragma unroll
    for (int kk = 0; kk < kKc / 16; ++kk) {
        uint32_t a0[4], a1[4];
        const int ac = kk * 2 + (lane >> 4);
        ldmatrix4(a0, st + swz(ra0 + (lane & 15), ac));
        ldmatrix4(a1, st + swz(ra1 + (lane & 15), ac));
#pragma unroll
        for (int p = 0; p < NT / 2; ++p) {
            const int row = rn + p * 16 + (lane & 7) + ((lane >> 4) << 3);
            const int bc = kk * 2 + ((lane >> 3) & 1);
            uint32_t bh[4], bl[4];
            ldmatrix4(bh, xs + swz(row, bc));
            ldmatrix4(bl, ls + swz(row, bc));
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int nt = 2 * p + h;
                mma_bf16(acc[0][nt], a0[0], a0[1], a0[2], a0[3], bh[2 * h], bh[2 * h + 1]);
                mma_bf16(acc[0][nt], a0[0], a0[1], a0[2], a0[3], bl[2 * h], bl[2 * h + 1]);
                mma_bf16(acc[1][nt], a1[0], a1[1], a1[2], a1[3], bh[2 * h], bh[2 * h + 1]);
                mma_bf16(acc[1][nt], a1[0], a1[1], a1[2], a1[3], bl[2 * h], bl[2 * h + 1]);
            }
        }
    }
}

// A k16 step kk of a quantised stage: the warp's A fragments a (its two row tiles) against its NT tiles of
// 8 entries' f16 inputs (shared rows from rn), lane q's 4 values at k 4q .. 4q + 3 in one 8-byte load.
template <int NT>
__device__ __forceinline__ void mma_f16_inputs(float (&acc)[2][NT][4], const uint32_t (&a)[2][4], uint32_t xs,
                                               int rn, int kk) {
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const int row = rn + nt * 8 + g;
        uint32_t b0, b1;
        asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];"
                     : "=r"(b0), "=r"(b1)
                     : "r"(xs + swz(row, kk * 2 + (q >> 1)) + 8 * (q & 1)));
#pragma unroll
        for (int m = 0; m < 2; ++m) mma_f16(acc[m][nt], a[m][0], a[m][1], a[m][2], a[m][3], b0, b1);
    }
}

// The same over an FP8 stage, on f16: the k order inside each group of 16 is permuted alike for both operands
// (lane q's bytes 4q .. 4q + 3 of a row are the fragment's k 2q, 2q + 1, 2q + 8, 2q + 9), so a lane reads its
// row's 4 weight bytes in one load (converted to two f16 pairs) and its input's 4 f16 in one 8-byte load.
template <int NT>
__device__ __forceinline__ void mma_stage_fp8(float (&acc)[2][NT][4], uint32_t st, int ra0, int ra1, int rn) {
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const uint32_t xs = st + kRows * 64;
#pragma unroll
    for (int kk = 0; kk < kKc / 16; ++kk) {
        uint32_t a[2][4];
#pragma unroll
        for (int m = 0; m < 2; ++m) {
            const int r = (m ? ra1 : ra0) + g;
            uint32_t lo, hi;
            asm volatile("ld.shared.b32 %0, [%1];" : "=r"(lo) : "r"(st + swz64(r, kk) + 4 * q));
            asm volatile("ld.shared.b32 %0, [%1];" : "=r"(hi) : "r"(st + swz64(r + 8, kk) + 4 * q));
            a[m][0] = fp8x2_to_f16x2(lo & 0xffffu);
            a[m][1] = fp8x2_to_f16x2(hi & 0xffffu);
            a[m][2] = fp8x2_to_f16x2(lo >> 16);
            a[m][3] = fp8x2_to_f16x2(hi >> 16);
        }
        mma_f16_inputs<NT>(acc, a, xs, rn, kk);
    }
}

// Two nibbles (the low byte of b: k even in the low one) less the zero point, as an f16 pair: each ORed
// into 0x6400 is 1024 + n exactly, and zz holds 1024 + zero in both halves.
__device__ __forceinline__ uint32_t int4_pair_f16(uint32_t b, uint32_t zz) {
    const uint32_t v = (b & 0xfu) | ((b & 0xf0u) << 12) | 0x64006400u;
    const __half2 r = __hsub2(*reinterpret_cast<const __half2*>(&v), *reinterpret_cast<const __half2*>(&zz));
    return *reinterpret_cast<const uint32_t*>(&r);
}

// The same over an int4 stage: lane q's 2 bytes of a row in a k16 step (k 4q .. 4q + 3, the FP8 stage's k
// order, so the inputs' loads are FP8's) as the fragment's two pairs. zz[m][h]: 1024 + the zero point of
// row tile m's row g + 8 h in both halves.
template <int NT>
__device__ __forceinline__ void mma_stage_int4(float (&acc)[2][NT][4], uint32_t st, int ra0, int ra1, int rn,
                                               const uint32_t (&zz)[2][2]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const uint32_t xs = st + kRows * 32;
#pragma unroll
    for (int kk = 0; kk < kKc / 16; ++kk) {
        uint32_t a[2][4];
#pragma unroll
        for (int m = 0; m < 2; ++m) {
            const int r = (m ? ra1 : ra0) + g;
            const uint32_t at = (kk & 1) * 8 + 2 * q;
            uint16_t lo, hi;
            asm volatile("ld.shared.u16 %0, [%1];" : "=h"(lo) : "r"(st + swz32(r, kk >> 1) + at));
            asm volatile("ld.shared.u16 %0, [%1];" : "=h"(hi) : "r"(st + swz32(r + 8, kk >> 1) + at));
            a[m][0] = int4_pair_f16(lo, zz[m][0]);
            a[m][1] = int4_pair_f16(hi, zz[m][1]);
            a[m][2] = int4_pair_f16(static_cast<uint32_t>(lo) >> 8, zz[m][0]);
            a[m][3] = int4_pair_f16(static_cast<uint32_t>(hi) >> 8, zz[m][1]);
        }
        mma_f16_inputs<NT>(acc, a, xs, rn, kk);
    }
}

using Int4Rows = quant::Int4Rows<2>;  // the lane's rows of its two row tiles

template <int BN, Fmt F>
constexpr uint32_t stage_bytes() {
    return F == Fmt::kInt4  ? (kRows * 32 + BN * 128)
           : F == Fmt::kFp8 ? (kRows * 64 + BN * 128)
                            : (kRows + 2 * BN) * 128;
}

// int4: the whole K through the ring, a group (two stages) at a time into d, then into acc times the rows'
// group scales.
template <int BN, int NT>
__device__ __forceinline__ void block_mma_int4(float (&acc)[2][NT][4], uint32_t smem, const Operands<BN>& op,
                                               int Kd, int ra0, int ra1, int rn, const Int4Rows& rows) {
    constexpr uint32_t kStage = stage_bytes<BN, Fmt::kInt4>();
    float d[2][NT][4];
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int v = 0; v < 4; ++v) acc[m][nt][v] = d[m][nt][v] = 0.0f;
    const int nk = Kd / kKc;
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < nk) load_stage<BN, Fmt::kInt4>(smem + s * kStage, op, s * kKc);
        cp_commit();
    }
    float sc[2][2] = {};
    uint32_t zz[2][2] = {};
    for (int kc = 0; kc < nk; ++kc) {
        if ((kc & 1) == 0) {  // a group's first stage: its scales and zero points, before the wait
#pragma unroll
            for (int m = 0; m < 2; ++m)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    sc[m][h] = __ldg(rows.scale[m][h] + (kc >> 1));
                    const uint32_t z = rows.zero[m][h] ? __ldg(rows.zero[m][h] + (kc >> 1)) : 8u;
                    zz[m][h] = quant::int4_zz(z);
                }
        }
        cp_wait<kStages - 2>();
        __syncthreads();  // stage kc landed for every thread; stage kc - 1 is free to refill
        const int next = kc + kStages - 1;
        if (next < nk) load_stage<BN, Fmt::kInt4>(smem + (next % kStages) * kStage, op, next * kKc);
        cp_commit();
        mma_stage_int4<NT>(d, smem + (kc % kStages) * kStage, ra0, ra1, rn, zz);
        if ((kc & 1) || kc == nk - 1) {
#pragma unroll
            for (int m = 0; m < 2; ++m)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int v = 0; v < 4; ++v) {
                        acc[m][nt][v] = fmaf(d[m][nt][v], sc[m][v >> 1], acc[m][nt][v]);
                        d[m][nt][v] = 0.0f;
                    }
        }
    }
}

// The block's whole K through the ring into acc (zeroed here).
template <int BN, bool Fp8, int NT>
__device__ __forceinline__ void block_mma(float (&acc)[2][NT][4], uint32_t smem, const Operands<BN>& op,
                                          int Kd, int ra0, int ra1, int rn) {
    constexpr Fmt F = Fp8 ? Fmt::kFp8 : Fmt::kBf16;
    constexpr uint32_t kStage = stage_bytes<BN, F>();
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) acc[m][nt][0] = acc[m][nt][1] = acc[m][nt][2] = acc[m][nt][3] = 0.0f;
    const int nk = Kd / kKc;
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < nk) load_stage<BN, F>(smem + s * kStage, op, s * kKc);
        cp_commit();
    }
    for (int kc = 0; kc < nk; ++kc) {
        cp_wait<kStages - 2>();
        __syncthreads();  // stage kc landed for every thread; stage kc - 1 is free to refill
        const int next = kc + kStages - 1;
        if (next < nk) load_stage<BN, F>(smem + (next % kStages) * kStage, op, next * kKc);
        cp_commit();
        const uint32_t st = smem + (kc % kStages) * kStage;
        if constexpr (Fp8)
            mma_stage_fp8<NT>(acc, st, ra0, ra1, rn);
        else
            mma_stage_bf16<BN, NT>(acc, st, ra0, ra1, rn);
    }
}

// The weight rows a thread copies a stage (load_stage's layout): its first, and the rows between its copies
// (bf16 four copies 32 apart, FP8 two 64 apart, int4 one).
template <Fmt F>
constexpr int copy_stride() {
    return F == Fmt::kInt4 ? 128 : F == Fmt::kFp8 ? 64 : 32;
}
template <Fmt F>
__device__ __forceinline__ int copy_row() {
    return F == Fmt::kInt4 ? threadIdx.x >> 1 : F == Fmt::kFp8 ? threadIdx.x >> 2 : threadIdx.x >> 3;
}

}  // namespace markbase::cuda::moe_tiles
