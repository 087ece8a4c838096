// The projections of a few tokens (a batched decode step, a short prompt chunk): Y[t][r] = sum_k x[t][k]
// W[r][k], every weight byte read once, on the tensor cores. cuBLAS at a few rows ran E2B's q/k/v at 393 GB/s
// and o_proj at 430 (docs/performance.md); this kernel streams the weights like a GEMV and hands each 16 x 16
// tile of them to mma.sync against 8 tokens at a time, fp32 accumulation. The tokens are both bf16 halves of
// the fp32 input (hi, lo: the prefill's split, ~2^-16 of an fp32 product, gemm_inputs=halves), or its one
// bf16 rounding (hi; lo null: gemm_inputs=bf16, half the MMAs).
//
// Layout. A block holds 4 warps. Split K (up to kStreamGemmMaxN tokens): the block holds MT tiles of 16 rows
// and its warps split its K range, G chunks of 32 k at a time, each quad of lanes reading 16 contiguous bytes
// of a row per chunk (the block reads 4 G 64 contiguous bytes of each row per round). Split rows (one bf16
// operand, up to kStreamGemmRowsMaxN tokens): each warp holds MT tiles of its own over the block's whole K
// range, so the 4 warps read the same token chunks at about the same time and L1 serves most of them; the
// block reads the tokens from L2 once per 64 MT rows, where a split-K block does per 16 MT (at ~100 tokens
// the tokens' bytes would outweigh the weights'). The k order inside a chunk is permuted, identically for the
// weights and the tokens: lane (g, q) holds k = q*8 .. q*8+7 of rows g and g+8 and of token g, and the MMA's
// k-step j takes 4 of them (the fragment's k = 2q, 2q+1, 2q+8, 2q+9 are physical q*8 + 4j + 0..3). A dot
// product does not depend on the order of its terms, so the 16-byte loads feed the fragments with no shuffle.
// K split across blocks. With few row tiles (q/k/v of E2B: 128 tiles of 16 rows), the K range is also cut
// across a cluster of KS blocks (grid x); each block sums its warps in shared memory (split K) and the
// cluster sums its blocks through distributed shared memory, every rank a share of the outputs, in rank
// order: deterministic, no atomics.
#include <algorithm>
#include <string>

#include "cuda/kernels/cluster.cuh"
#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"
#include "cuda/kernels/launch.h"
#include "cuda/kernels/stream_mma.cuh"
#include "model/error.h"

namespace markbase::cuda {

namespace {

using namespace stream_mma;

struct StreamArgs {
    GemvSeg seg[kStreamGemmMaxSegs];
    int tiles_end[kStreamGemmMaxSegs];  // the segments' row tiles, prefix sums
    int nseg = 0;
    const uint16_t* hi = nullptr;  // [n][K]
    const uint16_t* lo = nullptr;  // [n][K]
    int n = 0, K = 0;
    int split_chunks = 0;  // chunks of 32 k per rank of the K split
};

// The block's warps summed in shared memory, in warp order; with a K split the cluster's blocks summed
// through distributed shared memory, in rank order, each rank storing its share; then the stores (rows past
// the matrix and tokens past n dropped).
template <int MT, int NT, bool Cluster>
__device__ __forceinline__ void sum_and_store(const float (&acc)[MT][NT][4], float* red, const GemvSeg sg,
                                              int row0, const StreamArgs& a) {
    constexpr int E = MT * NT * 4 * 32;  // a warp's accumulators
    sum_warps<MT, NT>(acc, red);
    int begin = 0, end = E;
    if constexpr (Cluster) {  // every rank's sums visible; rank r stores its share of the outputs
        __syncthreads();
        cluster_arrive_release();
        cluster_wait_acquire();
        const int share = E / static_cast<int>(gridDim.x);
        begin = static_cast<int>(blockIdx.x) * share;
        end = begin + share;
    } else {
        __syncthreads();
    }
    for (int i = begin + threadIdx.x; i < end; i += blockDim.x) {
        float v = red[i];
        if constexpr (Cluster) {
            v = cluster_map(red, 0)[i];
            for (unsigned r = 1; r < gridDim.x; ++r) v += cluster_map(red, r)[i];
        }
        int row, tok;
        fragment_at(i, NT, row, tok);
        row += row0;
        if (row < sg.rows && tok < a.n) sg.y[int64_t{tok} * sg.ldy + row] = v;
    }
    if constexpr (Cluster) {  // no block leaves while another still reads its shared memory
        cluster_arrive_relaxed();
        cluster_wait_acquire();
    }
}

// The lanes' weight rows (rows past the matrix read its last row; their outputs are not stored) and token
// pointers (tokens past n read nothing: ld_x).
template <int MT, int NT>
__device__ __forceinline__ void lane_operands(const StreamArgs& a, const GemvSeg& sg, int row0,
                                              const uint4* (&wr)[MT][2], const uint4* (&xh)[NT],
                                              const uint4* (&xl)[NT], bool (&ok)[NT]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = min(row0 + mt * 16 + g + 8 * h, sg.rows - 1);
            wr[mt][h] = reinterpret_cast<const uint4*>(sg.w + int64_t{r} * a.K) + q;
        }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const int t = nt * 8 + g;
        ok[nt] = t < a.n;
        const int64_t off = int64_t{ok[nt] ? t : 0} * a.K;
        xh[nt] = reinterpret_cast<const uint4*>(a.hi + off) + q;
        xl[nt] = a.lo ? reinterpret_cast<const uint4*>(a.lo + off) + q : xh[nt];
    }
}

// The block's segment and the first row of its tile (tiles of `rows` rows).
__device__ __forceinline__ const GemvSeg& block_segment(const StreamArgs& a, int rows, int& row0) {
    const int tile = blockIdx.y;
    int s = 0;
    while (s + 1 < a.nseg && tile >= a.tiles_end[s]) ++s;
    row0 = (tile - (s ? a.tiles_end[s - 1] : 0)) * rows;
    return a.seg[s];
}

// Split K: the block's 4 warps take interleaved rounds of its K range over the same MT row tiles.
template <int MT, int NT, bool Cluster, Tokens T>
__global__ void __launch_bounds__(kWarps * 32) stream_gemm_kernel(StreamArgs a) {
    constexpr int G = 4 / MT;       // chunks a warp loads per round
    extern __shared__ float red[];  // [kWarps][MT * NT * 4 * 32]: sum_and_store's
    const int warp = threadIdx.x >> 5;
    int row0 = 0;
    const GemvSeg& sg = block_segment(a, 16 * MT, row0);
    const int c_begin = blockIdx.x * a.split_chunks;
    const int c_end = min(a.K / 32, c_begin + a.split_chunks);
    const uint4* wr[MT][2];
    const uint4* xh[NT];
    const uint4* xl[NT];
    bool ok[NT];
    lane_operands<MT, NT>(a, sg, row0, wr, xh, xl, ok);
    float acc[MT][NT][4];
    stream_rounds<G, MT, NT, T>(acc, wr, xh, xl, ok, c_begin + warp * G, c_end, a.K);
    sum_and_store<MT, NT, Cluster>(acc, red, sg, row0, a);
}

// Split rows (one bf16 operand): warp w takes row tiles w MT .. w MT + MT - 1 of the block's 4 MT over the
// whole K range; with a cluster, each rank's partial sums summed in rank order through distributed shared
// memory.
template <int MT, int NT, bool Cluster>
__global__ void __launch_bounds__(kWarps * 32) stream_gemm_rows_kernel(StreamArgs a) {
    constexpr int G = MT * NT >= 32 ? 1 : 2;  // chunks a warp loads per round (2 spill at 32 fragments)
    constexpr int E = MT * NT * 4 * 32;       // a warp's accumulators
    extern __shared__ float red[];            // Cluster: [kWarps][E]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int tile_row0 = 0;
    const GemvSeg& sg = block_segment(a, 16 * MT * kWarps, tile_row0);
    const int row0 = tile_row0 + warp * 16 * MT;
    const int c_begin = blockIdx.x * a.split_chunks;
    const int c_end = min(a.K / 32, c_begin + a.split_chunks);
    const uint4* wr[MT][2];
    const uint4* xh[NT];
    const uint4* xl[NT];
    bool ok[NT];
    lane_operands<MT, NT>(a, sg, row0, wr, xh, xl, ok);
    float acc[MT][NT][4];
    stream_rounds<G, MT, NT, Tokens::kBf16, G>(acc, wr, xh, xl, ok, c_begin, c_end, a.K);
    if constexpr (!Cluster) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int row = row0 + mt * 16 + (lane >> 2) + (e >= 2 ? 8 : 0);
                    const int tok = nt * 8 + 2 * (lane & 3) + (e & 1);
                    if (row < sg.rows && tok < a.n) sg.y[int64_t{tok} * sg.ldy + row] = acc[mt][nt][e];
                }
    } else {
        float* mine = red + warp * E;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) mine[((mt * NT + nt) * 4 + e) * 32 + lane] = acc[mt][nt][e];
        __syncthreads();
        cluster_arrive_release();
        cluster_wait_acquire();
        const int share = kWarps * E / static_cast<int>(gridDim.x);
        const int begin = static_cast<int>(blockIdx.x) * share;
        for (int i = begin + threadIdx.x; i < begin + share; i += blockDim.x) {
            float v = cluster_map(red, 0)[i];
            for (unsigned r = 1; r < gridDim.x; ++r) v += cluster_map(red, r)[i];
            int row, tok;
            fragment_at(i % E, NT, row, tok);
            row += tile_row0 + (i / E) * 16 * MT;
            if (row < sg.rows && tok < a.n) sg.y[int64_t{tok} * sg.ldy + row] = v;
        }
        cluster_arrive_relaxed();  // no block leaves while another still reads its shared memory
        cluster_wait_acquire();
    }
}

// How a launch runs: split K over both halves or the one bf16 operand, or split rows.
enum class Mode { kHalves, kBf16, kRows };

template <Mode M, int MT, int NT>
void launch_mt_nt(const StreamArgs& a, int tiles, int ks, cudaStream_t s) {
    // every warp's accumulators, for the block's sum (split K) or the cluster's (a K split)
    const size_t smem = (M == Mode::kRows && ks == 1) ? 0 : sizeof(float) * kWarps * MT * NT * 4 * 32;
    const dim3 grid(static_cast<unsigned>(ks), static_cast<unsigned>(tiles)), block(kWarps * 32);
    auto launch = [&](auto kernel, int cluster) {
        if (smem > 48 * 1024)
            CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(smem)));
        launch_kernel_cluster(kernel, grid, block, smem, s, cluster, a);
    };
    if constexpr (M == Mode::kRows) {
        if (ks > 1)
            launch(stream_gemm_rows_kernel<MT, NT, true>, ks);
        else
            launch(stream_gemm_rows_kernel<MT, NT, false>, 0);
    } else {
        constexpr Tokens T = M == Mode::kHalves ? Tokens::kHalves : Tokens::kBf16;
        if (ks > 1)
            launch(stream_gemm_kernel<MT, NT, true, T>, ks);
        else
            launch(stream_gemm_kernel<MT, NT, false, T>, 0);
    }
}

// The kernels that exist: split K up to 16 fragments (MT x NT) and 8 token tiles; split rows MT 1 or 2
// with an even number of token tiles (the caller rounds nt up: the extra tile's MMAs run on zeros).
template <Mode M, int MT, int NT>
constexpr bool compiled() {
    if constexpr (M == Mode::kRows) return (MT == 1 || MT == 2) && NT % 2 == 0 && NT <= 16;
    return MT * NT <= 16 && NT <= 8;
}

template <Mode M, int MT, int NT = 1>
void launch_mt(const StreamArgs& a, int nt, int tiles, int ks, cudaStream_t s) {
    if constexpr (NT <= 16) {
        if (nt == NT) {
            if constexpr (compiled<M, MT, NT>()) return launch_mt_nt<M, MT, NT>(a, tiles, ks, s);
        } else {
            return launch_mt<M, MT, NT + 1>(a, nt, tiles, ks, s);
        }
    }
    throw Error("internal: stream_gemm has no kernel for " + std::to_string(MT) + " row tiles and " +
                std::to_string(nt) + " token tiles");
}

}  // namespace

bool stream_gemm_fits(int N, int K, int n) {
    return n >= 1 && n <= kStreamGemmRowsMaxN && N >= 1 && N % 16 == 0 && K >= 32 && K % 32 == 0;
}

// cuBLAS pays a GEMM and a sum launch per matrix but streams large ones faster (~3.9 TB/s against ~3.3); the
// kernel lab (bench/results/cuda-stream-gemm-lab.txt) at 8 tokens: E2B's gate+up (2 x 38 MB) 25.4 us against
// 28.5, the 26B-Standard's (2 x 44 MB) ahead in the step, E4B's (2 x 52 MB) 37.1 against 34.6, E2B's down
// (38 MB) 14.2 against 15.3, E4B's (52 MB) 22.2 against 19.4, the 31B's o_proj (88 MB) 32.9 against 27.6.
// At 16 tokens the MMAs weigh more (E2B's gate+up 33.8 against 30.0): the allowance falls as 8 / n.
bool stream_gemm_pays(int64_t bytes, int nseg, int n) {
    if (n > kStreamGemmMaxN) return false;
    const int64_t per_matrix = (int64_t{48} << 20) * 8 / std::max(n, 8);
    return bytes <= nseg * per_matrix;
}

namespace {

int row_tiles(const GemvSeg* segs, int nseg, int rows_per_tile) {
    int tiles = 0;
    for (int i = 0; i < nseg; ++i) tiles += (segs[i].rows + rows_per_tile - 1) / rows_per_tile;
    return tiles;
}

}  // namespace

// Split rows against cuBLAS over the bf16 operand (the kernel lab, bench/results/cuda-stream-gemm-lab.txt).
bool stream_rows_pay(int64_t bytes, int nseg, int n) {
    (void)bytes;
    (void)nseg;
    return n <= kStreamGemmRowsMaxN;
}

StreamGemmShape stream_gemm_shape(const GemvSeg* segs, int nseg, int K, int n, int sms, bool rows) {
    StreamGemmShape p;
    const int nt = (n + 7) / 8, chunks = K / 32;
    if (rows) {
        // split rows: two row tiles per warp where that leaves a block per SM, else one; a K split until
        // ~2 blocks per SM while each rank keeps two rounds of 2 chunks
        p.rows = true;
        p.mt = row_tiles(segs, nseg, 128) >= sms ? 2 : 1;
        const int tiles = row_tiles(segs, nseg, 64 * p.mt);
        p.ks = 1;
        while (p.ks < 8 && tiles * p.ks < 2 * sms && chunks / (2 * p.ks) >= 4) p.ks *= 2;
        return p;
    }
    // the kernel lab's winners (bench/results/cuda-stream-gemm-lab.txt): two row tiles per block up to 16
    // tokens, four beyond (two where the token tiles would not fit); a K split until ~4 blocks per SM
    p.mt = (n <= 16 || nt > 4) ? 2 : 4;
    const int tiles = row_tiles(segs, nseg, 16 * p.mt), G = 4 / p.mt;
    p.ks = 1;
    while (p.ks < 8 && tiles * p.ks < 4 * sms && chunks / (2 * p.ks) >= G) p.ks *= 2;
    return p;
}

void stream_gemm(const GemvSeg* segs, int nseg, const bf16* hi, const bf16* lo, int n, int K,
                 StreamGemmShape shape, cudaStream_t s) {
    if (nseg < 1 || nseg > kStreamGemmMaxSegs)
        throw Error("internal: stream_gemm takes 1 to " + std::to_string(kStreamGemmMaxSegs) + " matrices");
    StreamArgs a;
    a.nseg = nseg;
    a.hi = hi;
    a.lo = lo;
    a.n = n;
    a.K = K;
    const int mt = shape.mt, nt = (n + 7) / 8, ks = shape.ks;
    const bool ks_ok = ks == 1 || ks == 2 || ks == 4 || ks == 8;
    const bool ok = shape.rows ? (ks_ok && (mt == 1 || mt == 2) && nt <= 16 && !lo)
                               : (ks_ok && (mt == 1 || mt == 2 || mt == 4) && mt * nt <= 16 && nt <= 8);
    if (!ok)
        throw Error(std::string("internal: stream_gemm shape ") + (shape.rows ? "(rows) " : "") +
                    std::to_string(mt) + " row tiles x " + std::to_string(ks) + " K splits at " +
                    std::to_string(n) + " tokens" + (lo ? " (two halves)" : ""));
    const int rows_per_tile = 16 * mt * (shape.rows ? kWarps : 1);
    int tiles = 0;
    for (int i = 0; i < nseg; ++i) {
        if (!stream_gemm_fits(segs[i].rows, K, n))
            throw Error("internal: stream_gemm cannot take " + std::to_string(segs[i].rows) + " x " +
                        std::to_string(K) + " at " + std::to_string(n) + " tokens");
        a.seg[i] = segs[i];
        tiles += (segs[i].rows + rows_per_tile - 1) / rows_per_tile;
        a.tiles_end[i] = tiles;
    }
    const int chunks = K / 32;
    a.split_chunks = (chunks + ks - 1) / ks;
    if (shape.rows) {
        const int even = (nt + 1) & ~1;
        if (mt == 1) return launch_mt<Mode::kRows, 1>(a, even, tiles, ks, s);
        return launch_mt<Mode::kRows, 2>(a, even, tiles, ks, s);
    }
    if (lo) {
        if (mt == 1) return launch_mt<Mode::kHalves, 1>(a, nt, tiles, ks, s);
        if (mt == 2) return launch_mt<Mode::kHalves, 2>(a, nt, tiles, ks, s);
        return launch_mt<Mode::kHalves, 4>(a, nt, tiles, ks, s);
    }
    if (mt == 1) return launch_mt<Mode::kBf16, 1>(a, nt, tiles, ks, s);
    if (mt == 2) return launch_mt<Mode::kBf16, 2>(a, nt, tiles, ks, s);
    launch_mt<Mode::kBf16, 4>(a, nt, tiles, ks, s);
}

}  // namespace markbase::cuda
