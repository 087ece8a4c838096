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
#include <algorithm>
#include <string>

#include "cuda/check.h"
#include "cuda/kernels/cluster.cuh"
#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"
#include "cuda/kernels/launch.h"
#include "cuda/kernels/smem_ring.cuh"
#include "cuda/kernels/wgmma.cuh"
#include "model/error.h"

namespace markbase::cuda {

namespace {

constexpr int kKc = 64;        // k a stage: one 128-byte shared row
constexpr int kThreads = 128;  // one warpgroup

// A block holds MT m64 tiles of weight rows (MT = 1 or 2) and NT n8 tiles of tokens.
template <int MT>
constexpr int rows() {
    return 64 * MT;
}
template <int MT, int NT>
constexpr int stage_bytes() {
    return (rows<MT>() + NT * 8) * 128;
}
// Stages in the ring. 128 rows: four, three where the tokens' stages are large (so that two blocks fit an
// SM's 228 KB). 64 rows: as many as keep a block within 74 KB (three blocks an SM), at most six.
template <int MT, int NT>
constexpr int stages() {
    if constexpr (MT == 2) return NT >= 12 ? 3 : 4;
    return std::min(6, (74 * 1024) / stage_bytes<MT, NT>());
}
template <int MT, int NT>
constexpr size_t ring_bytes() {
    return static_cast<size_t>(stages<MT, NT>()) * stage_bytes<MT, NT>();
}
template <int MT, int NT>
constexpr size_t smem_bytes() {
    return ring_bytes<MT, NT>() + 1024;  // + the slack that aligns the ring to 1 KB
}

struct TileArgs {
    GemvSeg seg[kStreamGemmMaxSegs];
    int tiles_end[kStreamGemmMaxSegs];  // the segments' row tiles, prefix sums
    int nseg = 0;
    const bf16* x = nullptr;  // [n][K]
    int n = 0, K = 0;
    int split_stages = 0;  // stages of 64 k per rank of the K split
};

// Thread t copies chunk t & 7 of rows (t >> 3) + 16 i: 4 MT weight rows and NT / 2 token rows a stage.
template <int MT, int NT>
struct Copies {
    const bf16* w[4 * MT];
    bool w_ok[4 * MT];
    const bf16* x[NT / 2];
    bool x_ok[NT / 2];
};

template <int MT, int NT>
__device__ __forceinline__ void copy_weights(uint32_t st, const Copies<MT, NT>& cp, int k0) {
    const int r = threadIdx.x >> 3, c = threadIdx.x & 7;
#pragma unroll
    for (int i = 0; i < 4 * MT; ++i) cp16(st + swz(r + 16 * i, c), cp.w[i] + k0, cp.w_ok[i]);
}
template <int MT, int NT>
__device__ __forceinline__ void copy_tokens(uint32_t st, const Copies<MT, NT>& cp, int k0) {
    const int r = threadIdx.x >> 3, c = threadIdx.x & 7;
#pragma unroll
    for (int i = 0; i < NT / 2; ++i)
        cp16(st + rows<MT>() * 128 + swz(r + 16 * i, c), cp.x[i] + k0, cp.x_ok[i]);
}

// One stage's 4 k16 steps on the warpgroup: weight rows 64 mt .. 64 mt + 63 (A) against every token (B), both
// read by the tensor cores from the stage's swizzled rows; the stage's MMAs complete before it returns, so
// its slot may be refilled after the next barrier.
template <int MT, int NT>
__device__ __forceinline__ void mma_stage(float (&acc)[MT][NT * 4], uint32_t st) {
    const uint32_t xs = st + rows<MT>() * 128;
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

template <int MT, int NT, bool Cluster>
__global__ void __launch_bounds__(kThreads) tile_gemm_kernel(TileArgs a) {
    constexpr int S = stages<MT, NT>();
    constexpr int SB = stage_bytes<MT, NT>();
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

    Copies<MT, NT> cp;
    const int r = threadIdx.x >> 3, c = threadIdx.x & 7;
#pragma unroll
    for (int i = 0; i < 4 * MT; ++i) {
        const int row = row0 + r + 16 * i;
        cp.w_ok[i] = row < sg.rows;
        cp.w[i] = sg.w + int64_t{cp.w_ok[i] ? row : 0} * K + s_begin * kKc + c * 8;
    }
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
        if (j < ns) copy_weights<MT, NT>(base + j * SB, cp, j * kKc);
        cp_commit();
    }
    pdl_begin();
#pragma unroll
    for (int j = 0; j < S - 1; ++j) {
        if (j < ns) copy_tokens<MT, NT>(base + j * SB, cp, j * kKc);
        cp_commit();
    }
    float acc[MT][NT * 4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < NT * 4; ++i) acc[mt][i] = 0.0f;
    for (int j = 0; j < ns; ++j) {
        cp_wait<S - 2>();
        fence_proxy_async();  // this thread's copies of stage j, visible to the tensor cores' reads
        __syncthreads();      // stage j landed for every thread; stage j - 1's slot is free again
        const int next = j + S - 1;
        if (next < ns) {
            const uint32_t st = base + (next % S) * SB;
            copy_weights<MT, NT>(st, cp, next * kKc);
            copy_tokens<MT, NT>(st, cp, next * kKc);
        }
        cp_commit();
        mma_stage<MT, NT>(acc, base + (j % S) * SB);
    }
    cp_wait<0>();
    if constexpr (Cluster) __syncthreads();  // the ring's memory becomes the partial sums'
    store<MT, NT, Cluster>(acc, red, sg, row0, a.n);
}

template <int MT, int NT>
void launch_nt(const TileArgs& a, int tiles, int ks, cudaStream_t s) {
    const dim3 grid(static_cast<unsigned>(ks), static_cast<unsigned>(tiles)), block(kThreads);
    if (ks > 1)
        launch_kernel_cluster(tile_gemm_kernel<MT, NT, true>, grid, block, smem_bytes<MT, NT>(), s, ks, a);
    else
        launch_kernel_cluster(tile_gemm_kernel<MT, NT, false>, grid, block, smem_bytes<MT, NT>(), s, 0, a);
}

// Token tiles of 8, rounded up to even: N a multiple of 16.
template <int MT>
void launch_mt(const TileArgs& a, int tiles, int ks, cudaStream_t s) {
    switch ((a.n + 15) / 16) {
        case 1:
            return launch_nt<MT, 2>(a, tiles, ks, s);
        case 2:
            return launch_nt<MT, 4>(a, tiles, ks, s);
        case 3:
            return launch_nt<MT, 6>(a, tiles, ks, s);
        case 4:
            return launch_nt<MT, 8>(a, tiles, ks, s);
        case 5:
            return launch_nt<MT, 10>(a, tiles, ks, s);
        case 6:
            return launch_nt<MT, 12>(a, tiles, ks, s);
        case 7:
            return launch_nt<MT, 14>(a, tiles, ks, s);
        default:
            return launch_nt<MT, 16>(a, tiles, ks, s);
    }
}

template <int MT, int NT>
void allow_smem() {
    static_assert(MT * NT * 4 * 32 * 4 * sizeof(float) <= ring_bytes<MT, NT>(),
                  "the partial sums fit the ring");
    CUDA_CHECK(cudaFuncSetAttribute(tile_gemm_kernel<MT, NT, false>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem_bytes<MT, NT>())));
    CUDA_CHECK(cudaFuncSetAttribute(tile_gemm_kernel<MT, NT, true>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem_bytes<MT, NT>())));
}
template <int MT>
void allow_smem_mt() {
    allow_smem<MT, 2>();
    allow_smem<MT, 4>();
    allow_smem<MT, 6>();
    allow_smem<MT, 8>();
    allow_smem<MT, 10>();
    allow_smem<MT, 12>();
    allow_smem<MT, 14>();
    allow_smem<MT, 16>();
}

}  // namespace

void tile_gemm_prepare() {
    allow_smem_mt<1>();
    allow_smem_mt<2>();
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
        a.seg[i] = segs[i];
        tiles += (segs[i].rows + 64 * mt - 1) / (64 * mt);
        a.tiles_end[i] = tiles;
    }
    a.split_stages = (K / kKc + ks - 1) / ks;
    if (mt == 1) return launch_mt<1>(a, tiles, ks, s);
    return launch_mt<2>(a, tiles, ks, s);
}

}  // namespace markbase::cuda
