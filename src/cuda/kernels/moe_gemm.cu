// The MoE's experts over a prefill chunk on the tensor cores, grouped on the device (after moe_bucket): no
// host in the loop and no padding to a bucket's row count. A block computes 128 weight rows of one expert
// against a column tile of BN (32) of that expert's entries; the experts' column tiles are counted and
// scanned in every block from group_off, so the grid (row tiles x an upper bound on the column tiles) needs
// no plan. The tokens' inputs are read in place (a tile's rows are entries / K of the per-token rows).
//
// bf16 rows: mma.sync m16n8k16 on bf16, the weight rows A (16 rows a tile), the entries' inputs B as both
// bf16 halves (hi, lo) of each fp32 input into one fp32 accumulator, as every other prefill product (the
// exact engine's products to ~2^-17 of the input). FP8 rows (e4m3, a scale per row): on f16, the inputs
// one f16 of x / 16 as the decode's kernels take them, each lane's 4 weight bytes converted to two f16
// pairs (mma_stage_fp8). int4 rows (a scale and zero point per group of 128): the same inputs, each lane's
// 2 weight bytes as two f16 pairs of (nibble - zero) (mma_stage_int4), a group's sums (two stages) into the
// accumulators times the rows' scales. Both operands stream through a 3-stage cp.async ring of 64 k a
// stage; shared rows are XOR-swizzled in 16-byte chunks so that a warp's loads of 8 rows hit distinct
// banks.
//
// gate/up: the block's rows are 64 gate rows and the same 64 up rows (each warp holds a gate tile and its
// up tile, so GeGLU is applied in registers) and its output is the down pass's input, h = gelu(gate) * up in
// entry order. down: 128 rows of H, written to the entry's (token, slot) row of out.
#include <algorithm>

#include "cuda/check.h"
#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"
#include "cuda/kernels/launch.h"
#include "cuda/kernels/smem_ring.cuh"

namespace markbase::cuda {

namespace {

constexpr int kRows = 128;     // weight rows a block (gate/up: 64 gate rows and their 64 up rows)
constexpr int kKc = 64;        // k a stage: a 128-byte shared row of bf16
constexpr int kStages = 3;     // the cp.async ring
constexpr int kThreads = 256;  // 8 warps: 4 row groups x 2 entry halves
constexpr int kMaxExperts = 256;

using Fmt = WeightFormat;

// The block's column tile: blockIdx.y counts the experts' tiles of BN entries in expert order (the first
// warp scans the counts into s_off); false past the last. e is the expert, [j0, j0 + nj) its entries.
template <int BN>
__device__ bool find_tile(const int* group_off, int E, int* s_off, int& e, int& j0, int& nj) {
    constexpr int kPer = kMaxExperts / 32;
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        int cnt[kPer], sum = 0;
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
            const int x = lane * kPer + i;
            cnt[i] = x < E ? (group_off[x + 1] - group_off[x] + BN - 1) / BN : 0;
            sum += cnt[i];
        }
        int incl = sum;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int v = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += v;
        }
        int run = incl - sum;
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
            s_off[lane * kPer + i] = run;
            run += cnt[i];
        }
        if (lane == 31) s_off[kMaxExperts] = incl;
    }
    __syncthreads();
    const int y = static_cast<int>(blockIdx.y);
    if (y >= s_off[kMaxExperts]) return false;
    int lo = 0, hi = E - 1;  // the last expert whose first tile is <= y holds tile y (it has tiles)
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (s_off[mid] <= y)
            lo = mid;
        else
            hi = mid - 1;
    }
    e = lo;
    j0 = group_off[e] + (y - s_off[e]) * BN;
    nj = min(BN, group_off[e + 1] - j0);
    return true;
}

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
}

// int4 rows: where the lane's rows (tile m, row g + 8 h) keep their groups' scales and zero points (null:
// the symmetric 8).
struct Int4Rows {
    const float* scale[2][2] = {};
    const uint8_t* zero[2][2] = {};
};

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
                    zz[m][h] = 0x00010001u * (0x6400u + z);
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

// The input rows of the block's column tile: row r is input row row_of(j0 + r) of x (width ld).
template <int BN, class RowOf>
__device__ __forceinline__ void input_rows(Operands<BN>& op, const uint16_t* x, int64_t ld, int j0, int nj,
                                           RowOf row_of) {
#pragma unroll
    for (int i = 0; i < BN / 32; ++i) {
        const int r = (threadIdx.x >> 3) + 32 * i;
        op.x_ok[i] = r < nj;
        op.x[i] = x + static_cast<int64_t>(row_of(j0 + (r < nj ? r : 0))) * ld;
    }
}

// The experts' weights as the kernels take them: bf16 rows, e4m3 rows with a scale each (FP8), or int4 rows
// with a scale and zero point (or none: symmetric) per group of 128 (int4).
struct Weights {
    const uint8_t* w;    // [E][rows][K] of bf16 (2 bytes a value) or e4m3, or [E][rows][K / 2] nibbles
    const float* scale;  // FP8: [E][rows]; int4: [E][rows][(K + 127) / 128]
    const uint8_t* zero = nullptr;  // int4: as the scales, or null
};

// int4: the lane's rows' scale and zero-point rows, given each row tile m's first row (of the expert's
// matrix, eb its first) and the K width.
__device__ __forceinline__ Int4Rows int4_rows(const Weights& w, int64_t eb, const int (&row0)[2], int K) {
    const int g = (threadIdx.x & 31) >> 2, G = (K + 127) / 128;
    Int4Rows r;
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int64_t row = eb + row0[m] + g + 8 * h;
            r.scale[m][h] = w.scale + row * G;
            r.zero[m][h] = w.zero ? w.zero + row * G : nullptr;
        }
    return r;
}

// gate/up: x [n][H] per token (bf16: hi, then lo at n H; FP8: f16 of x / 16), w [E][gate Ie | up Ie][H];
// h [entries][Ie] in entry order (bf16: hi, then lo at entries Ie; FP8: f16 of h / 16).
template <int BN, Fmt F>
__global__ void __launch_bounds__(kThreads)
    gate_up_kernel(const uint16_t* x, int64_t x_lo, int H, int K, Weights w, int Ie, const int* group_expert,
                   const int* group_off, const int* entries, int E, uint16_t* h, int64_t h_lo) {
    constexpr bool Fp8 = F == Fmt::kFp8, Int4 = F == Fmt::kInt4;
    constexpr int NT = BN / 16;
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ int s_off[kMaxExperts + 1];
    pdl_begin();
    int e = 0, j0 = 0, nj = 0;
    if (!find_tile<BN>(group_off, E, s_off, e, j0, nj)) return;
    const int we = group_expert[e];
    if (we < 0) return;  // another rank's expert: its down pass writes the zeros
    const int r0 = blockIdx.x * (kRows / 2);
    const int64_t eb = static_cast<int64_t>(we) * 2 * Ie;  // the expert's first row
    const int64_t row_bytes = Int4 ? H / 2 : Fp8 ? H : 2 * int64_t{H};
    Operands<BN> op;
    op.lo_off = x_lo;
    const int rows_per = Int4  ? 128
                         : Fp8 ? 64
                               : 32,
              rt = Int4  ? threadIdx.x >> 1
                   : Fp8 ? threadIdx.x >> 2
                         : threadIdx.x >> 3;
#pragma unroll
    for (int i = 0; i < (Int4 ? 1 : Fp8 ? 2 : 4); ++i) {
        const int r = rt + rows_per * i;  // < 64: gate row r0 + r, else up row r0 + r - 64
        op.w[i] = w.w + (eb + (r < 64 ? r0 + r : Ie + r0 + r - 64)) * row_bytes;
    }
    input_rows<BN>(op, x, H, j0, nj, [&](int j) { return entries[j] / K; });
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wm = warp & 3, wn = warp >> 2;
    float acc[2][NT][4];
    if constexpr (Int4) {
        const int first[2] = {r0 + 16 * wm, Ie + r0 + 16 * wm};  // the warp's gate rows, its up rows
        block_mma_int4<BN, NT>(acc, shared_addr(smem), op, H, 16 * wm, 64 + 16 * wm, wn * (BN / 2),
                               int4_rows(w, eb, first, H));
    } else {
        block_mma<BN, Fp8, NT>(acc, shared_addr(smem), op, H, 16 * wm, 64 + 16 * wm, wn * (BN / 2));
    }
    const int g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int v = 0; v < 4; ++v) {
        const int col = r0 + 16 * wm + g + (v >= 2 ? 8 : 0);
        const float sg = Fp8    ? 16.0f * w.scale[eb + col]
                         : Int4 ? 16.0f
                                : 1.0f,
                    su = Fp8    ? 16.0f * w.scale[eb + Ie + col]
                         : Int4 ? 16.0f
                                : 1.0f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const int t = wn * (BN / 2) + nt * 8 + 2 * q + (v & 1);
            if (t >= nj) continue;
            const float hv = gelu_tanh(sg * acc[0][nt][v]) * (su * acc[1][nt][v]);
            const int64_t o = static_cast<int64_t>(j0 + t) * Ie + col;
            if constexpr (F != Fmt::kBf16)
                store_f16_sixteenth(hv, h, o);
            else
                split_store(hv, h, h + h_lo, o);
        }
    }
}

// down: h [entries][Ie] as gate_up_kernel writes it, w [E][H][Ie]; out[entry][H] at the entry's (token,
// slot) row.
template <int BN, Fmt F>
__global__ void __launch_bounds__(kThreads)
    down_kernel(const uint16_t* h, int64_t h_lo, int Ie, Weights w, int H, const int* group_expert,
                const int* group_off, const int* entries, int E, float* out) {
    constexpr bool Fp8 = F == Fmt::kFp8, Int4 = F == Fmt::kInt4;
    constexpr int NT = BN / 16;
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ int s_off[kMaxExperts + 1];
    pdl_begin();
    int e = 0, j0 = 0, nj = 0;
    if (!find_tile<BN>(group_off, E, s_off, e, j0, nj)) return;
    const int r0 = blockIdx.x * kRows;
    const int we = group_expert[e];
    if (we < 0) {  // another rank's expert: this rank's share of its entries is zero
        for (int i = threadIdx.x; i < nj * kRows; i += kThreads)
            out[static_cast<int64_t>(entries[j0 + i / kRows]) * H + r0 + i % kRows] = 0.0f;
        return;
    }
    const int64_t eb = static_cast<int64_t>(we) * H;
    const int64_t row_bytes = Int4 ? Ie / 2 : Fp8 ? Ie : 2 * int64_t{Ie};
    Operands<BN> op;
    op.lo_off = h_lo;
    const int rows_per = Int4  ? 128
                         : Fp8 ? 64
                               : 32,
              rt = Int4  ? threadIdx.x >> 1
                   : Fp8 ? threadIdx.x >> 2
                         : threadIdx.x >> 3;
#pragma unroll
    for (int i = 0; i < (Int4 ? 1 : Fp8 ? 2 : 4); ++i)
        op.w[i] = w.w + (eb + r0 + rt + rows_per * i) * row_bytes;
    input_rows<BN>(op, h, Ie, j0, nj, [](int j) { return j; });
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wm = warp & 3, wn = warp >> 2;
    const int g = lane >> 2, q = lane & 3;
    float acc[2][NT][4];
    if constexpr (Int4) {
        const int first[2] = {r0 + 32 * wm, r0 + 32 * wm + 16};
        block_mma_int4<BN, NT>(acc, shared_addr(smem), op, Ie, 32 * wm, 32 * wm + 16, wn * (BN / 2),
                               int4_rows(w, eb, first, Ie));
    } else {
        block_mma<BN, Fp8, NT>(acc, shared_addr(smem), op, Ie, 32 * wm, 32 * wm + 16, wn * (BN / 2));
    }
#pragma unroll
    for (int v = 0; v < 4; ++v)
#pragma unroll
        for (int m = 0; m < 2; ++m) {
            const int row = r0 + 32 * wm + 16 * m + g + (v >= 2 ? 8 : 0);
            const float sc = Fp8 ? 16.0f * w.scale[eb + row] : Int4 ? 16.0f : 1.0f;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const int t = wn * (BN / 2) + nt * 8 + 2 * q + (v & 1);
                if (t < nj) out[static_cast<int64_t>(entries[j0 + t]) * H + row] = sc * acc[m][nt][v];
            }
        }
}

template <int BN, Fmt F>
constexpr size_t smem_bytes() {
    return static_cast<size_t>(kStages) * stage_bytes<BN, F>();
}
// Over the 48 KB default: the limit belongs to the current device's context, so every model raises it where
// it is built (moe_gemm_prepare, as gemv_prepare does its kernels').
template <int BN, Fmt F>
void allow_smem() {
    CUDA_CHECK(cudaFuncSetAttribute(gate_up_kernel<BN, F>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem_bytes<BN, F>())));
    CUDA_CHECK(cudaFuncSetAttribute(down_kernel<BN, F>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem_bytes<BN, F>())));
}

template <int BN, Fmt F>
void launch_experts(const float* x, int H, int K, int n, Weights gate_up, Weights down, int Ie,
                    const int* group_expert, const int* group_off, const int* entries, int E,
                    uint16_t* x_rows, uint16_t* h, float* out, cudaStream_t s) {
    constexpr size_t kSmem = smem_bytes<BN, F>();
    const int entries_n = n * K;
    const int64_t x_lo = static_cast<int64_t>(n) * H, h_lo = static_cast<int64_t>(entries_n) * Ie;
    if constexpr (F != Fmt::kBf16)
        f16_rows(x, H, H, n, false, nullptr, 0.0f, x_rows, s);
    else
        split_rows(x, H, H, n, false, nullptr, 0.0f, x_rows, x_rows + x_lo, s);
    // every expert's tiles: at most one partial tile per expert beside the full ones
    const unsigned tiles = static_cast<unsigned>(E + entries_n / BN);
    launch_kernel(gate_up_kernel<BN, F>, dim3(Ie / (kRows / 2), tiles), dim3(kThreads), kSmem, s, x_rows,
                  x_lo, H, K, gate_up, Ie, group_expert, group_off, entries, E, h, h_lo);
    launch_kernel(down_kernel<BN, F>, dim3(H / kRows, tiles), dim3(kThreads), kSmem, s, h, h_lo, Ie, down, H,
                  group_expert, group_off, entries, E, out);
}

}  // namespace

void moe_gemm_prepare() {
    allow_smem<32, Fmt::kBf16>();
    allow_smem<32, Fmt::kFp8>();
    allow_smem<32, Fmt::kInt4>();
}

bool moe_gemm_fits(int H, int Ie, int E) {
    return H % kRows == 0 && Ie % kKc == 0 && E <= kMaxExperts;  // (kRows is a multiple of kKc)
}

void moe_gemm_experts(const float* x, int H, int K, int n, const ExpertRows& gate_up, const ExpertRows& down,
                      int Ie, const int* group_expert, const int* group_off, const int* entries, int E,
                      bf16* x_rows, bf16* h, float* out, cudaStream_t s) {
    if (!moe_gemm_fits(H, Ie, E)) throw Error("internal: moe_gemm_experts at widths it does not take");
    if (n * K == 0) return;
    // Column tiles of 32 entries. Tiles of 64 (half the input bytes per weight byte, but twice the MMAs
    // on a tile's empty columns and 2 blocks a SM instead of 3) measured slower with bf16 rows (H200,
    // 26B-A4B prefill of 512: experts 18.38 against 16.46 ms) and even with FP8 rows (26.8 against 27.0 ms
    // for the whole prefill).
    if (gate_up.fp8.q && down.fp8.q) {
        launch_experts<32, Fmt::kFp8>(x, H, K, n, {gate_up.fp8.q, gate_up.fp8.scale},
                                      {down.fp8.q, down.fp8.scale}, Ie, group_expert, group_off, entries, E,
                                      x_rows, h, out, s);
    } else if (gate_up.int4.q && down.int4.q) {
        launch_experts<32, Fmt::kInt4>(x, H, K, n, {gate_up.int4.q, gate_up.int4.scale, gate_up.int4.zero},
                                       {down.int4.q, down.int4.scale, down.int4.zero}, Ie, group_expert,
                                       group_off, entries, E, x_rows, h, out, s);
    } else {  // (both read the bf16 rows where either has none)
        launch_experts<32, Fmt::kBf16>(x, H, K, n, {reinterpret_cast<const uint8_t*>(gate_up.w), nullptr},
                                       {reinterpret_cast<const uint8_t*>(down.w), nullptr}, Ie, group_expert,
                                       group_off, entries, E, x_rows, h, out, s);
    }
}

}  // namespace markbase::cuda
