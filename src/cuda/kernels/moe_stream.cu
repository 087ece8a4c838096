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
// inputs one f16 array of x / 16 (f16_rows; the gate/up pass writes h so where the down pass is FP8), the
// sums times 16 and the row's scale before the store.
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

struct ExpertStreamArgs {
    const uint8_t* w = nullptr;    // expert e's rows at w + e * expert_stride bytes, K wide
    int64_t expert_stride = 0;     // bytes
    int64_t second = 0;            // gate/up: the up rows' offset from the gate rows (bytes); 0 for down
    const float* scale = nullptr;  // FP8: a scale per row, expert e's at scale + e * expert_rows
    int64_t expert_rows = 0;
    bool h_f16 = false;  // gate/up: h as f16(h / 16) in h_hi alone (the down pass is FP8)
    int K = 0;
    int out_width = 0;             // gate/up: Ie (h's row); down: H
    const uint16_t* hi = nullptr;  // the inputs, [rows][K] each
    const uint16_t* lo = nullptr;
    int in_div = 1;                  // entry i reads input row i / in_div
    const int* group_off = nullptr;  // [E + 1] (moe_bucket)
    const int* entries = nullptr;    // [n K]
    uint16_t* h_hi = nullptr;        // gate/up's output, [n K][Ie] each
    uint16_t* h_lo = nullptr;
    float* y = nullptr;  // down's output, [n K][H]
};

// The block's warps summed in shared memory (in warp order), then the pass's stores: GeGLU of the gate
// tile (mt 0) and the up tile (mt 1) as bf16 halves, or the 32 rows as fp32.
// FP8: the sums times 16 (the inputs' 2^-4) and the rows' scales (rows of expert e's matrix).
template <int NT, bool Geglu, bool Fp8, int MT>
__device__ __forceinline__ void sum_and_store(const float (&acc)[MT][NT][4], float* red,
                                              const ExpertStreamArgs& a, int e, int row0, const int* ent,
                                              int count) {
    constexpr int E = MT * NT * 4 * 32;  // a warp's accumulators
    sum_warps<MT, NT>(acc, red);
    __syncthreads();
    constexpr int kStores = Geglu ? E / MT : E;  // GeGLU: one output per gate and up pair
    const float* sc = Fp8 ? a.scale + e * a.expert_rows + row0 : nullptr;
    for (int i = threadIdx.x; i < kStores; i += blockDim.x) {
        int row, tok;
        fragment_at(i, NT, row, tok);
        if (tok >= count) continue;
        const int64_t o = int64_t{ent[tok]} * a.out_width + row0 + row;
        float v = red[i];
        if constexpr (Fp8) v *= 16.0f * __ldg(sc + row);
        if constexpr (Geglu) {
            float up = red[i + E / MT];
            if constexpr (Fp8) up *= 16.0f * __ldg(sc + a.out_width + row);  // the up rows follow the gate's
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
// (32 k of bf16 rows, 64 k of FP8): MoeStreamShape.
template <int NT, bool Geglu, bool Fp8, int MT, int G>
__global__ void __launch_bounds__(kWarps * 32) expert_stream_kernel(ExpertStreamArgs a) {
    static_assert(!Geglu || MT == 2, "a gate/up block holds one gate tile and one up tile");
    extern __shared__ float red[];  // [kWarps][MT * NT * 4 * 32]
    __shared__ int ent[NT * 8];     // the pass's entries
    pdl_begin();                    // the entry counts come from moe_bucket
    const int e = blockIdx.y;
    const int o0 = a.group_off[e], ne = a.group_off[e + 1] - o0;
    if (ne <= 0) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int K = a.K, c_end = K / (Fp8 ? 64 : 32);
    const int64_t row_bytes = int64_t{K} * (Fp8 ? 1 : 2);
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
            // a lane's inputs: 8 values a chunk of each half (bf16), or 16 of the one f16 array (FP8: two
            // 16-byte loads; xl unused)
            xh[nt] = reinterpret_cast<const uint4*>(a.hi + off) + (Fp8 ? 2 * q : q);
            xl[nt] = Fp8 ? xh[nt] : reinterpret_cast<const uint4*>(a.lo + off) + q;
        }
        float acc[MT][NT][4];
        stream_rounds<G, MT, NT, Fp8 ? Tokens::kFp8 : Tokens::kHalves>(acc, wr, xh, xl, ok, warp * G, c_end,
                                                                       0);  // waited above
        sum_and_store<NT, Geglu, Fp8, MT>(acc, red, a, e, row0, ent, count);
    }
}

// Token tiles per block for n tokens: room for about the busiest expert's entries under uniform routing
// (mean n K / E, plus three standard deviations), so that few experts take a second pass over their rows.
int token_tiles(int n, int K, int E) {
    const double mean = static_cast<double>(n) * K / E;
    const double busiest = mean + 3.0 * std::sqrt(mean) + 1.0;
    return busiest <= 8.0 ? 1 : busiest <= 16.0 ? 2 : 4;
}

template <bool Geglu, bool Fp8, int MT, int G>
void launch_nt(const ExpertStreamArgs& a, int rows, int E, int nt, cudaStream_t s) {
    const dim3 grid(static_cast<unsigned>(rows / (16 * (Geglu ? 1 : MT))), static_cast<unsigned>(E)),
        block(kWarps * 32);
    const size_t smem = sizeof(float) * kWarps * MT * nt * 4 * 32;
    if (nt == 1) return launch_kernel(expert_stream_kernel<1, Geglu, Fp8, MT, G>, grid, block, smem, s, a);
    if (nt == 2) return launch_kernel(expert_stream_kernel<2, Geglu, Fp8, MT, G>, grid, block, smem, s, a);
    launch_kernel(expert_stream_kernel<4, Geglu, Fp8, MT, G>, grid, block, smem, s, a);
}

// The shapes each pass is built for: (2, 2), and for FP8 rows gate/up (2, 3) and down (4, 1)
// (bench/kernels/moe_stream_lab.cu measured the others: moe_stream_shape says which won where).
template <bool Geglu, bool Fp8>
void launch_shape(const ExpertStreamArgs& a, MoeStreamShape sh, int rows, int E, int nt, cudaStream_t s) {
    if (sh.mt == 2 && sh.g == 2) return launch_nt<Geglu, Fp8, 2, 2>(a, rows, E, nt, s);
    if constexpr (Fp8 && Geglu)
        if (sh.mt == 2 && sh.g == 3) return launch_nt<Geglu, Fp8, 2, 3>(a, rows, E, nt, s);
    if constexpr (Fp8 && !Geglu)
        if (sh.mt == 4 && sh.g == 1) return launch_nt<Geglu, Fp8, 4, 1>(a, rows, E, nt, s);
    throw Error(std::string("internal: moe_stream's ") + (Geglu ? "gate/up" : "down") + " pass over " +
                (Fp8 ? "FP8" : "bf16") + " rows has no shape of " + std::to_string(sh.mt) +
                " row tiles and " + std::to_string(sh.g) + " chunks a round");
}

template <bool Geglu>
void launch(const ExpertStreamArgs& a, bool fp8, MoeStreamShape sh, int rows, int E, int n, int K,
            cudaStream_t s) {
    if (sh.mt == 0) sh = moe_stream_shape(!Geglu, fp8, n, K, E, rows);
    if (!Geglu && rows % (16 * sh.mt) != 0)
        throw Error("internal: moe_stream's down pass takes " + std::to_string(16 * sh.mt) +
                    " rows a block, found H " + std::to_string(rows));
    const int nt = token_tiles(n, K, E);
    if (fp8) return launch_shape<Geglu, true>(a, sh, rows, E, nt, s);
    launch_shape<Geglu, false>(a, sh, rows, E, nt, s);
}

// The pass's rows: bf16 (w) or FP8 (q, scale), rows of K each, expert e's `rows` of them the e-th.
void set_rows(ExpertStreamArgs& a, const ExpertRows& m, int64_t rows, int K, const char* what) {
    if (m.fp8.q) {
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
    a.second = int64_t{Ie} * H * (gate_up.fp8.q ? 1 : 2);
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
    launch<true>(a, gate_up.fp8.q != nullptr, shape, Ie, E, n, K, s);
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
    launch<false>(a, down.fp8.q != nullptr, shape, H, E, n, K, s);
    CUDA_CHECK_LAUNCH();
}

}  // namespace markbase::cuda
