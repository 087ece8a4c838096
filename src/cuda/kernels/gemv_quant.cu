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
//  - A lane's two 16-byte loads are 16 FP8 or 32 int4 weights of A's rows g = lane / 4 and g + 8; the 4
//    lanes of a row cover a "super-step" of 64 bytes: 64 FP8 weights (4 MMAs a lane for both rows), or 128
//    int4 weights (8 MMAs), one group. A's rows are the matrix's rows g and g + 8 of the tile, or with the
//    GeGLU row g of the gate and of the up (8 output rows a tile): lane (g, 0) then holds both halves of its
//    output and the GeGLU streams as a plain product does (two loads a step; the gate and up as separate
//    tiles took twice the registers, half the super-steps a buffer, and ran the 31B's FP8 gate/up at 78 us
//    against 62 for the plain product of the same bytes).
//    Both sides of each MMA take their k in the same (permuted) order, so the loads feed the fragments
//    as they are; x is staged in that order.
//  - int4: each super-step's MMAs start from zero and are added into the sums times the rows' group scales
//    (fp32), so the weights enter the MMA as exact small integers; a row's last group may be shorter (K a
//    multiple of 64: the 26B-A4B's 704- and 2112-wide inputs), its missing half zero on both sides.
//  - Persistent blocks: at most 2 a SM, each staging x once and walking tiles, KS warps a tile (each a
//    contiguous K / KS of it; KS the split whose busiest warp walks the fewest super-steps), every block the
//    same number of rounds; a launch of fewer tiles than SMs takes one block a SM with twice the loads in
//    flight a warp (FP8's long buffers also where that evens the SMs' share of tiles). A block per tile (the
//    kernel before, the lab's v3 the step between) staged all of x for 8-32 rows and lived about as long as
//    that prologue: on the 31B's int4 q/k/v a warp walked ~5 super-steps.
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

// A tile's sums out: lane (g, t = 0) holds A's rows g (x's hi and lo columns in c[0], c[1]) and g + 8
// (c[2], c[3]): rows g and g + 8 of the tile, or (Geglu) row g's gate and up. With KS > 1 the tile's warps
// meet in `part` (this round's half) behind a named barrier of their own (the block's other tiles run on),
// the first adding the parts in a fixed order (deterministic).
template <Fmt F, int KS, bool Geglu>
__device__ __forceinline__ void finish_tile(const QuantParams& p, const float (&c)[4], float (*part)[16],
                                            int warp, int lane, int tile, int64_t erow, int slot, float inv) {
    const int g = lane >> 2, row = tile * kTileRows<Geglu>;
    const float lo = c[0] + c[1], hi = c[2] + c[3];
    if constexpr (KS == 1) {
        if ((lane & 3) == 0) {
            if constexpr (Geglu) {
                store_row<F, true>(p, row + g, erow, slot, lo * inv, hi * inv);
            } else {
                store_row<F, false>(p, row + g, erow, slot, lo * inv, 0.0f);
                store_row<F, false>(p, row + g + 8, erow, slot, hi * inv, 0.0f);
            }
        }
    } else {
        if ((lane & 3) == 0) {
            part[warp][g] = lo;
            part[warp][g + 8] = hi;
        }
        const int tslot = warp / KS;
        bar_named(1 + tslot, KS * 32);
        if (warp % KS == 0 && lane < kTileRows<Geglu>) {
            float a = 0.0f, b = 0.0f;
#pragma unroll
            for (int w = 0; w < KS; ++w) {
                a += part[tslot * KS + w][lane];
                if constexpr (Geglu) b += part[tslot * KS + w][lane + 8];
            }
            store_row<F, Geglu>(p, row + lane, erow, slot, a * inv, b * inv);
        }
    }
}

// KS warps walk a tile (16 rows, or Geglu's 8 gate and 8 up rows), each K / KS of it; U super-steps per
// register buffer, two buffers; registers for MinB blocks a SM.
template <Fmt F, int KS, int U, bool Geglu, int MinB>
__global__ void __launch_bounds__(kWarps * 32, MinB) quant_mma_kernel(const QuantParams p) {
    extern __shared__ uint2 xs[];
    __shared__ float red[32];
    __shared__ float part[2][kWarps][16];
    constexpr int kSlots = kWarps / KS;  // tiles a block walks at once
    constexpr int kRows = kTileRows<Geglu>;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int tslot = warp / KS, ks = warp % KS, slot = blockIdx.y;
    if (p.group_expert) pdl_begin();  // the experts were chosen by the previous kernel
    const int64_t erow = expert_row(p, slot);
    const int ntiles = p.total_rows / kRows, stride = gridDim.x * kSlots;
    int tile = blockIdx.x * kSlots + tslot;
    if (erow < 0) {  // a slot of another rank's expert: zero rows
        if (ks == 0 && lane < kRows)
            for (; tile < ntiles; tile += stride) store_zero(p, tile * kRows + lane, slot);
        return;
    }
    const int nss_row = static_cast<int>(row_bytes<F>(p.K) / 16);  // 16-byte chunks of a row
    const int nss = (nss_row + 3) / 4, G = static_cast<int>(int4_groups(p.K));
    const int s_lo = ks * nss / KS, s_hi = (ks + 1) * nss / KS;

    // two sets of U super-steps: the next one's loads are in flight while the current one's MMAs run
    StepSet<F, U> buf[2];
    TileRows tr;
    const StepRange range{s_hi, nss_row, Geglu ? 0 : 8 * nss_row, Geglu ? 0 : 8 * G};
    auto load = [&](int k, int base) { load_steps<F, U, Geglu>(buf[k], tr, range, base, t); };
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
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        auto step = [&](int k, int base) { mma_steps<F, U>(c, buf[k], xs, base, s_hi, g, t); };
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
        finish_tile<F, KS, Geglu>(p, c, part[par], warp, lane, tile, erow, slot, inv);
    }
}

template <Fmt F, int KS, int U, bool Geglu, int MinB = kMinBlocks>
void launch_ks(const QuantParams& p, int blocks, int slots, cudaStream_t s) {
    constexpr int kSlots = kWarps / KS;
    const int ntiles = p.total_rows / kTileRows<Geglu>;
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
// super-steps per buffer (a step loads 2 rows): 2, or 4 for FP8 where the plan asks (GemvInput's
// fp8_long_buffers: E2B and E4B -3% a token against 2; the 26B-A4B +1.7% with 4 everywhere, +2.5% with 4
// for its dense products only); int4's registers hold 2.
constexpr int kBufferSteps = 2;
template <Fmt F>
constexpr int kLongBufferSteps = F == Fmt::kFp8 ? 4 : 2;

// KS, warps a tile: the one whose busiest warp walks the fewest super-steps (its rounds of tiles times its
// share of a tile's nss; the fewer warps on a tie), a warp walking at least two super-steps. (Filling every
// warp first, the rule before, left the 31B's 1,344 GeGLU tiles at KS 2 in one round on 1,344 of 2,112
// warps, where KS 4 walks three rounds of 21 steps on all of them: 63 steps against 84.)
int choose_ks(int ntiles, int nss, int blocks) {
    int best = 1;
    int64_t best_steps = INT64_MAX;
    for (int ks = 1; ks <= kWarps; ks *= 2) {
        if (ks > 1 && nss / ks < 2) break;
        const int64_t tiles_at_once = int64_t{blocks} * (kWarps / ks);
        const int64_t steps = (ntiles + tiles_at_once - 1) / tiles_at_once * ((nss + ks - 1) / ks);
        if (steps < best_steps) {
            best_steps = steps;
            best = ks;
        }
    }
    return best;
}

// The most tiles one SM walks in a launch at KS of at most max_blocks blocks (launch_ks's grid: its rounds
// times its tiles at once, times the blocks the busiest SM holds).
int64_t busiest_sm_tiles(int ntiles, int ks, int max_blocks, int sms) {
    const int64_t at_once = kWarps / ks;
    const int64_t rounds = (ntiles + max_blocks * at_once - 1) / (max_blocks * at_once);
    const int64_t blocks = (ntiles + rounds * at_once - 1) / (rounds * at_once);
    return rounds * at_once * ((blocks + sms - 1) / sms);
}

template <Fmt F, bool Geglu, int U>
void launch_u(const QuantParams& p, int ks, int nss, int sms, int blocks, int slots, cudaStream_t s) {
    const int ntiles = p.total_rows / kTileRows<Geglu>;
    // One block a SM at KS 8, twice the loads in flight a warp: where there are fewer tiles than SMs (E2B's
    // o_proj and down: 96 tiles), whose blocks at two a SM would leave half each SM's loads unissued; and,
    // for FP8's long buffers, where it takes the busiest SM under 4/5 of the tiles two blocks a SM give it
    // (the 31B's down and o_proj: 336 tiles, 168 blocks of two, so 36 SMs walk four tiles and 96 two; one
    // block a SM walks three). That took the 31B's FP8 decode 10.75 -> 10.10 ms (its down 40.7 -> 36.0 us in
    // the lab, o_proj 14.3 -> 15.4); int4 moved 8.75 -> 8.81 ms (down -4%, o_proj +6%) and FP8's short
    // buffers' down +25%, so they keep two blocks a SM.
    const bool few = ks == kWarps && int64_t{ntiles} * slots <= sms;
    constexpr bool kMayBalance = F == Fmt::kFp8 && U == kLongBufferSteps<F>;
    const bool balance =
        kMayBalance && slots == 1 && nss / kWarps >= 2 &&
        5 * busiest_sm_tiles(ntiles, kWarps, sms, sms) <= 4 * busiest_sm_tiles(ntiles, ks, blocks, sms);
    if (few || balance) return launch_ks<F, 8, 2 * U, Geglu, 1>(p, sms, slots, s);
    switch (ks) {
        case 1:
            return launch_ks<F, 1, U, Geglu>(p, blocks, slots, s);
        case 2:
            return launch_ks<F, 2, U, Geglu>(p, blocks, slots, s);
        case 4:
            return launch_ks<F, 4, U, Geglu>(p, blocks, slots, s);
        default:
            return launch_ks<F, 8, U, Geglu>(p, blocks, slots, s);
    }
}

template <Fmt F, bool Geglu>
void launch_quant(QuantParams& p, int slots, cudaStream_t s) {
    if (p.K <= 0 || p.K % kSuper || p.K > kMaxK)
        throw Error("internal: the quantised GEMV takes input widths that are multiples of 64 up to " +
                    std::to_string(kMaxK) + ", not " + std::to_string(p.K));
    p.total_rows = 0;
    for (int i = 0; i < p.nseg; ++i) {
        const int rows = p.seg_end[i];
        if (rows % kTileRows<Geglu>)
            throw Error("internal: quantised GEMV segments take multiples of " +
                        std::to_string(kTileRows<Geglu>) + " rows, not " + std::to_string(rows));
        p.seg_end[i] = (p.total_rows += rows);
    }
    if (p.total_rows == 0) return;
    const int sms = device_sms(), blocks = std::max(1, kMinBlocks * sms / slots);
    const int ntiles = p.total_rows / kTileRows<Geglu>;
    const int nss = static_cast<int>((row_bytes<F>(p.K) / 16 + 3) / 4);
    const int ks = choose_ks(ntiles, nss, blocks);
    if (p.fp8_long_buffers) return launch_u<F, Geglu, kLongBufferSteps<F>>(p, ks, nss, sms, blocks, slots, s);
    launch_u<F, Geglu, kBufferSteps>(p, ks, nss, sms, blocks, slots, s);
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
    p.fp8_long_buffers = in.fp8_long_buffers;
    return p;
}

template <Fmt F, int KS, int U, bool Geglu, int MinB>
void allow_smem() {
    CUDA_CHECK(cudaFuncSetAttribute(quant_mma_kernel<F, KS, U, Geglu, MinB>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(padded_k<F>(kMaxK) * 4)));
}

template <Fmt F, bool Geglu, int U>
void allow_u() {
    allow_smem<F, 1, U, Geglu, kMinBlocks>();
    allow_smem<F, 2, U, Geglu, kMinBlocks>();
    allow_smem<F, 4, U, Geglu, kMinBlocks>();
    allow_smem<F, 8, U, Geglu, kMinBlocks>();
    allow_smem<F, 8, 2 * U, Geglu, 1>();
}

template <Fmt F, bool Geglu>
void allow_all() {
    allow_u<F, Geglu, kBufferSteps>();
    if constexpr (kLongBufferSteps<F> != kBufferSteps) allow_u<F, Geglu, kLongBufferSteps<F>>();
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
