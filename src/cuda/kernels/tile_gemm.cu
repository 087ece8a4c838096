// The projections of a serving step's ~100 rows (and short prompt chunks): Y[t][r] = sum_k x[t][k] W[r][k]
// for up to kTileGemmMaxN tokens over the one bf16 operand (gemm_inputs=bf16), every weight byte read once,
// several matrices of one input (q/k/v, gate/up) in one launch. cuBLAS at ~96 rows spends ~5 us on each
// small matrix (E2B's k: 0.8 MB in 4.8 us) and streams large ones at ~3 TB/s; stream_gemm, which holds the
// weights in registers, runs out of bytes in flight past ~32 tokens (cuda-stream-gemm-lab-bf16.txt).
//
// A block holds 128 weight rows (4 warps of 32) and every token; both stream through a ring of kStages
// stages of 64 k by cp.async (weights 16 KB a stage, tokens 128 B a token), so three stages of weights are in
// flight while one is multiplied. Shared rows are 128 bytes, their 16-byte chunks XOR-swizzled by row & 7
// so that ldmatrix's 8 rows hit distinct banks. Each warp's k16 step: two ldmatrix.x4 of its weights (A),
// one per 16 tokens (B, two n8 tiles), mma.sync m16n8k16 with fp32 accumulation. The K range may be cut
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
#include "model/error.h"

namespace markbase::cuda {

namespace {

constexpr int kRows = 128;     // weight rows a block
constexpr int kKc = 64;        // k a stage: one 128-byte shared row
constexpr int kThreads = 128;  // 4 warps of 32 rows

// Stages in the ring: four, three where the tokens' stages are large (so that two blocks fit an SM's 228 KB).
template <int NT>
constexpr int stages() {
    return NT >= 12 ? 3 : 4;
}
template <int NT>
constexpr int stage_bytes() {
    return (kRows + NT * 8) * 128;
}
template <int NT>
constexpr size_t smem_bytes() {
    return static_cast<size_t>(stages<NT>()) * stage_bytes<NT>();
}

struct TileArgs {
    GemvSeg seg[kStreamGemmMaxSegs];
    int tiles_end[kStreamGemmMaxSegs];  // the segments' row tiles, prefix sums
    int nseg = 0;
    const bf16* x = nullptr;  // [n][K]
    int n = 0, K = 0;
    int split_stages = 0;  // stages of 64 k per rank of the K split
};

// Thread t copies chunk t & 7 of rows (t >> 3) + 16 i: 8 weight rows and NT / 2 token rows a stage.
template <int NT>
struct Copies {
    const bf16* w[kRows / 16];
    bool w_ok[kRows / 16];
    const bf16* x[NT / 2];
    bool x_ok[NT / 2];
};

template <int NT>
__device__ __forceinline__ void copy_weights(uint32_t st, const Copies<NT>& cp, int k0) {
    const int r = threadIdx.x >> 3, c = threadIdx.x & 7;
#pragma unroll
    for (int i = 0; i < kRows / 16; ++i) cp16(st + swz(r + 16 * i, c), cp.w[i] + k0, cp.w_ok[i]);
}
template <int NT>
__device__ __forceinline__ void copy_tokens(uint32_t st, const Copies<NT>& cp, int k0) {
    const int r = threadIdx.x >> 3, c = threadIdx.x & 7;
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) cp16(st + kRows * 128 + swz(r + 16 * i, c), cp.x[i] + k0, cp.x_ok[i]);
}

// One stage's 4 k16 steps: warp w's rows 32 w .. 32 w + 31 against every token tile.
template <int NT>
__device__ __forceinline__ void mma_stage(float (&acc)[2][NT][4], uint32_t st) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t xs = st + kRows * 128;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        uint32_t a[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
            ldmatrix4(a[mt], st + swz(warp * 32 + mt * 16 + (lane & 15), kk * 2 + (lane >> 4)));
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
            uint32_t b[4];  // tokens np*16 + 0..7: b[0], b[1]; + 8..15: b[2], b[3]
            ldmatrix4(b, xs + swz(np * 16 + (lane & 7) + ((lane >> 4) << 3), kk * 2 + ((lane >> 3) & 1)));
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
                mma_bf16(acc[mt][2 * np], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[0], b[1]);
                mma_bf16(acc[mt][2 * np + 1], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[2], b[3]);
            }
        }
    }
}

// Output element i of a warp's [2][NT][4][32] fragments: its row within the warp's 32 rows and its token.
__device__ __forceinline__ void fragment_at(int i, int NT, int& row, int& tok) {
    const int lane = i & 31, e = (i >> 5) & 3, nt = (i >> 7) % NT, mt = (i >> 7) / NT;
    row = mt * 16 + (lane >> 2) + (e >= 2 ? 8 : 0);
    tok = nt * 8 + 2 * (lane & 3) + (e & 1);
}

// The stores: straight from the accumulators, or (a K split) each rank's partial sums through distributed
// shared memory, every rank storing a share of the block's outputs, summed in rank order.
template <int NT, bool Cluster>
__device__ __forceinline__ void store(const float (&acc)[2][NT][4], uint8_t* smem, const GemvSeg& sg,
                                      int row0, int n) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if constexpr (!Cluster) {
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int row = row0 + warp * 32 + mt * 16 + (lane >> 2) + (e >= 2 ? 8 : 0);
                    const int tok = nt * 8 + 2 * (lane & 3) + (e & 1);
                    if (row < sg.rows && tok < n) sg.y[int64_t{tok} * sg.ldy + row] = acc[mt][nt][e];
                }
    } else {
        constexpr int E = 2 * NT * 4 * 32;  // a warp's accumulators
        float* red = reinterpret_cast<float*>(smem);
        float* mine = red + warp * E;
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) mine[((mt * NT + nt) * 4 + e) * 32 + lane] = acc[mt][nt][e];
        __syncthreads();
        cluster_arrive_release();
        cluster_wait_acquire();
        const int share = 4 * E / static_cast<int>(gridDim.x);
        const int begin = static_cast<int>(blockIdx.x) * share;
        for (int i = begin + threadIdx.x; i < begin + share; i += blockDim.x) {
            float v = cluster_map(red, 0)[i];
            for (unsigned r = 1; r < gridDim.x; ++r) v += cluster_map(red, r)[i];
            int row, tok;
            fragment_at(i % E, NT, row, tok);
            row += row0 + (i / E) * 32;
            if (row < sg.rows && tok < n) sg.y[int64_t{tok} * sg.ldy + row] = v;
        }
        cluster_arrive_relaxed();  // no block leaves while another still reads its shared memory
        cluster_wait_acquire();
    }
}

template <int NT, bool Cluster>
__global__ void __launch_bounds__(kThreads) tile_gemm_kernel(TileArgs a) {
    constexpr int S = stages<NT>();
    extern __shared__ __align__(128) uint8_t smem[];
    const uint32_t base = shared_addr(smem);
    const int tile = blockIdx.y;
    int s = 0;
    while (s + 1 < a.nseg && tile >= a.tiles_end[s]) ++s;
    const GemvSeg& sg = a.seg[s];
    const int row0 = (tile - (s ? a.tiles_end[s - 1] : 0)) * kRows;
    const int K = a.K;
    const int s_begin = blockIdx.x * a.split_stages;
    const int ns = max(0, min(K / kKc, s_begin + a.split_stages) - s_begin);

    Copies<NT> cp;
    const int r = threadIdx.x >> 3, c = threadIdx.x & 7;
#pragma unroll
    for (int i = 0; i < kRows / 16; ++i) {
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
        if (j < ns) copy_weights<NT>(base + j * stage_bytes<NT>(), cp, j * kKc);
        cp_commit();
    }
    pdl_begin();
#pragma unroll
    for (int j = 0; j < S - 1; ++j) {
        if (j < ns) copy_tokens<NT>(base + j * stage_bytes<NT>(), cp, j * kKc);
        cp_commit();
    }
    float acc[2][NT][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
            acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;
    for (int j = 0; j < ns; ++j) {
        cp_wait<S - 2>();
        __syncthreads();  // stage j landed for every thread; stage j - 1's slot is free again
        const int next = j + S - 1;
        if (next < ns) {
            const uint32_t st = base + (next % S) * stage_bytes<NT>();
            copy_weights<NT>(st, cp, next * kKc);
            copy_tokens<NT>(st, cp, next * kKc);
        }
        cp_commit();
        mma_stage<NT>(acc, base + (j % S) * stage_bytes<NT>());
    }
    cp_wait<0>();
    if constexpr (Cluster) __syncthreads();  // the ring's memory becomes the partial sums'
    store<NT, Cluster>(acc, smem, sg, row0, a.n);
}

template <int NT>
void launch_nt(const TileArgs& a, int tiles, int ks, cudaStream_t s) {
    const dim3 grid(static_cast<unsigned>(ks), static_cast<unsigned>(tiles)), block(kThreads);
    if (ks > 1)
        launch_kernel_cluster(tile_gemm_kernel<NT, true>, grid, block, smem_bytes<NT>(), s, ks, a);
    else
        launch_kernel_cluster(tile_gemm_kernel<NT, false>, grid, block, smem_bytes<NT>(), s, 0, a);
}

template <int NT>
void allow_smem() {
    static_assert(2 * NT * 4 * 32 * 4 * sizeof(float) <= smem_bytes<NT>(), "the partial sums fit the ring");
    CUDA_CHECK(cudaFuncSetAttribute(tile_gemm_kernel<NT, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem_bytes<NT>())));
    CUDA_CHECK(cudaFuncSetAttribute(tile_gemm_kernel<NT, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem_bytes<NT>())));
}

}  // namespace

void tile_gemm_prepare() {
    allow_smem<2>();
    allow_smem<4>();
    allow_smem<6>();
    allow_smem<8>();
    allow_smem<10>();
    allow_smem<12>();
    allow_smem<14>();
    allow_smem<16>();
}

bool tile_gemm_fits(int N, int K, int n) {
    return n >= 1 && n <= kTileGemmMaxN && N >= 1 && K >= kKc && K % kKc == 0;
}

namespace {

int row_tiles(const GemvSeg* segs, int nseg) {
    int tiles = 0;
    for (int i = 0; i < nseg; ++i) tiles += (segs[i].rows + kRows - 1) / kRows;
    return tiles;
}

}  // namespace

// From the kernel lab (bench/results/cuda-stream-gemm-lab-bf16.txt: every projection of the four models at
// 1-128 tokens against cuBLAS over the same operand, each with its K split by tile_gemm_shape) and the
// batched steps around it (bench/results/cuda-tile-gemm.json). Up to 16 tokens it streams at the read rate
// (the 31B's gate+up, 462 MB, 110 us at one token: 4.2 TB/s) and wins in the lab wherever its K split can
// fill the GPU (E2B's down, 12 tiles of 128 rows, loses 14.9 us against 13.7); in the steps the 31B's
// launches of 88-462 MB lost (x16 21.69 -> 22.06 ms), so it takes launches up to 80 MB. Past 16 tokens its
// mma.sync tiles become compute-bound at ~250 TFLOP/s where cuBLAS's run ~300-350: at 32 tokens it still
// wins the launches of several matrices up to ~80 MB (E2B's gate+up 22.7 against 25.2, q/k/v 6.2 against
// 14.8; E4B's gate+up, 105 MB, loses 35.2 against 31.6) and the lm_head (199 against 204), at 64 the lm_head
// (224 against 232); past 32 only q/k/v while n x bytes stays under ~1.6e9 (E2B's 7.9 MB at 96 tokens 11.8
// against 15.0, E4B's 15.7 MB 14.4 against 19.5; E2B's full layers' 15.7 MB at 128 lose 20.9 against 16.2).
// What would take the rest: wgmma tiles (cuBLAS's rate) with this kernel's fused launches.
bool tile_gemm_pays(int64_t bytes, int nseg, int n, int sms, const GemvSeg* segs) {
    const int64_t MB = int64_t{1} << 20;
    if (n <= 16) return row_tiles(segs, nseg) * 8 >= sms && bytes <= 80 * MB;
    const bool lm_head = nseg == 1 && bytes >= 256 * MB;
    if (n <= 32) return (nseg >= 2 && bytes <= 80 * MB) || lm_head;
    if (n <= 64 && lm_head) return true;
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
    const int ks = shape.ks;
    if (ks != 1 && ks != 2 && ks != 4 && ks != 8)
        throw Error("internal: tile_gemm K split " + std::to_string(ks) + " (1, 2, 4 or 8)");
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
        tiles += (segs[i].rows + kRows - 1) / kRows;
        a.tiles_end[i] = tiles;
    }
    a.split_stages = (K / kKc + ks - 1) / ks;
    switch ((n + 15) / 16) {  // token tiles of 8, rounded up to even: 16 tokens a ldmatrix.x4
        case 1:
            return launch_nt<2>(a, tiles, ks, s);
        case 2:
            return launch_nt<4>(a, tiles, ks, s);
        case 3:
            return launch_nt<6>(a, tiles, ks, s);
        case 4:
            return launch_nt<8>(a, tiles, ks, s);
        case 5:
            return launch_nt<10>(a, tiles, ks, s);
        case 6:
            return launch_nt<12>(a, tiles, ks, s);
        case 7:
            return launch_nt<14>(a, tiles, ks, s);
        default:
            return launch_nt<16>(a, tiles, ks, s);
    }
}

}  // namespace markbase::cuda
