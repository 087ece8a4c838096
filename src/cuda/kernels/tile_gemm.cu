// The projections of a serving step's ~100 rows (and short prompt chunks): Y[t][r] = sum_k x[t][k] W[r][k]
// for up to kTileGemmMaxN tokens over the one bf16 operand (gemm_inputs=bf16), every weight byte read once,
// several matrices of one input (q/k/v, gate/up) in one launch. cuBLAS at ~96 rows spends ~5 us on each
// small matrix (E2B's k: 0.8 MB in 4.8 us) and streams large ones at ~3 TB/s; stream_gemm, which holds the
// weights in registers, runs out of bytes in flight past ~32 tokens (cuda-stream-gemm-lab-bf16.txt).
//
// A block (one warpgroup) holds 128 weight rows and every token; both stream through a ring of 3-4 stages of
// 64 k by cp.async (weights 16 KB a stage, tokens 128 B a token), so two or three stages are in flight while
// one is multiplied. Shared rows are 128 bytes, their 16-byte chunks XOR-swizzled by row & 7: the layout the
// tensor cores read as a 128-byte-swizzled K-major tile, so each k16 step is two wgmma m64nNk16 (N the tokens
// rounded up to 16; weights as A, tokens as B, fp32 accumulation) straight from shared memory (wgmma.cuh; the
// kernel is built for sm_90a). The K range may be cut
// across a cluster of ks blocks (matrices of few rows: o_proj, down), whose partial sums add in rank order
// through distributed shared memory: deterministic, no atomics.
//
// Quantised weights (a model's FP8 or int4 rows, the decode step's own copy) travel the ring as they are;
// each thread converts its A fragments in registers to the values of the model's bf16 copy and the tensor
// cores take A from registers, B from the stage's swizzled token rows: the same MMAs over a half or a
// quarter of the weight bytes (tile_quant.cuh).
#include <algorithm>
#include <string>
#include <type_traits>

#include "cuda/check.h"
#include "cuda/kernels/cluster.cuh"
#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"
#include "cuda/kernels/launch.h"
#include "cuda/kernels/smem_ring.cuh"
#include "cuda/kernels/tile_quant.cuh"
#include "cuda/kernels/wgmma.cuh"
#include "model/error.h"

namespace markbase::cuda {

namespace {

constexpr int kKc = 64;        // k a stage: one 128-byte shared row
constexpr int kThreads = 128;  // one warpgroup

using Fmt = WeightFormat;

// A block holds MT m64 tiles of weight rows (MT = 1 or 2) and NT n8 tiles of tokens.
template <int MT>
constexpr int rows() {
    return 64 * MT;
}
// A stage: bf16 weights (128-byte swizzled rows, 1 KB-aligned) then the tokens' rows; quantised rows the
// tokens' rows first (they are the tile that must be 1 KB-aligned), then the weights' padded rows.
template <Fmt F, int MT>
constexpr int weight_bytes() {
    return rows<MT>() * (F == Fmt::kBf16 ? 128 : tile::quant_row<F>());
}
template <Fmt F, int MT>
constexpr int tokens_at() {
    return F == Fmt::kBf16 ? weight_bytes<F, MT>() : 0;
}
template <Fmt F, int NT>
constexpr int weights_at() {
    return F == Fmt::kBf16 ? 0 : NT * 8 * 128;
}
template <Fmt F, int MT, int NT>
constexpr int stage_bytes() {
    return weight_bytes<F, MT>() + NT * 8 * 128;
}
// Stages in the ring. bf16, 128 rows: four, three where the tokens' stages are large (so that two blocks fit
// an SM's 228 KB); 64 rows: as many as keep a block within 74 KB (three blocks an SM), at most six. Quantised
// rows move a half or a quarter of bf16's weight bytes a stage, so they keep more stages in flight where
// the same blocks an SM hold them (up to eight: at 16 tokens an FP8 stage is 12 KB, 8 KB of it weights, so
// eight stages keep 56 KB of weights in flight a block where four kept 24).
template <Fmt F, int MT, int NT>
constexpr int stages() {
    constexpr int most = F == Fmt::kBf16 ? 6 : 8;
    if constexpr (MT == 2) {
        if constexpr (F == Fmt::kBf16) return NT >= 12 ? 3 : 4;
        return std::min(most, (111 * 1024) / stage_bytes<F, MT, NT>());
    }
    return std::min(most, (74 * 1024) / stage_bytes<F, MT, NT>());
}
template <Fmt F, int MT, int NT>
constexpr size_t ring_bytes() {
    return static_cast<size_t>(stages<F, MT, NT>()) * stage_bytes<F, MT, NT>();
}
template <Fmt F, int MT, int NT>
constexpr size_t smem_bytes() {
    return ring_bytes<F, MT, NT>() + 1024;  // + the slack that aligns the ring to 1 KB
}

struct TileArgs {
    GemvSeg seg[kStreamGemmMaxSegs];
    int tiles_end[kStreamGemmMaxSegs];  // the segments' row tiles, prefix sums
    int nseg = 0;
    const bf16* x = nullptr;  // [n][K]
    int n = 0, K = 0;
    int split_stages = 0;  // stages of 64 k per rank of the K split
};

// A stage's weight copies a thread makes: bf16 chunk t & 7 of rows (t >> 3) + 16 i (4 MT rows), FP8 chunk t
// & 3 of rows (t >> 2) + 32 i (2 MT), int4 chunk t & 1 of rows (t >> 1) + 64 i (MT); and chunk t & 7 of
// token rows (t >> 3) + 16 i (NT / 2 rows).
template <Fmt F>
constexpr int chunks_log2() {  // 16-byte chunks of a row's stage, log 2
    return F == Fmt::kBf16 ? 3 : F == Fmt::kFp8 ? 2 : 1;
}
template <Fmt F, int MT>
constexpr int weight_copies() {
    return rows<MT>() >> (7 - chunks_log2<F>());
}
template <Fmt F>
constexpr int stage_row_bytes() {  // a row's bytes a stage (kKc weights)
    return 16 << chunks_log2<F>();
}
template <Fmt F, int MT, int NT>
struct Copies {
    using Row = std::conditional_t<F == Fmt::kBf16, const bf16*, const uint8_t*>;  // bf16: k counts weights
    Row w[weight_copies<F, MT>()];
    bool w_ok[weight_copies<F, MT>()];
    const bf16* x[NT / 2];
    bool x_ok[NT / 2];
};

// Stage j's weights (j counted from the rank's first stage: kKc weights a row a stage).
template <Fmt F, int MT, int NT>
__device__ __forceinline__ void copy_weights(uint32_t st, const Copies<F, MT, NT>& cp, int j) {
    const uint32_t ws = st + weights_at<F, NT>();
    constexpr int L = chunks_log2<F>(), per_pass = 128 >> L;
    const int r = threadIdx.x >> L, c = threadIdx.x & ((1 << L) - 1);
#pragma unroll
    for (int i = 0; i < weight_copies<F, MT>(); ++i) {
        if constexpr (F == Fmt::kBf16)
            cp16(ws + swz(r + per_pass * i, c), cp.w[i] + j * kKc, cp.w_ok[i]);
        else
            cp16(ws + (r + per_pass * i) * tile::quant_row<F>() + c * 16, cp.w[i] + j * stage_row_bytes<F>(),
                 cp.w_ok[i]);
    }
}
template <Fmt F, int MT, int NT>
__device__ __forceinline__ void copy_tokens(uint32_t st, const Copies<F, MT, NT>& cp, int j) {
    const int r = threadIdx.x >> 3, c = threadIdx.x & 7;
#pragma unroll
    for (int i = 0; i < NT / 2; ++i)
        cp16(st + tokens_at<F, MT>() + swz(r + 16 * i, c), cp.x[i] + j * kKc, cp.x_ok[i]);
}

// One stage's 4 k16 steps on the warpgroup: weight rows 64 mt .. 64 mt + 63 (A) against every token (B), both
// read by the tensor cores from the stage's swizzled rows; the stage's MMAs complete before it returns, so
// its slot may be refilled after the next barrier.
template <int MT, int NT>
__device__ __forceinline__ void mma_stage(float (&acc)[MT][NT * 4], uint32_t st) {
    const uint32_t xs = st + tokens_at<Fmt::kBf16, MT>();
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
            wgmma_bf16<NT * 8>(acc[mt], wgmma_desc(st + mt * 64 * 128 + kk * 32), wgmma_desc(xs + kk * 32));
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) wgmma_pin(acc[mt]);
}

// Accumulator e of n8 tile nt of A tile mt (acc[mt][4 nt + e]): its row within the block and its token.
__device__ __forceinline__ void fragment_at(int warp, int lane, int mt, int nt, int e, int& row, int& tok) {
    row = mt * 64 + warp * 16 + (lane >> 2) + (e >= 2 ? 8 : 0);
    tok = nt * 8 + 2 * (lane & 3) + (e & 1);
}

// The stores: straight from the accumulators, or (a K split) each rank's partial sums through distributed
// shared memory, every rank storing a share of the block's outputs, summed in rank order.
template <int MT, int NT, bool Cluster>
__device__ __forceinline__ void store(const float (&acc)[MT][NT * 4], float* red, const GemvSeg& sg, int row0,
                                      int n) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if constexpr (!Cluster) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int i = 0; i < NT * 4; ++i) {
                int row, tok;
                fragment_at(warp, lane, mt, i >> 2, i & 3, row, tok);
                row += row0;
                if (row < sg.rows && tok < n) sg.y[int64_t{tok} * sg.ldy + row] = acc[mt][i];
            }
    } else {
        constexpr int E = MT * NT * 4 * 32;  // a warp's accumulators, [mt][i][lane]
        float* mine = red + warp * E;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int i = 0; i < NT * 4; ++i) mine[(mt * NT * 4 + i) * 32 + lane] = acc[mt][i];
        __syncthreads();
        cluster_arrive_release();
        cluster_wait_acquire();
        const int share = 4 * E / static_cast<int>(gridDim.x);
        const int begin = static_cast<int>(blockIdx.x) * share;
        for (int j = begin + threadIdx.x; j < begin + share; j += blockDim.x) {
            float v = cluster_map(red, 0)[j];
            for (unsigned r = 1; r < gridDim.x; ++r) v += cluster_map(red, r)[j];
            const int w = j / E, f = (j % E) >> 5, i = f % (NT * 4);
            int row, tok;
            fragment_at(w, j & 31, f / (NT * 4), i >> 2, i & 3, row, tok);
            row += row0;
            if (row < sg.rows && tok < n) sg.y[int64_t{tok} * sg.ldy + row] = v;
        }
        cluster_arrive_relaxed();  // no block leaves while another still reads its shared memory
        cluster_wait_acquire();
    }
}

// The thread's A rows' scales (and int4's 2^23 + zero points) of K group `group` (FP8: the row's); 0 past
// the matrix's rows.
template <Fmt F, int MT>
__device__ __forceinline__ void load_row_scales(tile::RowScales<MT>& rs, const GemvSeg& sg, int row0, int K,
                                                int group) {
    const int G = (K + 127) / 128;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = row0 + mt * 64 + (threadIdx.x >> 5) * 16 + ((threadIdx.x & 31) >> 2) + 8 * h;
            const bool ok = row < sg.rows;
            if constexpr (F == Fmt::kFp8) {
                rs.scale[mt][h] = ok ? __ldg(sg.q.scale + row) : 0.0f;
            } else {
                const int64_t at = int64_t{ok ? row : 0} * G + group;
                rs.scale[mt][h] = ok ? __ldg(sg.q.scale + at) : 0.0f;
                rs.zf[mt][h] = 8388608.0f + static_cast<float>(sg.q.zero ? __ldg(sg.q.zero + at) : 8);
            }
        }
}

template <Fmt F, int MT, int NT, bool Cluster>
__global__ void __launch_bounds__(kThreads) tile_gemm_kernel(TileArgs a) {
    constexpr int S = stages<F, MT, NT>();
    constexpr int SB = stage_bytes<F, MT, NT>();
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    // the 128-byte swizzle's 8-row groups start 1024-aligned (the ring is allocated with 1 KB to spare)
    const uint32_t raw = shared_addr(smem_raw), base = (raw + 1023u) & ~1023u;
    float* red = reinterpret_cast<float*>(smem_raw + (base - raw));
    const int tile = blockIdx.y;
    int s = 0;
    while (s + 1 < a.nseg && tile >= a.tiles_end[s]) ++s;
    const GemvSeg& sg = a.seg[s];
    const int row0 = (tile - (s ? a.tiles_end[s - 1] : 0)) * rows<MT>();
    const int K = a.K;
    const int s_begin = blockIdx.x * a.split_stages;
    const int ns = max(0, min(K / kKc, s_begin + a.split_stages) - s_begin);

    Copies<F, MT, NT> cp;
    const int r = threadIdx.x >> 3, c = threadIdx.x & 7;
#pragma unroll
    for (int i = 0; i < weight_copies<F, MT>(); ++i) {
        if constexpr (F == Fmt::kBf16) {
            const int row = row0 + r + 16 * i;
            cp.w_ok[i] = row < sg.rows;
            cp.w[i] = sg.w + int64_t{cp.w_ok[i] ? row : 0} * K + s_begin * kKc + c * 8;
        } else {
            constexpr int L = chunks_log2<F>(), B = stage_row_bytes<F>();
            const int row = row0 + (threadIdx.x >> L) + (128 >> L) * i;
            cp.w_ok[i] = row < sg.rows;
            cp.w[i] = sg.q.q + int64_t{cp.w_ok[i] ? row : 0} * (K / kKc * B) + s_begin * B +
                      (threadIdx.x & ((1 << L) - 1)) * 16;
        }
    }
    tile::RowScales<MT> rs;
    if constexpr (F == Fmt::kFp8) load_row_scales<F, MT>(rs, sg, row0, K, 0);
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) {
        const int tok = r + 16 * i;
        cp.x_ok[i] = tok < a.n;
        cp.x[i] = a.x + int64_t{cp.x_ok[i] ? tok : 0} * K + s_begin * kKc + c * 8;
    }
    // The ring's first S - 1 stages: weights (not written by the previous kernel) before the PDL wait, the
    // tokens after it; a group each, so that group S - 1 + j always holds stage j's tokens (wait_group S - 2)
#pragma unroll
    for (int j = 0; j < S - 1; ++j) {
        if (j < ns) copy_weights<F, MT, NT>(base + j * SB, cp, j);
        cp_commit();
    }
    pdl_begin();
#pragma unroll
    for (int j = 0; j < S - 1; ++j) {
        if (j < ns) copy_tokens<F, MT, NT>(base + j * SB, cp, j);
        cp_commit();
    }
    float acc[MT][NT * 4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < NT * 4; ++i) acc[mt][i] = 0.0f;
    for (int j = 0; j < ns; ++j) {
        // int4: a group's scales and zero points at its first stage here (a group is two stages), loaded
        // before the wait
        if constexpr (F == Fmt::kInt4)
            if (j == 0 || ((s_begin + j) & 1) == 0)
                load_row_scales<F, MT>(rs, sg, row0, K, (s_begin + j) >> 1);
        cp_wait<S - 2>();
        fence_proxy_async();  // this thread's copies of stage j, visible to the tensor cores' reads
        __syncthreads();      // stage j landed for every thread; stage j - 1's slot is free again
        const int next = j + S - 1;
        if (next < ns) {
            const uint32_t st = base + (next % S) * SB;
            copy_weights<F, MT, NT>(st, cp, next);
            copy_tokens<F, MT, NT>(st, cp, next);
        }
        cp_commit();
        const uint32_t st = base + (j % S) * SB;
        if constexpr (F == Fmt::kBf16)
            mma_stage<MT, NT>(acc, st);
        else
            tile::mma_stage_quant<F, MT, NT>(acc, st + weights_at<F, NT>(), st + tokens_at<F, MT>(), rs);
    }
    cp_wait<0>();
    if constexpr (Cluster) __syncthreads();  // the ring's memory becomes the partial sums'
    store<MT, NT, Cluster>(acc, red, sg, row0, a.n);
}

template <Fmt F, int MT, int NT>
void launch_nt(const TileArgs& a, int tiles, int ks, cudaStream_t s) {
    const dim3 grid(static_cast<unsigned>(ks), static_cast<unsigned>(tiles)), block(kThreads);
    constexpr size_t smem = smem_bytes<F, MT, NT>();
    if (ks > 1)
        launch_kernel_cluster(tile_gemm_kernel<F, MT, NT, true>, grid, block, smem, s, ks, a);
    else
        launch_kernel_cluster(tile_gemm_kernel<F, MT, NT, false>, grid, block, smem, s, 0, a);
}

// Token tiles of 8, rounded up to even: N a multiple of 16.
template <Fmt F, int MT>
void launch_mt(const TileArgs& a, int tiles, int ks, cudaStream_t s) {
    switch ((a.n + 15) / 16) {
        case 1:
            return launch_nt<F, MT, 2>(a, tiles, ks, s);
        case 2:
            return launch_nt<F, MT, 4>(a, tiles, ks, s);
        case 3:
            return launch_nt<F, MT, 6>(a, tiles, ks, s);
        case 4:
            return launch_nt<F, MT, 8>(a, tiles, ks, s);
        case 5:
            return launch_nt<F, MT, 10>(a, tiles, ks, s);
        case 6:
            return launch_nt<F, MT, 12>(a, tiles, ks, s);
        case 7:
            return launch_nt<F, MT, 14>(a, tiles, ks, s);
        default:
            return launch_nt<F, MT, 16>(a, tiles, ks, s);
    }
}

template <Fmt F, int MT, int NT>
void allow_smem() {
    static_assert(MT * NT * 4 * 32 * 4 * sizeof(float) <= ring_bytes<F, MT, NT>(),
                  "the partial sums fit the ring");
    static_assert(2 * smem_bytes<F, MT, NT>() <= 226 * 1024, "two blocks an SM");
    constexpr int smem = static_cast<int>(smem_bytes<F, MT, NT>());
    CUDA_CHECK(cudaFuncSetAttribute(tile_gemm_kernel<F, MT, NT, false>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CUDA_CHECK(cudaFuncSetAttribute(tile_gemm_kernel<F, MT, NT, true>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
}
template <Fmt F, int MT>
void allow_smem_mt() {
    allow_smem<F, MT, 2>();
    allow_smem<F, MT, 4>();
    allow_smem<F, MT, 6>();
    allow_smem<F, MT, 8>();
    allow_smem<F, MT, 10>();
    allow_smem<F, MT, 12>();
    allow_smem<F, MT, 14>();
    allow_smem<F, MT, 16>();
}

}  // namespace

void tile_gemm_prepare() {
    allow_smem_mt<Fmt::kBf16, 1>();
    allow_smem_mt<Fmt::kBf16, 2>();
    allow_smem_mt<Fmt::kFp8, 1>();
    allow_smem_mt<Fmt::kFp8, 2>();
    allow_smem_mt<Fmt::kInt4, 1>();
    allow_smem_mt<Fmt::kInt4, 2>();
}

bool tile_gemm_fits(int N, int K, int n) {
    return n >= 1 && n <= kTileGemmMaxN && N >= 1 && K >= kKc && K % kKc == 0;
}

namespace {

int row_tiles(const GemvSeg* segs, int nseg) {  // of 128 rows, the tiles the rule was measured with
    int tiles = 0;
    for (int i = 0; i < nseg; ++i) tiles += (segs[i].rows + 127) / 128;
    return tiles;
}

}  // namespace

// From the kernel lab (bench/results/cuda-stream-gemm-lab-bf16.txt: every projection of the four models at
// 1-128 tokens against cuBLAS over the same operand, each with its K split by tile_gemm_shape) and the
// batched steps around it (bench/results/cuda-tile-gemm.json). Up to 16 tokens it streams at the read rate
// (the 31B's gate+up, 462 MB, 118 us at 16 tokens: 3.9 TB/s) and wins in the lab wherever its K split can
// fill the GPU (E2B's down, 12 tiles of 128 rows, ties cuBLAS); in the steps the 31B's launches of 88-462 MB
// lost (x16 21.69 -> 22.06 ms), so it takes launches up to 80 MB. Up to 64 tokens it wins the launches of
// several matrices up to ~80 MB (at 64: E2B's gate+up 25.7 against 26.4 us, the 26B-A4B's q/k/v 21.6 against
// 25.0, its gate+up 14.5 against 16.0; E4B's gate+up, 105 MB, loses 37.3 against 32.7) and the lm_head (222
// against 238); past that only q/k/v while n x bytes stays under ~1.6e9 (E2B's 7.9 MB at 96 tokens 10.9
// against 15.0, E4B's 15.7 MB 13.0 against 19.3; E2B's full layers' 15.7 MB at 128 lose 18.3 against 16.2).
// Single matrices of few rows (o_proj, down) lose past 16 tokens: 12-40 tiles cannot fill the GPU, and their
// K split's partial sums grow with the tokens. What holds it under the read rate past ~32 tokens is its
// bytes in flight (two or three stages a block, two blocks an SM once a stage carries 128 tokens) and the
// tiles' waves (the 31B's 336 tiles over 264 block slots), not the MMAs.
bool tile_gemm_pays(int64_t bytes, int nseg, int n, int sms, const GemvSeg* segs) {
    const int64_t MB = int64_t{1} << 20;
    if (n <= 16) return row_tiles(segs, nseg) * 8 >= sms && bytes <= 80 * MB;
    const bool lm_head = nseg == 1 && bytes >= 256 * MB;
    if (n <= 64) return (nseg >= 2 && bytes <= 80 * MB) || lm_head;
    return nseg == 3 && static_cast<double>(n) * static_cast<double>(bytes) <= 1.6e9;
}

TileGemmShape tile_gemm_shape(const GemvSeg* segs, int nseg, int K, int n, int sms) {
    // the lab's best K splits: ~1-2.5 blocks per SM up to 16 tokens, ~1.5 past that (the ranks' partial sums
    // weigh more with more token tiles), each rank keeping at least 3 stages of 64 k
    const int tiles = row_tiles(segs, nseg), stages = K / kKc;
    const int target = n <= 16 ? sms * 5 / 2 : sms * 3 / 2;
    TileGemmShape p;
    while (p.ks < 8 && tiles * p.ks * 2 <= target && stages / (2 * p.ks) >= 3) p.ks *= 2;
    return p;
}

void tile_gemm(const GemvSeg* segs, int nseg, const bf16* x, int n, int K, TileGemmShape shape,
               cudaStream_t s) {
    if (nseg < 1 || nseg > kStreamGemmMaxSegs)
        throw Error("internal: tile_gemm takes 1 to " + std::to_string(kStreamGemmMaxSegs) + " matrices");
    const int ks = shape.ks, mt = shape.mt;
    if (ks != 1 && ks != 2 && ks != 4 && ks != 8)
        throw Error("internal: tile_gemm K split " + std::to_string(ks) + " (1, 2, 4 or 8)");
    if (mt != 1 && mt != 2)
        throw Error("internal: tile_gemm row tiles of " + std::to_string(mt) + " x 64 (1 or 2)");
    const Fmt f = segs[0].format;
    TileArgs a;
    a.nseg = nseg;
    a.x = x;
    a.n = n;
    a.K = K;
    int tiles = 0;
    for (int i = 0; i < nseg; ++i) {
        if (!tile_gemm_fits(segs[i].rows, K, n))
            throw Error("internal: tile_gemm cannot take " + std::to_string(segs[i].rows) + " x " +
                        std::to_string(K) + " at " + std::to_string(n) + " tokens");
        if (segs[i].format != f || (f == Fmt::kBf16 ? !segs[i].w : !segs[i].q.q || !segs[i].q.scale))
            throw Error(std::string("internal: tile_gemm's matrices must all be ") +
                        (f == Fmt::kBf16  ? "bf16"
                         : f == Fmt::kFp8 ? "FP8, with their scales"
                                          : "int4, with their scales"));
        a.seg[i] = segs[i];
        tiles += (segs[i].rows + 64 * mt - 1) / (64 * mt);
        a.tiles_end[i] = tiles;
    }
    a.split_stages = (K / kKc + ks - 1) / ks;
    if (f == Fmt::kFp8) {
        if (mt == 1) return launch_mt<Fmt::kFp8, 1>(a, tiles, ks, s);
        return launch_mt<Fmt::kFp8, 2>(a, tiles, ks, s);
    }
    if (f == Fmt::kInt4) {
        if (mt == 1) return launch_mt<Fmt::kInt4, 1>(a, tiles, ks, s);
        return launch_mt<Fmt::kInt4, 2>(a, tiles, ks, s);
    }
    if (mt == 1) return launch_mt<Fmt::kBf16, 1>(a, tiles, ks, s);
    return launch_mt<Fmt::kBf16, 2>(a, tiles, ks, s);
}

}  // namespace markbase::cuda
