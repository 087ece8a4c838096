// The pieces of gemv_quant.cu's kernel that prepare its MMA operands and find its rows: the parameters,
// the weight conversions (e4m3 pairs, int4 nibble pairs) and one super-step's MMAs, x staged as f16 halves in
// the fragments' order, the rows' pointers, group scales and zero points, and a register buffer's loads and
// MMAs (StepSet). gemv_quant.cu's header comment describes the layout.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"
#include "model/int4.h"

namespace markbase::cuda::quant {

using Fmt = WeightFormat;

constexpr int kWarps = 8;
constexpr int kSuper = 64;  // bytes of a row per super-step: 4 lanes x 16
constexpr int kMaxK = 32768;
constexpr int kGroup =
    static_cast<int>(kInt4Group);  // int4: weights per scale, one super-step (model/int4.h)

// weights per super-step of a row; MMAs per lane per super-step
template <Fmt F>
constexpr int kStepK = F == Fmt::kInt4 ? 128 : 64;
template <Fmt F>
constexpr int kMmas = kStepK<F> / 16;

struct QuantParams {
    const float* x = nullptr;
    int K = 0;
    int64_t x_slot_stride = 0;  // elements between slots' inputs (0: one x for all)
    bool norm = false;
    const bf16* norm_w = nullptr;
    float norm_scale = 1.0f, eps = 1e-6f;
    QuantMatrix m[3] = {};  // the segments' matrices
    float* y[3] = {};
    int seg_end[3] = {};
    int nseg = 0, total_rows = 0;
    QuantMatrix m2;                     // Geglu: the up projection (seg 0's rows)
    const int* group_expert = nullptr;  // experts: slot -> expert (< 0: a zero row)
    int64_t expert_rows = 0;            // rows of one expert (its q, scales and zero points follow)
    int64_t out_stride = 0;
    bool fp8_long_buffers = false;  // GemvInput's
};

// int4: a word's 8 codes (nibble m at bits 4m) as the 4 f16 pairs (n - zero) the MMAs take: o[j] holds
// nibbles (j, j + 4) for j = 0, 1 of the low byte pair and j = 2, 3 of w >> 8 (nibble pairs 0/4, 1/5, 2/6,
// 3/7). A nibble left in place is 1024 + n once ORed with 0x6400; one at bits 4..7 gives 1024 + 16 n, which
// times 1/16 less (64 + zero) is n - zero, exactly, in one HFMA2: 2 instructions a pair (a LOP3, then a
// subtraction or an FMA) and one shift for the word, where shifting every pair costs 3. zz: 1024 + zero in
// both halves; zh: -(64 + zero) in both halves.
__device__ __forceinline__ void int4_word_to_f16(uint32_t w, uint32_t zz, uint32_t zh, uint32_t (&o)[4]) {
    const __half2 sixteenth = __halves2half2(__ushort_as_half(0x2c00), __ushort_as_half(0x2c00));
    const __half2 z = *reinterpret_cast<const __half2*>(&zz), zhi = *reinterpret_cast<const __half2*>(&zh);
    const uint32_t w8 = w >> 8;
    const uint32_t a = (w & 0x000f000fu) | 0x64006400u, b = (w & 0x00f000f0u) | 0x64006400u;
    const uint32_t c = (w8 & 0x000f000fu) | 0x64006400u, d = (w8 & 0x00f000f0u) | 0x64006400u;
    const __half2 r0 = __hsub2(*reinterpret_cast<const __half2*>(&a), z);
    const __half2 r1 = __hfma2(*reinterpret_cast<const __half2*>(&b), sixteenth, zhi);
    const __half2 r2 = __hsub2(*reinterpret_cast<const __half2*>(&c), z);
    const __half2 r3 = __hfma2(*reinterpret_cast<const __half2*>(&d), sixteenth, zhi);
    o[0] = *reinterpret_cast<const uint32_t*>(&r0);
    o[1] = *reinterpret_cast<const uint32_t*>(&r1);
    o[2] = *reinterpret_cast<const uint32_t*>(&r2);
    o[3] = *reinterpret_cast<const uint32_t*>(&r3);
}

// A zero point's constants for int4_word_to_f16, in both halves: 1024 + z (zz) and -(64 + z) (zh).
__device__ __forceinline__ uint32_t int4_zz(uint32_t z) {
    return 0x00010001u * (0x6400u + z);
}
__device__ __forceinline__ uint32_t int4_zh(uint32_t z) {
    return 0x00010001u * (0xd400u + 16u * z);
}

// int4 rows of the batched step's and the prefill's expert kernels: where a lane's rows (tile mt, row g + 8
// h) keep their groups' scales and zero points (null: the symmetric 8).
template <int MT>
struct Int4Rows {
    const float* scale[MT][2] = {};
    const uint8_t* zero[MT][2] = {};
};

__device__ __forceinline__ uint32_t f16x2_bits(__half2 h) {
    return *reinterpret_cast<uint32_t*>(&h);
}

// One super-step of one tile into c. The weights are the A operand: a lane's 16 bytes of A's rows g (wa)
// and g + 8 (wb; tile_rows says which matrix rows they are) give a0/a2 and a1/a3 of its MMAs; x's f16 hi and
// lo halves are B's columns 0 and 1 (lanes g = 0, 1; the other columns' products are never read). Lane (g, t
// = 0) ends with row g's two columns in c[0], c[1] and row g + 8's in c[2], c[3]. FP8 goes straight into the
// sums; int4 from zero, then times the group scales of rows g and g + 8 (sc.x, sc.y: only lanes t = 0 need
// them), its weights less the rows' zero points (za, zb).
template <Fmt F>
__device__ __forceinline__ void mma_step(float (&c)[4], uint4 wa, uint4 wb, const uint32_t (&bx)[kMmas<F>],
                                         const uint32_t (&by)[kMmas<F>], float2 sc, uint32_t za,
                                         uint32_t zb) {
    const uint32_t va[4] = {wa.x, wa.y, wa.z, wa.w}, vb[4] = {wb.x, wb.y, wb.z, wb.w};
    if constexpr (F == Fmt::kInt4) {
        // 1024 + z and -(64 + z) as f16, in both halves (int4_word_to_f16)
        const uint32_t zza = int4_zz(za), zha = int4_zh(za), zzb = int4_zz(zb), zhb = int4_zh(zb);
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            uint32_t a[4], b[4];
            int4_word_to_f16(va[i], zza, zha, a);
            int4_word_to_f16(vb[i], zzb, zhb, b);
            mma_f16(d, a[0], b[0], a[1], b[1], bx[2 * i], by[2 * i]);
            mma_f16(d, a[2], b[2], a[3], b[3], bx[2 * i + 1], by[2 * i + 1]);
        }
        c[0] = fmaf(d[0], sc.x, c[0]);
        c[1] = fmaf(d[1], sc.x, c[1]);
        c[2] = fmaf(d[2], sc.y, c[2]);
        c[3] = fmaf(d[3], sc.y, c[3]);
    } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
            mma_f16(c, fp8x2_to_f16x2(va[j] & 0xffffu), fp8x2_to_f16x2(vb[j] & 0xffffu),
                    fp8x2_to_f16x2(va[j] >> 16), fp8x2_to_f16x2(vb[j] >> 16), bx[j], by[j]);
    }
}

// The f16 hi and lo halves of four x values (already scaled): pairs (a, b) and (c, d).
struct Halves {
    uint2 hi, lo;
};
__device__ __forceinline__ Halves halves(float a, float b, float c, float d) {
    const __half2 h01 = __floats2half2_rn(a, b), h23 = __floats2half2_rn(c, d);
    const float2 b01 = __half22float2(h01), b23 = __half22float2(h23);
    const __half2 l01 = __floats2half2_rn(a - b01.x, b - b01.y),
                  l23 = __floats2half2_rn(c - b23.x, d - b23.y);
    return {make_uint2(f16x2_bits(h01), f16x2_bits(h23)), make_uint2(f16x2_bits(l01), f16x2_bits(l23))};
}

// x staged as B pairs: for super-step s, part (0 hi, 1 lo), lane column t, MMA j: the uint2 (b0, b1) of the
// x values that lane t's weights meet in MMA j, laid out [s][part][t][j]. FP8: MMA j takes bytes 4j..4j+3
// of the lane's 16 (b0 = x 0, 1; b1 = x 2, 3). int4: word i of the lane's 16 bytes holds 8 weights, nibble m
// at bits 4m; MMA 2i + h takes nibbles (2h, 2h + 4) as a0 and (2h + 1, 2h + 5) as a2. x past K (int4's
// short last group) is zero. Returns the block's sum of x^2 (norm only; every thread gets it).
template <Fmt F>
__device__ __forceinline__ float stage_x(const QuantParams& p, const float* x, uint2* xs, float* red) {
    constexpr int C = F == Fmt::kInt4 ? 8 : 4;  // x values per thread per round
    const int Kp = (p.K + kStepK<F> - 1) / kStepK<F> * kStepK<F>;
    float ss = 0.0f;
    for (int e = threadIdx.x; e < Kp / C; e += kWarps * 32) {
        const int k = C * e;
        const bool in_k = F == Fmt::kFp8 || k < p.K;  // (FP8: K is a multiple of the super-step)
        float f[C];
#pragma unroll
        for (int q = 0; q < C; q += 4) {
            float4 v = in_k ? __ldg(reinterpret_cast<const float4*>(x + k + q)) : make_float4(0, 0, 0, 0);
            if (p.norm && in_k) {
                ss = fmaf(v.x, v.x, fmaf(v.y, v.y, fmaf(v.z, v.z, fmaf(v.w, v.w, ss))));
                if (p.norm_w) {
                    const uint2 n = __ldg(reinterpret_cast<const uint2*>(p.norm_w + k + q));
                    v.x *= bf16_lo(n.x);
                    v.y *= bf16_hi(n.x);
                    v.z *= bf16_lo(n.y);
                    v.w *= bf16_hi(n.y);
                }
            }
            f[q] = v.x * 0.0625f;
            f[q + 1] = v.y * 0.0625f;
            f[q + 2] = v.z * 0.0625f;
            f[q + 3] = v.w * 0.0625f;
        }
        const int s = k / kStepK<F>, r = k % kStepK<F>;
        if constexpr (F == Fmt::kInt4) {
            const int t = r >> 5, i = (r >> 3) & 3;  // 8 values: word i of lane t, MMAs 2i and 2i + 1
            const Halves h0 = halves(f[0], f[4], f[1], f[5]), h1 = halves(f[2], f[6], f[3], f[7]);
            uint4* hi = reinterpret_cast<uint4*>(xs + ((s * 2 + 0) * 4 + t) * kMmas<F> + 2 * i);
            uint4* lo = reinterpret_cast<uint4*>(xs + ((s * 2 + 1) * 4 + t) * kMmas<F> + 2 * i);
            *hi = make_uint4(h0.hi.x, h0.hi.y, h1.hi.x, h1.hi.y);
            *lo = make_uint4(h0.lo.x, h0.lo.y, h1.lo.x, h1.lo.y);
        } else {
            const int t = r >> 4, j = (r >> 2) & 3;
            const Halves h = halves(f[0], f[1], f[2], f[3]);
            xs[((s * 2 + 0) * 4 + t) * kMmas<F> + j] = h.hi;
            xs[((s * 2 + 1) * 4 + t) * kMmas<F> + j] = h.lo;
        }
    }
    if (!p.norm) return 0.0f;
    return block_sum(ss, red);
}

// a[s] by selects: indexing the kernel's parameters at run time would copy them to local memory
template <class T>
__device__ __forceinline__ T pick(const T (&a)[3], int s) {
    return s == 0 ? a[0] : s == 1 ? a[1] : a[2];
}

// Bytes of one row's weights.
template <Fmt F>
__host__ __device__ __forceinline__ int64_t row_bytes(int K) {
    return F == Fmt::kInt4 ? K / 2 : K;
}

// The slot's expert: its first row in the matrices (0 without experts), or -1 where none is held.
__device__ __forceinline__ int64_t expert_row(const QuantParams& p, int slot) {
    if (!p.group_expert) return 0;
    const int e = p.group_expert[slot];
    return e < 0 ? -1 : static_cast<int64_t>(e) * p.expert_rows;
}

// Where row r (of all the segments) lives: its segment, its row in the segment and in the matrix (the
// expert's rows first; erow from expert_row, >= 0).
struct RowAt {
    int seg, local;
    int64_t row;
};
__device__ __forceinline__ RowAt row_at(const QuantParams& p, int r, int64_t erow) {
    RowAt a;
    a.seg = 0;  // (no loop: the tiles must stay in registers)
    if (p.nseg > 1 && r >= p.seg_end[0]) a.seg = 1;
    if (p.nseg > 2 && r >= p.seg_end[1]) a.seg = 2;
    a.local = r - (a.seg == 0 ? 0 : a.seg == 1 ? p.seg_end[0] : p.seg_end[1]);
    a.row = erow + a.local;
    return a;
}

// Output rows of a tile: 16 (the MMA's A rows), or with Geglu 8, whose gate rows are A's rows 0..7 and
// whose up rows are A's rows 8..15 (so a lane's C holds both halves of its output row).
template <bool Geglu>
constexpr int kTileRows = Geglu ? 8 : 16;

// What a lane streams of tile `tile` (output rows kTileRows tile on, of all the segments, one segment's):
// the weights of A's rows g (lo) and g + 8 (hi), and for int4 their group scales (slo, shi) and zero points
// (zlo, zhi; null: 8). With Geglu row g of the gate and of the up; otherwise rows g and g + 8 of the matrix,
// whose hi pointers the kernel makes from lo (8 rows on: fewer registers), leaving these null.
struct TileRows {
    const uint4* lo = nullptr;
    const uint4* hi = nullptr;
    const float* slo = nullptr;
    const float* shi = nullptr;
    const uint8_t* zlo = nullptr;
    const uint8_t* zhi = nullptr;
};
template <Fmt F, bool Geglu>
__device__ __forceinline__ TileRows tile_rows(const QuantParams& p, int tile, int64_t erow, int g) {
    TileRows tr;
    const RowAt at = row_at(p, tile * kTileRows<Geglu>, erow);
    const QuantMatrix m = pick(p.m, at.seg), mh = Geglu ? p.m2 : m;
    const int64_t rlo = at.row + g, rhi = Geglu ? rlo : rlo + 8;
    tr.lo = reinterpret_cast<const uint4*>(m.q + rlo * row_bytes<F>(p.K));
    if constexpr (Geglu) tr.hi = reinterpret_cast<const uint4*>(mh.q + rhi * row_bytes<F>(p.K));
    if constexpr (F == Fmt::kInt4) {
        const int64_t G = int4_groups(p.K);
        tr.slo = m.scale + rlo * G;
        tr.zlo = m.zero ? m.zero + rlo * G : nullptr;
        if constexpr (Geglu) {
            tr.shi = mh.scale + rhi * G;
            tr.zhi = mh.zero ? mh.zero + rhi * G : nullptr;
        }
    }
    return tr;
}

// The B pairs of super-step s for lane (g < 2, t): x's f16 hi (g = 0) or lo (g = 1) halves (stage_x's
// layout), B's columns 0 and 1.
template <Fmt F>
__device__ __forceinline__ void x_fragments(const uint2* xs, int s, int g, int t, uint32_t (&bx)[kMmas<F>],
                                            uint32_t (&by)[kMmas<F>]) {
    const uint2* src = xs + ((s * 2 + g) * 4 + t) * kMmas<F>;
#pragma unroll
    for (int j = 0; j < kMmas<F>; j += 2) {
        const uint4 a = *reinterpret_cast<const uint4*>(src + j);
        bx[j] = a.x;
        by[j] = a.y;
        bx[j + 1] = a.z;
        by[j + 1] = a.w;
    }
}

// One register buffer of a warp's loads: U super-steps of A's rows g (wa) and g + 8 (wb), int4's group scales
// of both rows (sc; lanes t = 0 only) and their zero points, a byte each packed in words (step u's at bytes
// 2u, 2u + 1). The kernel keeps two: the next set's loads in flight while this one's MMAs run.
template <Fmt F, int U>
struct StepSet {
    static constexpr int kZeroWords = (2 * U + 3) / 4;
    uint4 wa[U], wb[U];
    float2 sc[U];
    uint32_t z[kZeroWords];
};

// Where a warp's super-steps of a tile end and how its row g + 8 lies from row g: the up's row g (Geglu:
// q8 = g8 = 0), else 8 rows on in the matrix, q8 16-byte chunks and g8 groups (offsets: fewer registers).
struct StepRange {
    int s_hi, nss_row, q8, g8;
};

// Loads super-steps base .. base + U - 1 (those below s_hi) of lane (g, t)'s rows into b.
template <Fmt F, int U, bool Geglu>
__device__ __forceinline__ void load_steps(StepSet<F, U>& b, const TileRows& tr, const StepRange& r, int base,
                                           int t) {
    // a zero point of group s (off: g8 for row g + 8), 8 where the matrix has none
    auto zero_of = [&](const uint8_t* zp, int off, int s, bool in) {
        return in && zp ? static_cast<uint32_t>(__ldg(zp + off + s)) : 8u;
    };
    if constexpr (F == Fmt::kInt4)
#pragma unroll
        for (int i = 0; i < StepSet<F, U>::kZeroWords; ++i) b.z[i] = 0;
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int s = base + u;
        // (int4's short last group: the lanes past K load nothing)
        const bool ok = s < r.s_hi && (F == Fmt::kFp8 || s * 4 + t < r.nss_row);
        const uint4 none = make_uint4(0, 0, 0, 0);
        b.wa[u] = ok ? ld_stream(tr.lo + s * 4 + t) : none;
        b.wb[u] = ok ? ld_stream((Geglu ? tr.hi : tr.lo) + r.q8 + s * 4 + t) : none;
        if constexpr (F == Fmt::kInt4) {
            const bool in = s < r.s_hi, sin = in && t == 0;  // (the scales: lanes t = 0 only)
            const int at = 16 * u, w = at / 32, sh = at % 32;
            b.sc[u] =
                sin ? make_float2(__ldg(tr.slo + s), __ldg((Geglu ? tr.shi : tr.slo) + r.g8 + s)) : float2{};
            b.z[w] |= zero_of(tr.zlo, 0, s, in) << sh | zero_of(Geglu ? tr.zhi : tr.zlo, r.g8, s, in)
                                                            << (sh + 8);
        }
    }
}

// The MMAs of b's super-steps (base .. below s_hi) into c, x's B pairs from xs.
template <Fmt F, int U>
__device__ __forceinline__ void mma_steps(float (&c)[4], const StepSet<F, U>& b, const uint2* xs, int base,
                                          int s_hi, int g, int t) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int s = base + u;
        if (s >= s_hi) break;
        // B columns 2..7 (lanes g >= 2) are left as they are: their C columns are never read, so what they
        // hold does not matter, and loading or zeroing them would cost wavefronts or moves
        uint32_t bx[kMmas<F>], by[kMmas<F>];
        if (g < 2) x_fragments<F>(xs, s, g, t, bx, by);
        const int at = 16 * u, sh = at % 32;
        const uint32_t zw = F == Fmt::kInt4 ? b.z[at / 32] : 0u;
        mma_step<F>(c, b.wa[u], b.wb[u], bx, by, b.sc[u], (zw >> sh) & 0xffu, (zw >> (sh + 8)) & 0xffu);
    }
}

// Row r's output zero (a slot of another rank's expert).
__device__ __forceinline__ void store_zero(const QuantParams& p, int r, int slot) {
    const RowAt at = row_at(p, r, 0);
    pick(p.y, at.seg)[static_cast<int64_t>(slot) * p.out_stride + at.local] = 0.0f;
}

// Row r's output (of all the segments; the expert's from erow >= 0): a (Geglu: gelu(a) * b), its sums
// already scaled by x's norm, times FP8's row scales (int4's are in the sums).
template <Fmt F, bool Geglu>
__device__ __forceinline__ void store_row(const QuantParams& p, int r, int64_t erow, int slot, float a,
                                          float b) {
    const RowAt at = row_at(p, r, erow);
    float* y = pick(p.y, at.seg) + static_cast<int64_t>(slot) * p.out_stride + at.local;
    if constexpr (F == Fmt::kFp8) {
        a *= __ldg(pick(p.m, at.seg).scale + at.row);
        if constexpr (Geglu) b *= __ldg(p.m2.scale + at.row);
    }
    *y = Geglu ? gelu_tanh(a) * b : a;
}

}  // namespace markbase::cuda::quant
