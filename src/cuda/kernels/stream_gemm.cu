// The projections of a few tokens (a batched decode step, a short prompt chunk): Y[t][r] = sum_k x[t][k]
// W[r][k], every weight byte read once, on the tensor cores. cuBLAS at a few rows ran E2B's q/k/v at 393 GB/s
// and o_proj at 430 (docs/performance.md); this kernel streams the weights like a GEMV and hands each 16 x 16
// tile of them to mma.sync against 8 tokens at a time, fp32 accumulation. The tokens are both bf16 halves of
// the fp32 input (hi, lo: the prefill's split, ~2^-16 of an fp32 product, gemm_inputs=halves), or its one
// bf16 rounding (hi; lo null: gemm_inputs=bf16, half the MMAs).
//
// Layout. A block holds MT tiles of 16 rows; its 4 warps split its K range, G chunks of 32 k at a time, each
// quad of lanes reading 16 contiguous bytes of a row per chunk (the block reads 4 G 64 contiguous bytes of
// each row per round). The k order inside a chunk is permuted, identically for the weights and the tokens:
// lane (g, q) holds k = q*8 .. q*8+7 of rows g and g+8 and of token g, and the MMA's k-step j takes 4 of them
// (the fragment's k = 2q, 2q+1, 2q+8, 2q+9 are physical q*8 + 4j + 0..3). A dot product does not depend on
// the order of its terms, so the 16-byte loads feed the fragments with no shuffle. (At 32-128 tokens a
// variant whose warps split rows, each over the whole K range, read the tokens from L1 and L2 with nothing in
// flight and ran 2-10x slower than cuBLAS, its lab at cdbef31 in git history; tile_gemm.cu takes those.)
// K split. With few row tiles (q/k/v of E2B: 128 tiles of 16 rows), the K range is also cut across a cluster
// of KS blocks (grid x); each block sums its warps in shared memory and the cluster sums its blocks through
// distributed shared memory, every rank a share of the outputs, in rank order: deterministic, no atomics.
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

// T: both halves (kHalves) or the one bf16 operand (kBf16).
template <Tokens T, int MT, int NT>
void launch_mt_nt(const StreamArgs& a, int tiles, int ks, cudaStream_t s) {
    const size_t smem = sizeof(float) * kWarps * MT * NT * 4 * 32;
    const dim3 grid(static_cast<unsigned>(ks), static_cast<unsigned>(tiles)), block(kWarps * 32);
    if (ks > 1)
        launch_kernel_cluster(stream_gemm_kernel<MT, NT, true, T>, grid, block, smem, s, ks, a);
    else
        launch_kernel_cluster(stream_gemm_kernel<MT, NT, false, T>, grid, block, smem, s, 0, a);
}

// The kernels that exist: up to 16 fragments (MT x NT) and 8 token tiles.
template <int MT, int NT>
constexpr bool compiled() {
    return MT * NT <= 16 && NT <= 8;
}

template <Tokens T, int MT, int NT = 1>
void launch_mt(const StreamArgs& a, int nt, int tiles, int ks, cudaStream_t s) {
    if constexpr (NT <= 8) {
        if (nt == NT) {
            if constexpr (compiled<MT, NT>()) return launch_mt_nt<T, MT, NT>(a, tiles, ks, s);
        } else {
            return launch_mt<T, MT, NT + 1>(a, nt, tiles, ks, s);
        }
    }
    throw Error("internal: stream_gemm has no kernel for " + std::to_string(MT) + " row tiles and " +
                std::to_string(nt) + " token tiles");
}

template <Tokens T>
void launch(const StreamArgs& a, int mt, int nt, int tiles, int ks, cudaStream_t s) {
    if (mt == 1) return launch_mt<T, 1>(a, nt, tiles, ks, s);
    if (mt == 2) return launch_mt<T, 2>(a, nt, tiles, ks, s);
    launch_mt<T, 4>(a, nt, tiles, ks, s);
}

}  // namespace

bool stream_gemm_fits(int N, int K, int n) {
    return n >= 1 && n <= kStreamGemmMaxN && N >= 1 && N % 16 == 0 && K >= 32 && K % 32 == 0;
}

// Both halves: cuBLAS pays a GEMM and a sum launch per matrix but streams large ones faster (~3.9 TB/s
// against ~3.3); the kernel lab (bench/results/cuda-stream-gemm-lab.txt) at 8 tokens: E2B's gate+up (2 x 38
// MB) 25.4 us against 28.5, the 26B-Standard's (2 x 44 MB) ahead in the step, E4B's (2 x 52 MB) 37.1 against
// 34.6, E2B's down (38 MB) 14.2 against 15.3, E4B's (52 MB) 22.2 against 19.4, the 31B's o_proj (88 MB) 32.9
// against 27.6. At 16 tokens the MMAs weigh more (E2B's gate+up 33.8 against 30.0): the allowance falls as
// 8 / n. The one bf16 operand (cuda-stream-gemm-lab-bf16.txt, 1-16 tokens): tile_gemm beats it on every
// launch of several matrices and on large ones; it keeps the single small matrices (up to 8 MB: E2B's o_proj
// 4.1 us against tile_gemm's 4.6 and cuBLAS's 5.7 at 8 tokens, its PLE gate 2.7 against 3.5 and 4.6, the
// 26B-A4B's router 3.9 against 4.6 and 6.0).
bool stream_gemm_pays(int64_t bytes, int nseg, int n, bool one_operand) {
    if (one_operand) return nseg == 1 && bytes <= (int64_t{8} << 20);
    const int64_t per_matrix = (int64_t{48} << 20) * 8 / std::max(n, 8);
    return bytes <= nseg * per_matrix;
}

StreamGemmShape stream_gemm_shape(const GemvSeg* segs, int nseg, int K, int n, int sms) {
    // the kernel lab's winners (bench/results/cuda-stream-gemm-lab.txt): two row tiles per block up to 16
    // tokens, four beyond (two where the token tiles would not fit); a K split until ~4 blocks per SM
    StreamGemmShape p;
    const int nt = (n + 7) / 8, chunks = K / 32;
    p.mt = (n <= 16 || nt > 4) ? 2 : 4;
    int tiles = 0;
    for (int i = 0; i < nseg; ++i) tiles += (segs[i].rows + 16 * p.mt - 1) / (16 * p.mt);
    const int G = 4 / p.mt;
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
    if ((mt != 1 && mt != 2 && mt != 4) || (ks != 1 && ks != 2 && ks != 4 && ks != 8) || mt * nt > 16)
        throw Error("internal: stream_gemm shape " + std::to_string(mt) + " row tiles x " +
                    std::to_string(ks) + " K splits at " + std::to_string(n) + " tokens");
    int tiles = 0;
    for (int i = 0; i < nseg; ++i) {
        if (!stream_gemm_fits(segs[i].rows, K, n))
            throw Error("internal: stream_gemm cannot take " + std::to_string(segs[i].rows) + " x " +
                        std::to_string(K) + " at " + std::to_string(n) + " tokens");
        a.seg[i] = segs[i];
        tiles += (segs[i].rows + 16 * mt - 1) / (16 * mt);
        a.tiles_end[i] = tiles;
    }
    const int chunks = K / 32;
    a.split_chunks = (chunks + ks - 1) / ks;
    if (lo) return launch<Tokens::kHalves>(a, mt, nt, tiles, ks, s);
    launch<Tokens::kBf16>(a, mt, nt, tiles, ks, s);
}

}  // namespace markbase::cuda
