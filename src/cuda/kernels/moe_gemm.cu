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
// stage (moe_gemm_tiles.cuh).
//
// gate/up: the block's rows are 64 gate rows and the same 64 up rows (each warp holds a gate tile and its
// up tile, so GeGLU is applied in registers) and its output is the down pass's input, h = gelu(gate) * up in
// entry order. down: 128 rows of H, written to the entry's (token, slot) row of out.
#include <algorithm>

#include "cuda/check.h"
#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"
#include "cuda/kernels/launch.h"
#include "cuda/kernels/moe_gemm_tiles.cuh"
#include "cuda/kernels/smem_ring.cuh"

namespace markbase::cuda {

namespace {

using namespace moe_tiles;
constexpr int kMaxExperts = 256;

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
    constexpr int rows_per = copy_stride<F>();
    const int rt = copy_row<F>();
#pragma unroll
    for (int i = 0; i < kRows / rows_per; ++i) {
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
    constexpr int rows_per = copy_stride<F>();
    const int rt = copy_row<F>();
#pragma unroll
    for (int i = 0; i < kRows / rows_per; ++i) op.w[i] = w.w + (eb + r0 + rt + rows_per * i) * row_bytes;
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
