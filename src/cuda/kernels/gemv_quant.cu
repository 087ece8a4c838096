// Quantised weights at one token on the tensor cores: y = W @ x, W FP8 e4m3 with a scale per row
// (model/fp8.h) or int4 with a scale (and zero point) per group of 128 weights along K (model/int4.h). Why
// the tensor cores for a GEMV: at one byte per weight the CUDA-core kernels (a float conversion, a multiply
// and an add per weight, fp32 x read per weight) were bound by instructions and L1, not memory: the kernel
// lab (bench/kernels/quant_gemv_lab.cu) streamed FP8 at 1.2-1.9 TB/s, slower per weight than bf16 at 3.7-4.3
// TB/s. Here the weights become f16 pairs in one or two instructions (e4m3x2 -> f16x2 in hardware; a nibble
// pair OR 0x6400 is 1024 + n exactly, less 1024 + zero: quant_operands.cuh's int4_word_to_f16) and mma.sync
// m16n8k16 does 16 x 8 x 16 multiply-adds in another: the weights are the A operand (16 rows a tile), x B's
// first two columns (its f16 high and low halves, so x keeps ~22 bits), the other 6 columns never read.
// (The weights as B, 8 rows a tile against x as A's first two rows, took twice the MMAs and x fragments a
// byte: int4 ran issue-bound at 2.0-2.1 TB/s; docs/performance.md.)
//  - A lane's two 16-byte loads are 16 FP8 or 32 int4 weights of rows g = lane / 4 and g + 8; the 4 lanes of
//    a row cover a "super-step" of 64 bytes: 64 FP8 weights (4 MMAs a lane for both rows), or 128 int4
//    weights (8 MMAs), one group.
//    Both sides of each MMA take their k in the same (permuted) order, so the loads feed the fragments
//    as they are; x is staged in that order.
//  - int4: each super-step's MMAs start from zero and are added into the sums times the rows' group scales
//    (fp32), so the weights enter the MMA as exact small integers; a row's last group may be shorter (K a
//    multiple of 64: the 26B-A4B's 704- and 2112-wide inputs), its missing half zero on both sides.
//  - Persistent blocks: at most 2 a SM, each staging x once and walking tiles of 16 rows, KS warps a tile
//    (each a contiguous K / KS of it; KS the fewest that give every warp work), every block the same number
//    of rounds. A block per tile (the kernel before, the lab's v3 the step between) staged all of x for 8-32
//    rows and lived about as long as that prologue: on the 31B's int4 q/k/v a warp walked ~5 super-steps.
//  - x is staged in shared memory as the MMA's B pairs, scaled by 2^-4 (f16's range then holds |x| up to
//    10^6 and resolves 2^-20 absolute), the input norm's weight folded in; the norm's sum of squares is a
//    block reduction there.
//  - The weights' first U super-steps are loaded before the PDL wait (they never depend on the previous
//    kernel), then x is staged, then the MMAs, each set of loads issued before the previous set's MMAs (two
//    register buffers; int4's group scales and zero points loaded beside the weights). A tile's steps are
//    padded to pairs of buffers, so the warp's next tile is loaded while its last set multiplies. A tile's
//    KS warps meet in shared memory behind a named barrier of their own, summed in a fixed order.
//  - Experts (the MoE's decode): grid.y is the slot, its rows those of expert group_expert[slot].
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/check.h"
#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"
#include "cuda/kernels/launch.h"
#include "cuda/kernels/quant_operands.cuh"

namespace markbase::cuda {

namespace {

using namespace quant;  // NOLINT: the kernel's own pieces (quant_operands.cuh)

// Shared memory: x staged, Kp * 4 bytes.
template <Fmt F>
__host__ __device__ constexpr int64_t padded_k(int K) {
    return (K + kStepK<F> - 1) / kStepK<F> * kStepK<F>;
}

// Blocks per SM the registers must allow: 2 (16 warps, each with its next loads in flight while it multiplies
// the last ones, cover the memory's latency).
constexpr int kMinBlocks = 2;

__device__ __forceinline__ void bar_named(int id, int threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// A tile's sums (c; Geglu's up c2) out: lane (g, t = 0) holds rows g (x's hi and lo columns in c[0], c[1])
// and g + 8 (c[2], c[3]) of the tile. With KS > 1 the tile's warps meet in `part` (this round's half) behind
// a named barrier of their own (the block's other tiles run on), the first adding the parts in a fixed order
// (deterministic).
template <Fmt F, int KS, bool Geglu>
__device__ __forceinline__ void finish_tile(const QuantParams& p, const float (&c)[4], const float (&c2)[4],
                                            float (*part)[kTileRows][Geglu ? 2 : 1], int warp, int lane,
                                            int tile, int64_t erow, int slot, float inv) {
    const int g = lane >> 2, row = tile * kTileRows;
    const float r[2][2] = {{c[0] + c[1], Geglu ? c2[0] + c2[1] : 0.0f},
                           {c[2] + c[3], Geglu ? c2[2] + c2[3] : 0.0f}};
    if constexpr (KS == 1) {
        if ((lane & 3) == 0)
#pragma unroll
            for (int e = 0; e < 2; ++e)
                store_row<F, Geglu>(p, row + g + 8 * e, erow, slot, r[e][0] * inv, r[e][1] * inv);
    } else {
        if ((lane & 3) == 0)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                part[warp][g + 8 * e][0] = r[e][0];
                if constexpr (Geglu) part[warp][g + 8 * e][Geglu ? 1 : 0] = r[e][1];
            }
        const int tslot = warp / KS;
        bar_named(1 + tslot, KS * 32);
        if (warp % KS == 0 && lane < kTileRows) {
            float a = 0.0f, b = 0.0f;
#pragma unroll
            for (int w = 0; w < KS; ++w) {
                a += part[tslot * KS + w][lane][0];
                if constexpr (Geglu) b += part[tslot * KS + w][lane][Geglu ? 1 : 0];
            }
            store_row<F, Geglu>(p, row + lane, erow, slot, a * inv, b * inv);
        }
    }
}

// KS warps walk a tile of 16 rows, each K / KS of it; U super-steps per register buffer, two buffers;
// registers for MinB blocks a SM.
template <Fmt F, int KS, int U, bool Geglu, int MinB>
__global__ void __launch_bounds__(kWarps * 32, MinB) quant_mma_kernel(const QuantParams p) {
    extern __shared__ uint2 xs[];
    __shared__ float red[32];
    __shared__ float part[2][kWarps][kTileRows][Geglu ? 2 : 1];
    constexpr int kSlots = kWarps / KS;  // tiles a block walks at once
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int tslot = warp / KS, ks = warp % KS, slot = blockIdx.y;
    if (p.group_expert) pdl_begin();  // the experts were chosen by the previous kernel
    const int64_t erow = expert_row(p, slot);
    const int ntiles = p.total_rows / kTileRows, stride = gridDim.x * kSlots;
    int tile = blockIdx.x * kSlots + tslot;
    if (erow < 0) {  // a slot of another rank's expert: zero rows
        if (ks == 0 && lane < kTileRows)
            for (; tile < ntiles; tile += stride) store_zero(p, tile * kTileRows + lane, slot);
        return;
    }
    const int nss_row = static_cast<int>(row_bytes<F>(p.K) / 16);  // 16-byte chunks of a row
    const int nss = (nss_row + 3) / 4, G = static_cast<int>(int4_groups(p.K));
    const int s_lo = ks * nss / KS, s_hi = (ks + 1) * nss / KS;

    // two sets of U super-steps: the next one's loads are in flight while the current one's MMAs run; rows
    // g (wa) and g + 8 (wb), Geglu's up rows (ua, ub)
    uint4 wa[2][U], wb[2][U], ua[2][U], ub[2][U];
    float2 sc[2][U], sc2[2][U];
    // int4's zero points of rows g and g + 8, a byte each, packed in words: step u's at bytes 2u and 2u + 1
    // (Geglu 4u, 4u + 1 for the gate, 4u + 2, 4u + 3 for the up)
    constexpr int kZeroWords = (U * (Geglu ? 4 : 2) + 3) / 4;
    uint32_t z[2][kZeroWords];
    TileRows<F, Geglu> tr;
    // a zero point of row g (r8 = 0) or g + 8 (r8 = 8 G on), 8 where the matrix has none (symmetric)
    auto zero_of = [&](const uint8_t* zp, int r8, int s, bool in) {
        return in && zp ? static_cast<uint32_t>(__ldg(zp + r8 + s)) : 8u;
    };
    auto load = [&](int k, int base) {
        if constexpr (F == Fmt::kInt4)
#pragma unroll
            for (int i = 0; i < kZeroWords; ++i) z[k][i] = 0;
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int s = base + u;
            // (int4's short last group: the lanes past K load nothing)
            const bool ok = s < s_hi && (F == Fmt::kFp8 || s * 4 + t < nss_row);
            const uint4 none = make_uint4(0, 0, 0, 0);
            wa[k][u] = ok ? ld_stream(tr.a + s * 4 + t) : none;
            wb[k][u] = ok ? ld_stream(tr.a + tr.r8 + s * 4 + t) : none;
            if constexpr (Geglu) {
                ua[k][u] = ok ? ld_stream(tr.b + s * 4 + t) : none;
                ub[k][u] = ok ? ld_stream(tr.b + tr.r8 + s * 4 + t) : none;
            }
            if constexpr (F == Fmt::kInt4) {
                const bool in = s < s_hi, sin = in && t == 0;  // (the scales: lanes t = 0 only)
                const int at = 8 * (Geglu ? 4 * u : 2 * u), w = at / 32, b = at % 32;
                sc[k][u] = sin ? make_float2(__ldg(tr.sa + s), __ldg(tr.sa + 8 * G + s)) : float2{};
                z[k][w] |= zero_of(tr.za, 0, s, in) << b | zero_of(tr.za, 8 * G, s, in) << (b + 8);
                if constexpr (Geglu) {
                    sc2[k][u] = sin ? make_float2(__ldg(tr.sb + s), __ldg(tr.sb + 8 * G + s)) : float2{};
                    z[k][w] |= zero_of(tr.zb, 0, s, in) << (b + 16) | zero_of(tr.zb, 8 * G, s, in)
                                                                          << (b + 24);
                }
            }
        }
    };
    if (tile < ntiles) {
        tr = tile_rows<F, Geglu>(p, tile, erow, g);
        load(0, s_lo);  // weights only: safe before the previous kernel has finished
    }
    if (!p.group_expert) pdl_begin_after_loads(p.K);  // from here on x may be touched
    const float ss = stage_x<F>(p, p.x + static_cast<int64_t>(slot) * p.x_slot_stride, xs, red);
    __syncthreads();
    // 16 undoes x's 2^-4; the norm's scale as the bf16 kernels apply it
    const float inv = p.norm ? 16.0f / sqrtf(ss / static_cast<float>(p.K) + p.eps) * p.norm_scale : 16.0f;

    bool loaded = true;
    for (int par = 0; tile < ntiles; tile += stride, par ^= 1) {
        if (!loaded) {  // (a guard: every tile after the first was loaded under the last one's set)
            tr = tile_rows<F, Geglu>(p, tile, erow, g);
            load(0, s_lo);
        }
        loaded = false;
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f}, c2[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        auto step = [&](int k, int base) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int s = base + u;
                if (s >= s_hi) break;
                // B columns 2..7 (lanes g >= 2) are left as they are: their C columns are never read, so
                // what they hold does not matter, and loading or zeroing them would cost wavefronts or moves
                uint32_t bx[kMmas<F>], by[kMmas<F>];
                if (g < 2) x_fragments<F>(xs, s, g, t, bx, by);
                const int at = 8 * (Geglu ? 4 * u : 2 * u), b = at % 32;
                const uint32_t zw = F == Fmt::kInt4 ? z[k][at / 32] : 0u;
                mma_step<F>(c, wa[k][u], wb[k][u], bx, by, sc[k][u], (zw >> b) & 0xffu,
                            (zw >> (b + 8)) & 0xffu);
                if constexpr (Geglu)
                    mma_step<F>(c2, ua[k][u], ub[k][u], bx, by, sc2[k][u], (zw >> (b + 16)) & 0xffu,
                                (zw >> (b + 24)) & 0xffu);
            }
        };
        // unrolled by two so that the buffers' index is a constant (registers, not local memory); a tile's
        // steps are padded to pairs of buffers, so its last set is always buffer 1's, and buffer 0 takes the
        // warp's next tile while it runs: the loads stay in flight across the tile's end
        for (int base = s_lo;; base += 2 * U) {
            load(1, base + U);
            step(0, base);
            const bool last = base + 2 * U >= s_hi;
            if (!last) {
                load(0, base + 2 * U);
            } else if (tile + stride < ntiles) {
                tr = tile_rows<F, Geglu>(p, tile + stride, erow, g);
                load(0, s_lo);
                loaded = true;
            }
            step(1, base + U);
            if (last) break;
        }
        finish_tile<F, KS, Geglu>(p, c, c2, part[par], warp, lane, tile, erow, slot, inv);
    }
}

template <Fmt F, int KS, int U, bool Geglu, int MinB = kMinBlocks>
void launch_ks(const QuantParams& p, int blocks, int slots, cudaStream_t s) {
    constexpr int kSlots = kWarps / KS;
    const int ntiles = p.total_rows / kTileRows;
    blocks = std::max(1, std::min(blocks, (ntiles + kSlots - 1) / kSlots));
    // every block walks the same number of rounds: the grid's last wave is not a tail of a few blocks
    const int rounds = (ntiles + blocks * kSlots - 1) / (blocks * kSlots);
    blocks = (ntiles + rounds * kSlots - 1) / (rounds * kSlots);
    const size_t smem = static_cast<size_t>(padded_k<F>(p.K) * 4);
    launch_kernel(quant_mma_kernel<F, KS, U, Geglu, MinB>, dim3(blocks, slots), dim3(kWarps * 32), smem, s,
                  p);
    CUDA_CHECK_LAUNCH();
}

// The grid: at most kMinBlocks blocks a SM in all (persistent: a block stages x once and walks tiles). U:
// super-steps per buffer, so that each of the two buffers holds kChunksInFlight 16-byte loads per lane (a
// step loads 2 rows, Geglu 4).
constexpr int kChunksInFlight = 4;
template <Fmt F, bool Geglu>
constexpr int buffer_steps() {
    return kChunksInFlight / (Geglu ? 4 : 2);
}
// int4's GeGLU (4 rows' loads, their scales and zero points a step) spills at KS = 1, where the tile's sums
// are stored from every lane t = 0: it takes KS 2 at least (a tile's K in two halves; no model's GeGLU has
// the 2 x 2 x SMs x 8 tiles that would take KS = 1 anyway)
template <Fmt F, bool Geglu>
constexpr int kMinKs = (F == Fmt::kInt4 && Geglu) ? 2 : 1;

// KS, warps a tile: the one whose busiest warp walks the fewest super-steps (its rounds of tiles times its
// share of a tile's nss; the fewer warps on a tie), a warp walking at least two super-steps. (Filling every
// warp first, the rule before, left the 31B's 1,344 GeGLU tiles at KS 2 in one round on 1,344 of 2,112
// warps, where KS 4 walks three rounds of 21 steps on all of them: 63 steps against 84.)
int choose_ks(int ntiles, int nss, int blocks, int min_ks) {
    int best = min_ks;
    int64_t best_steps = INT64_MAX;
    for (int ks = min_ks; ks <= kWarps; ks *= 2) {
        if (ks > min_ks && nss / ks < 2) break;
        const int64_t tiles_at_once = int64_t{blocks} * (kWarps / ks);
        const int64_t steps = (ntiles + tiles_at_once - 1) / tiles_at_once * ((nss + ks - 1) / ks);
        if (steps < best_steps) {
            best_steps = steps;
            best = ks;
        }
    }
    return best;
}

template <Fmt F, bool Geglu>
void launch_quant(QuantParams& p, int slots, cudaStream_t s) {
    if (p.K <= 0 || p.K % kSuper || p.K > kMaxK)
        throw Error("internal: the quantised GEMV takes input widths that are multiples of 64 up to " +
                    std::to_string(kMaxK) + ", not " + std::to_string(p.K));
    p.total_rows = 0;
    for (int i = 0; i < p.nseg; ++i) {
        const int rows = p.seg_end[i];
        if (rows % kTileRows)
            throw Error("internal: quantised GEMV segments take multiples of 16 rows, not " +
                        std::to_string(rows));
        p.seg_end[i] = (p.total_rows += rows);
    }
    if (p.total_rows == 0) return;
    const int sms = device_sms(), blocks = std::max(1, kMinBlocks * sms / slots);
    const int ntiles = p.total_rows / kTileRows;
    const int nss = static_cast<int>((row_bytes<F>(p.K) / 16 + 3) / 4);
    const int ks = choose_ks(ntiles, nss, blocks, kMinKs<F, Geglu>);
    constexpr int U = buffer_steps<F, Geglu>();
    // a tile a block on fewer blocks than SMs (E2B's o_proj and down: 96 tiles): one block a SM, so twice
    // the loads in flight a warp, where the registers of two blocks a SM would leave half the SM's loads
    // unissued
    if (ks == kWarps && int64_t{ntiles} * slots <= sms)
        return launch_ks<F, 8, 2 * U, Geglu, 1>(p, sms, slots, s);
    switch (ks) {
        case 1:
            if constexpr (kMinKs<F, Geglu> == 1) return launch_ks<F, 1, U, Geglu>(p, blocks, slots, s);
            [[fallthrough]];
        case 2:
            return launch_ks<F, 2, U, Geglu>(p, blocks, slots, s);
        case 4:
            return launch_ks<F, 4, U, Geglu>(p, blocks, slots, s);
        default:
            return launch_ks<F, 8, U, Geglu>(p, blocks, slots, s);
    }
}

template <bool Geglu>
void launch_quant(Fmt f, QuantParams& p, int slots, cudaStream_t s) {
    if (f == Fmt::kInt4) return launch_quant<Fmt::kInt4, Geglu>(p, slots, s);
    if (f == Fmt::kFp8) return launch_quant<Fmt::kFp8, Geglu>(p, slots, s);
    throw Error("internal: the quantised GEMV was given bf16 weights");
}

// The matrix from row `row` on (rows of K weights): its q, scales and zero points advanced alike.
QuantMatrix quant_rows_from(WeightFormat f, const QuantMatrix& m, int64_t row, int K) {
    if (!m.q) return m;
    if (f == WeightFormat::kInt4) {
        const int64_t G = int4_groups(K);
        return {m.q + row * (K / 2), m.scale + row * G, m.zero ? m.zero + row * G : nullptr};
    }
    return {m.q + row * K, m.scale + row, nullptr};
}

QuantParams params_of(const GemvInput& in) {
    QuantParams p;
    p.x = in.x;
    p.K = in.K;
    p.norm = in.norm;
    p.norm_w = in.norm_w;
    p.norm_scale = in.norm_scale;
    p.eps = in.eps;
    return p;
}

template <Fmt F, int KS, int U, bool Geglu, int MinB>
void allow_smem() {
    CUDA_CHECK(cudaFuncSetAttribute(quant_mma_kernel<F, KS, U, Geglu, MinB>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(padded_k<F>(kMaxK) * 4)));
}

template <Fmt F, bool Geglu>
void allow_all() {
    constexpr int U = buffer_steps<F, Geglu>();
    if constexpr (kMinKs<F, Geglu> == 1) allow_smem<F, 1, U, Geglu, kMinBlocks>();
    allow_smem<F, 2, U, Geglu, kMinBlocks>();
    allow_smem<F, 4, U, Geglu, kMinBlocks>();
    allow_smem<F, 8, U, Geglu, kMinBlocks>();
    allow_smem<F, 8, 2 * U, Geglu, 1>();
}

}  // namespace

void gemv_quant_prepare() {
    allow_all<Fmt::kFp8, false>();
    allow_all<Fmt::kFp8, true>();
    allow_all<Fmt::kInt4, false>();
    allow_all<Fmt::kInt4, true>();
}

void gemv_quant(const GemvInput& in, const GemvSeg* segs, int nseg, cudaStream_t s) {
    QuantParams p = params_of(in);
    p.nseg = nseg;
    for (int i = 0; i < nseg; ++i) {
        if (!segs[i].q.q || !segs[i].q.scale || segs[i].format != segs[0].format)
            throw Error("internal: a quantised launch mixes formats");
        p.m[i] = segs[i].q;
        p.y[i] = segs[i].y;
        p.seg_end[i] = segs[i].rows;
    }
    launch_quant<false>(segs[0].format, p, 1, s);
}

void gemv_quant_geglu(const GemvInput& in, WeightFormat f, const QuantMatrix& wg, const QuantMatrix& wu,
                      int rows, float* y, cudaStream_t s) {
    QuantParams p = params_of(in);
    p.nseg = 1;
    p.m[0] = wg;
    p.y[0] = y;
    p.seg_end[0] = rows;
    p.m2 = wu;
    launch_quant<true>(f, p, 1, s);
}

void moe_gate_up_decode_quant(WeightFormat f, const float* x, int H, const QuantMatrix& gate_up, int Ie,
                              int K, const int* group_expert, float* h, cudaStream_t s) {
    QuantParams p;
    p.x = x;
    p.K = H;
    p.nseg = 1;
    p.m[0] = gate_up;
    p.y[0] = h;
    p.seg_end[0] = Ie;
    // the up rows follow the gate rows within each expert: the same matrix Ie rows on
    p.m2 = quant_rows_from(f, gate_up, Ie, H);
    p.group_expert = group_expert;
    p.expert_rows = 2 * static_cast<int64_t>(Ie);
    p.out_stride = Ie;
    launch_quant<true>(f, p, K, s);
}

void moe_down_decode_quant(WeightFormat f, const float* h, int Ie, const QuantMatrix& down, int H, int K,
                           const int* group_expert, float* slots, cudaStream_t s) {
    QuantParams p;
    p.x = h;
    p.K = Ie;
    p.x_slot_stride = Ie;
    p.nseg = 1;
    p.m[0] = down;
    p.y[0] = slots;
    p.seg_end[0] = H;
    p.group_expert = group_expert;
    p.expert_rows = H;
    p.out_stride = H;
    launch_quant<false>(f, p, K, s);
}

}  // namespace markbase::cuda
