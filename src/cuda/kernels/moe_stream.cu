// A batched step's experts with no host in the loop (after moe_bucket grouped the n x K (token, slot) entries
// by expert on the device): each touched expert's rows are streamed once for all its entries, on the tensor
// cores, by the weight-streaming loop of stream_gemm (stream_mma.cuh). The grid is (row tiles, E): a block
// reads its expert's entry count, and an expert no token chose costs its blocks only that read, so the launch
// needs nothing from the host and a step is one graph. An expert with more entries than a block's token
// tiles hold takes further passes over its rows (each of 8 NT entries). A prompt chunk's experts (tens of
// entries an expert) run moe_gemm.cu's tiles instead.
//   gate/up: a block holds 16 gate rows j0.. and the matching 16 up rows Ie + j0.. of its expert, so GeGLU
//            happens in the store: h[entry][j] = gelu(gate_j . x) * (up_j . x), as bf16 hi and lo halves
//            (split_store), the down pass's input. The input row of entry i is token i / K.
//   down:    32 rows of H per block; slots[entry][r] = down_r . h[entry], fp32.
// FP8 experts (e4m3 rows with a scale per row, as the decode step reads them) take the same grid and half
// the bytes: a lane's 16-byte load is 16 weights, converted to f16 pairs for the MMAs (chunk_mma_fp8), the
// inputs one f16 array of x / 16 (f16_rows; the gate/up pass writes h so where the down pass is quantised),
// the sums times 16 and the row's scale before the store. int4 experts (a scale and zero point per group of
// 128 along K) a quarter of the bytes: a lane's 16 bytes are 32 weights, a chunk one group, whose sums enter
// the accumulators times the rows' group scales (chunk_mma_int4); the sums times 16 before the store.
#include <cmath>
#include <string>

#include "cuda/check.h"
#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"
#include "cuda/kernels/launch.h"
#include "cuda/kernels/stream_mma.cuh"
#include "model/error.h"

namespace markbase::cuda {

namespace {

using namespace stream_mma;
using Fmt = WeightFormat;

struct ExpertStreamArgs {
    const uint8_t* w = nullptr;    // expert e's rows at w + e * expert_stride bytes, K wide
    int64_t expert_stride = 0;     // bytes
    int64_t second = 0;            // gate/up: the up rows' offset from the gate rows (bytes); 0 for down
    const float* scale = nullptr;  // FP8: a scale per row, expert e's at scale + e * expert_rows; int4: per
    int64_t expert_rows = 0;       // group, [E * expert_rows][(K + 127) / 128]
    bool h_f16 = false;            // gate/up: h as f16(h / 16) in h_hi alone (the down pass is quantised)
    int K = 0;
    int out_width = 0;             // gate/up: Ie (h's row); down: H
    int in_div = 1;                // entry i reads input row i / in_div
    const uint16_t* hi = nullptr;  // the inputs, [rows][K] each
    const uint16_t* lo = nullptr;
    const int* group_off = nullptr;  // [E + 1] (moe_bucket)
    const int* entries = nullptr;    // [n K]
    uint16_t* h_hi = nullptr;        // gate/up's output, [n K][Ie] each
    uint16_t* h_lo = nullptr;
    float* y = nullptr;             // down's output, [n K][H]
    const uint8_t* zero = nullptr;  // int4: the zero points, laid out as the scales (null: symmetric)
};  // 120 bytes, as before int4's zero points: a larger parameter block changed the other kernels' code

// The block's warps summed in shared memory (in warp order), then the pass's stores: GeGLU of the gate
// tile (mt 0) and the up tile (mt 1) as bf16 halves, or the 32 rows as fp32.
// FP8: the sums times 16 (the inputs' 2^-4) and the rows' scales (rows of expert e's matrix); int4: times 16
// (the group scales are in the sums already).
template <int NT, bool Geglu, Fmt F, int MT>
__device__ __forceinline__ void sum_and_store(const float (&acc)[MT][NT][4], float* red,
                                              const ExpertStreamArgs& a, int e, int row0, const int* ent,
                                              int count) {
    constexpr int E = MT * NT * 4 * 32;  // a warp's accumulators
    sum_warps<MT, NT>(acc, red);
    __syncthreads();
    constexpr int kStores = Geglu ? E / MT : E;  // GeGLU: one output per gate and up pair
    constexpr bool Fp8 = F == Fmt::kFp8, Int4 = F == Fmt::kInt4;
    const float* sc = Fp8 ? a.scale + e * a.expert_rows + row0 : nullptr;
    for (int i = threadIdx.x; i < kStores; i += blockDim.x) {
        int row, tok;
        fragment_at(i, NT, row, tok);
        if (tok >= count) continue;
        const int64_t o = int64_t{ent[tok]} * a.out_width + row0 + row;
        float v = red[i];
        if constexpr (Fp8) v *= 16.0f * __ldg(sc + row);
        if constexpr (Int4) v *= 16.0f;
        if constexpr (Geglu) {
            float up = red[i + E / MT];
            if constexpr (Fp8) up *= 16.0f * __ldg(sc + a.out_width + row);  // the up rows follow the gate's
            if constexpr (Int4) up *= 16.0f;
            if (a.h_f16)
                store_f16_sixteenth(gelu_tanh(v) * up, a.h_hi, o);
            else
                split_store(gelu_tanh(v) * up, a.h_hi, a.h_lo, o);
        } else {
            a.y[o] = v;
        }
    }
    __syncthreads();  // red and ent are reused by the next pass
}

// MT row tiles of 16 per block (gate/up: 2, the gate tile and the up tile), G chunks a warp loads per round
// (32 k of bf16 rows, 64 k of FP8, 128 k of int4): MoeStreamShape.
template <int NT, bool Geglu, Fmt F, int MT, int G>
__global__ void __launch_bounds__(kWarps * 32) expert_stream_kernel(ExpertStreamArgs a) {
    constexpr bool Fp8 = F == Fmt::kFp8, Int4 = F == Fmt::kInt4, Quant = F != Fmt::kBf16;
    static_assert(!Geglu || MT == 2, "a gate/up block holds one gate tile and one up tile");
    extern __shared__ float red[];  // [kWarps][MT * NT * 4 * 32]
    __shared__ int ent[NT * 8];     // the pass's entries
    pdl_begin();                    // the entry counts come from moe_bucket
    const int e = blockIdx.y;
    const int o0 = a.group_off[e], ne = a.group_off[e + 1] - o0;
    if (ne <= 0) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int K = a.K, c_end = Int4 ? (K + 127) / 128 : K / (Fp8 ? 64 : 32);
    const int64_t row_bytes = Int4 ? K / 2 : int64_t{K} * (Fp8 ? 1 : 2);
    Int4Rows<MT> int4;  // int4: the lane's rows' group scales and zero points
    // gate/up: output columns j0.. from gate rows j0.. (mt 0) and up rows (mt 1); down: rows row0..row0+31
    const int row0 = blockIdx.x * (Geglu ? 16 : 16 * MT);
    const uint8_t* we = a.w + e * a.expert_stride;
    const uint4* wr[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int64_t r = Geglu ? int64_t{row0 + g + 8 * h} : int64_t{row0 + mt * 16 + g + 8 * h};
            const uint8_t* row = we + (Geglu && mt == 1 ? a.second : 0) + r * row_bytes;
            wr[mt][h] = reinterpret_cast<const uint4*>(row) + q;
            if constexpr (Int4) {
                // the up rows' scales follow the gate rows' (out_width of them)
                const int64_t sr = e * a.expert_rows + (Geglu && mt == 1 ? a.out_width : 0) + r;
                const int groups = (K + 127) / 128;
                int4.scale[mt][h] = a.scale + sr * groups;
                int4.zero[mt][h] = a.zero ? a.zero + sr * groups : nullptr;
            }
        }
    for (int base = 0; base < ne; base += NT * 8) {
        const int count = min(NT * 8, ne - base);
        if (threadIdx.x < NT * 8) ent[threadIdx.x] = a.entries[o0 + base + min(int(threadIdx.x), count - 1)];
        __syncthreads();
        const uint4* xh[NT];
        const uint4* xl[NT];
        bool ok[NT];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const int t = nt * 8 + g;
            ok[nt] = t < count;
            const int64_t off = int64_t{ent[ok[nt] ? t : 0] / a.in_div} * K;
            // a lane's inputs: 8 values a chunk of each half (bf16), or 16 (FP8: two 16-byte loads) or 32
            // (int4: four) of the one f16 array (xl unused)
            xh[nt] = reinterpret_cast<const uint4*>(a.hi + off) + (Int4 ? 4 * q : Fp8 ? 2 * q : q);
            xl[nt] = Quant ? xh[nt] : reinterpret_cast<const uint4*>(a.lo + off) + q;
        }
        float acc[MT][NT][4];
        constexpr Tokens T = Int4 ? Tokens::kInt4 : Fp8 ? Tokens::kFp8 : Tokens::kHalves;
        // waited above; int4 rows of K % 128 != 0 end in a ragged chunk (units: a row's 16-byte units)
        if constexpr (Int4)
            stream_rounds<G, MT, NT, T>(acc, wr, xh, xl, ok, warp * G, c_end, 0, int4,
                                        K % 128 ? static_cast<int>(row_bytes / 16) : 0);
        else
            stream_rounds<G, MT, NT, T>(acc, wr, xh, xl, ok, warp * G, c_end, 0);
        sum_and_store<NT, Geglu, F, MT>(acc, red, a, e, row0, ent, count);
    }
}

// Token tiles per block for n tokens: room for about the busiest expert's entries under uniform routing
// (mean n K / E, plus three standard deviations), so that few experts take a second pass over their rows.
int token_tiles(int n, int K, int E) {
    const double mean = static_cast<double>(n) * K / E;
    const double busiest = mean + 3.0 * std::sqrt(mean) + 1.0;
    return busiest <= 8.0 ? 1 : busiest <= 16.0 ? 2 : 4;
}

template <bool Geglu, Fmt F, int MT, int G>
void launch_nt(const ExpertStreamArgs& a, int rows, int E, int nt, cudaStream_t s) {
    const dim3 grid(static_cast<unsigned>(rows / (16 * (Geglu ? 1 : MT))), static_cast<unsigned>(E)),
        block(kWarps * 32);
    const size_t smem = sizeof(float) * kWarps * MT * nt * 4 * 32;
    if (nt == 1) return launch_kernel(expert_stream_kernel<1, Geglu, F, MT, G>, grid, block, smem, s, a);
    if (nt == 2) return launch_kernel(expert_stream_kernel<2, Geglu, F, MT, G>, grid, block, smem, s, a);
    launch_kernel(expert_stream_kernel<4, Geglu, F, MT, G>, grid, block, smem, s, a);
}

const char* rows_name(Fmt f) {
    return f == Fmt::kFp8 ? "FP8" : f == Fmt::kInt4 ? "int4" : "bf16";
}

// The shapes each pass is built for: (2, 2), and for FP8 rows gate/up (2, 3) and down (4, 1)
// (bench/kernels/moe_stream_lab.cu measured the others: moe_stream_shape says which won where). int4 rows:
// (2, 2), not yet measured against any other.
template <bool Geglu, Fmt F>
void launch_shape(const ExpertStreamArgs& a, MoeStreamShape sh, int rows, int E, int nt, cudaStream_t s) {
    if (sh.mt == 2 && sh.g == 2) return launch_nt<Geglu, F, 2, 2>(a, rows, E, nt, s);
    if constexpr (F == Fmt::kFp8 && Geglu)
        if (sh.mt == 2 && sh.g == 3) return launch_nt<Geglu, F, 2, 3>(a, rows, E, nt, s);
    if constexpr (F == Fmt::kFp8 && !Geglu)
        if (sh.mt == 4 && sh.g == 1) return launch_nt<Geglu, F, 4, 1>(a, rows, E, nt, s);
    throw Error(std::string("internal: moe_stream's ") + (Geglu ? "gate/up" : "down") + " pass over " +
                rows_name(F) + " rows has no shape of " + std::to_string(sh.mt) + " row tiles and " +
                std::to_string(sh.g) + " chunks a round");
}

template <bool Geglu>
void launch(const ExpertStreamArgs& a, Fmt f, MoeStreamShape sh, int rows, int E, int n, int K,
            cudaStream_t s) {
    if (sh.mt == 0) sh = moe_stream_shape(!Geglu, f == Fmt::kFp8, n, K, E, rows);
    if (!Geglu && rows % (16 * sh.mt) != 0)
        throw Error("internal: moe_stream's down pass takes " + std::to_string(16 * sh.mt) +
                    " rows a block, found H " + std::to_string(rows));
    const int nt = token_tiles(n, K, E);
    if (f == Fmt::kFp8) return launch_shape<Geglu, Fmt::kFp8>(a, sh, rows, E, nt, s);
    if (f == Fmt::kInt4) return launch_shape<Geglu, Fmt::kInt4>(a, sh, rows, E, nt, s);
    launch_shape<Geglu, Fmt::kBf16>(a, sh, rows, E, nt, s);
}

// The format of a pass's rows: FP8 or int4 where their q is set, else bf16.
Fmt rows_format(const ExpertRows& m) {
    return m.fp8.q ? Fmt::kFp8 : m.int4.q ? Fmt::kInt4 : Fmt::kBf16;
}

// The pass's rows: bf16 (w), FP8 (q, scale) or int4 (q, group scales, zero points), rows of K each, expert
// e's `rows` of them the e-th.
void set_rows(ExpertStreamArgs& a, const ExpertRows& m, int64_t rows, int K, const char* what) {
    if (m.int4.q) {
        if (!m.int4.scale) throw Error(std::string("internal: ") + what + "'s int4 rows come without scales");
        if (K % 32 != 0)
            throw Error(std::string("internal: ") + what + "'s int4 rows need K % 32 == 0, found " +
                        std::to_string(K));
        a.w = m.int4.q;
        a.scale = m.int4.scale;
        a.zero = m.int4.zero;
        a.expert_rows = rows;
        a.expert_stride = rows * K / 2;
    } else if (m.fp8.q) {
        if (!m.fp8.scale) throw Error(std::string("internal: ") + what + "'s FP8 rows come without scales");
        if (K % 64 != 0)
            throw Error(std::string("internal: ") + what + "'s FP8 rows need K % 64 == 0, found " +
                        std::to_string(K));
        a.w = m.fp8.q;
        a.scale = m.fp8.scale;
        a.expert_rows = rows;
        a.expert_stride = rows * K;
    } else {
        if (!m.w) throw Error(std::string("internal: ") + what + " has no rows");
        a.w = reinterpret_cast<const uint8_t*>(m.w);
        a.expert_stride = rows * K * 2;
    }
}

}  // namespace

// The H200 (moe_stream_lab, the 26B-A4B's experts): bf16 rows (2, 2) at every count. FP8 rows from a mean of
// 4 entries an expert (64 tokens of top 8 over 128): the down pass (4, 1), 64 rows a block in three rounds of
// 4 chunks (96 tokens 132 -> 103 us, 128 tokens 210 -> 161, 64 128 -> 100; at 8 and 32 tokens 1-5% slower),
// gate/up (2, 3) (128 tokens 234 -> 220 us, 64 156 -> 153, 96 even).
MoeStreamShape moe_stream_shape(bool down, bool fp8, int n, int K, int E, int rows) {
    const bool many = fp8 && int64_t{n} * K >= 4 * int64_t{E};
    if (many && down && rows % 64 == 0) return {4, 1};
    if (many && !down) return {2, 3};
    return {2, 2};
}

bool moe_stream_fits(int H, int Ie) {
    return H > 0 && Ie > 0 && H % 32 == 0 && Ie % 32 == 0;
}

bool moe_stream_fits_fp8(int H, int Ie) {
    return moe_stream_fits(H, Ie) && H % 64 == 0 && Ie % 64 == 0;
}

void moe_stream_gate_up(const uint16_t* x_hi, const uint16_t* x_lo, int H, int K, const ExpertRows& gate_up,
                        int Ie, const int* group_off, const int* entries, int E, int n, uint16_t* h_hi,
                        uint16_t* h_lo, bool h_f16, cudaStream_t s, MoeStreamShape shape) {
    if (!moe_stream_fits(H, Ie))
        throw Error("internal: moe_stream_gate_up needs H % 32 == 0 and Ie % 32 == 0, found H " +
                    std::to_string(H) + ", Ie " + std::to_string(Ie));
    ExpertStreamArgs a;
    set_rows(a, gate_up, 2 * int64_t{Ie}, H, "moe_stream_gate_up");
    const Fmt f = rows_format(gate_up);
    a.second = f == Fmt::kInt4 ? int64_t{Ie} * H / 2 : int64_t{Ie} * H * (f == Fmt::kFp8 ? 1 : 2);
    a.h_f16 = h_f16;
    a.K = H;
    a.out_width = Ie;
    a.hi = x_hi;
    a.lo = x_lo;
    a.in_div = K;
    a.group_off = group_off;
    a.entries = entries;
    a.h_hi = h_hi;
    a.h_lo = h_lo;
    launch<true>(a, f, shape, Ie, E, n, K, s);
    CUDA_CHECK_LAUNCH();
}

void moe_stream_down(const uint16_t* h_hi, const uint16_t* h_lo, int Ie, const ExpertRows& down, int H, int K,
                     const int* group_off, const int* entries, int E, int n, float* slots, cudaStream_t s,
                     MoeStreamShape shape) {
    if (!moe_stream_fits(H, Ie))
        throw Error("internal: moe_stream_down needs Ie % 32 == 0 and H % 32 == 0, found Ie " +
                    std::to_string(Ie) + ", H " + std::to_string(H));
    ExpertStreamArgs a;
    set_rows(a, down, H, Ie, "moe_stream_down");
    a.K = Ie;
    a.out_width = H;
    a.hi = h_hi;
    a.lo = h_lo;
    a.in_div = 1;
    a.group_off = group_off;
    a.entries = entries;
    a.y = slots;
    launch<false>(a, rows_format(down), shape, H, E, n, K, s);
    CUDA_CHECK_LAUNCH();
}

}  // namespace markbase::cuda
