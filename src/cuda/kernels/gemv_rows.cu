// Decode GEMVs at one token, one warp per output row (GemvKernel::kRows): the kernel lab's best layout
// on every decode shape of the four variants (bench/kernels/gemv_lab.cu v11: 8 independent 16-byte weight
// loads in flight per lane, x read through L1, no shared memory, no barrier, many small blocks that the
// hardware scheduler balances). What the lab kernel lacks and a model step needs is folded in here:
//  - the input RMSNorm, inside each warp: every warp reads all of x anyway, so it also sums x^2 and applies
//    the norm weight per element; y = rsqrt(mean(x^2) + eps) * scale * (W . (x * w)). No prologue, no
//    staging, no extra kernel;
//  - the first batch of weights is loaded before waiting for the previous kernel (weights never depend on
//    it), so with programmatic dependent launch the stream of bytes starts during the predecessor's tail.
#include <string>

#include "cuda/check.h"
#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/gemv_rows.cuh"
#include "cuda/kernels/kernels.h"
#include "cuda/kernels/launch.h"

namespace markbase::cuda {

namespace {

// kGegluSplit: the GeGLU with a row's gate and up products on different warps of the block (below).
enum Mode { kStore = 0, kGeglu = 1, kGeluMul = 2, kGegluSplit = 3 };
struct RowsParams {
    GemvInput in;
    GemvSeg seg[3];
    int seg_end[3] = {0, 0, 0};
    int nseg = 0;
    int total_rows = 0;
    const bf16* w2 = nullptr;    // kGeglu: the up projection
    const float* aux = nullptr;  // kGeluMul: the multiplier
};

// One 16-byte chunk c of a row (8 weights, w; Two: also w2's, the GeGLU's up row) against x's 8 elements,
// through the input norm's weights when the launch folds the norm in (ss sums x^2 for its scale).
template <bool Two>
__device__ __forceinline__ void dot_chunk(const float4* x4, const uint4* nw4, bool norm, int c,
                                          const uint4& w, const uint4& w2, float& acc, float& acc2,
                                          float& ss) {
    float4 a = __ldg(x4 + 2 * c), b = __ldg(x4 + 2 * c + 1);
    if (norm) {
        ss = sq8(a, b, ss);
        if (nw4) scale8(a, b, __ldg(nw4 + c));
    }
    acc += dot8(w, a, b);
    if constexpr (Two) acc2 += dot8(w2, a, b);
}

// A row's warps (more than one) meet in shared memory: each stores its sums (acc, acc2, ss), and the row's
// first warp adds the parts in a fixed order (deterministic).
template <int W, bool kSplit>
__device__ __forceinline__ void sum_row_warps(float (&partial)[kWarps][3], int lane, int warp, float& acc,
                                              float& acc2, float& ss) {
    constexpr int kRowWarps = kSplit ? 2 * W : W;
    if (lane == 0) {
        partial[warp][0] = acc;
        partial[warp][1] = acc2;
        partial[warp][2] = ss;
    }
    __syncthreads();
    if (warp % kRowWarps == 0) {
        acc = acc2 = ss = 0.0f;
#pragma unroll
        for (int j = 0; j < W; ++j) {
            acc += partial[warp + j][0];
            acc2 += partial[warp + j][kSplit ? 0 : 1];
            ss += partial[warp + j][2];
        }
        if constexpr (kSplit) {  // the up parts' sums, in the same order as kGeglu's acc2
            acc2 = 0.0f;
#pragma unroll
            for (int j = 0; j < W; ++j) acc2 += partial[warp + W + j][0];
        }
    }
}

// W warps share a row (W = 1: the lab's v11), each streaming a contiguous 1/W of K; their partial sums (and
// partial sums of x^2) meet in shared memory. W > 1 cuts a row's dependent load rounds by W and makes the
// work units W times finer, so rows with a long K (31B down and o_proj: 5376 rows, one unit per warp = 672
// blocks = 1.27 waves at 4 blocks per SM) no longer end on a mostly idle partial wave.
// U: 16-byte chunks per lane in flight per matrix (kU; the GeGLU launch at U = 4 holds fewer registers and
// fits 3 blocks per SM instead of 2; at 4 blocks, 64 registers, it spills; the plain products at U = 4 keep
// 4 blocks per SM with twice the warps per row; kU4MaxK).
// kGegluSplit (GemvInput.geglu_split, one GPU, at 8 chunks per lane): a row's W
// gate parts and W up parts on 2W warps of the block, each warp streaming one matrix, so the launch holds a
// plain product's registers (4 blocks per SM instead of 2: ncu had the 31B's GeGLU at 23% warps active,
// stalled on its x loads) with the same bytes in flight per SM. At the same W its gate and up sums are the
// kGeglu kernel's, added in the same order.
// Lean (at 4 chunks per lane, for a launch without the input norm): the norm compiled out, so the plain
// products (and the split GeGLU's warps) fit 6 blocks per SM instead of 4 (40 registers). The kernel lab:
// v11, the same loop at 40 registers and 6 blocks per SM, streamed E2B's gate/up 10% faster than this
// kernel at 4; the H200 A/B: E4B -1.0% and -1.1% in two calls, E2B +0.3% twice. (Not used: the lean GeGLU
// at 4 blocks per SM instead of 3, and the lean split GeGLU at 4 chunks per lane, +2.5% on E2B.)
template <int M, bool Lean>
constexpr int rows_blocks_per_sm(int U) {
    if (M == kGeglu) return U == kU ? 2 : 3;
    return Lean ? 6 : 4;
}
template <int M, int W, int U = kU, bool Lean = false>
__global__ void __launch_bounds__(kWarps * 32, rows_blocks_per_sm<M, Lean>(U))
    rows_kernel(const RowsParams p) {
    static_assert(W == 1 || W == 2 || W == 4 || W == 8, "warps per row");
    constexpr bool kSplit = M == kGegluSplit;
    constexpr int kRowWarps = kSplit ? 2 * W : W;  // warps per output row
    static_assert(kRowWarps <= kWarps, "a row's warps fit in one block");
    constexpr int kRowsPerBlock = kWarps / kRowWarps;
    __shared__ float partial[kWarps][3];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row = blockIdx.x * kRowsPerBlock + warp / kRowWarps, part = warp % kRowWarps % W;
    const bool up_half = kSplit && warp % kRowWarps >= W;  // kSplit: this warp streams the up row
    const bool active = row < p.total_rows;
    const int K = p.in.K, nchunk = K >> 3;
    const int per = W == 1 ? nchunk : (nchunk + W - 1) / W;
    const int c_lo = part * per, c_hi = min(nchunk, c_lo + per);  // this warp's chunks of the row
    int s = 0;
    while (s + 1 < p.nseg && row >= p.seg_end[s]) ++s;
    const int local = active ? row - (s ? p.seg_end[s - 1] : 0) : 0;
    const uint4* w =
        reinterpret_cast<const uint4*>((up_half ? p.w2 : p.seg[s].w) + static_cast<int64_t>(local) * K);
    const uint4* w2 =
        M == kGeglu ? reinterpret_cast<const uint4*>(p.w2 + static_cast<int64_t>(local) * K) : w;

    uint4 v[U], v2[U];
    auto load = [&](int base) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = base + u * 32 + lane;
            const bool ok = active && c < c_hi;
            v[u] = ok ? ld_stream(w + c) : make_uint4(0, 0, 0, 0);
            if constexpr (M == kGeglu) v2[u] = ok ? ld_stream(w2 + c) : make_uint4(0, 0, 0, 0);
        }
    };
    load(c_lo);                // weights only: safe before the previous kernel has finished
    pdl_begin_after_loads(K);  // from here on x may be touched

    const float4* x4 = reinterpret_cast<const float4*>(p.in.x);
    const uint4* nw4 = reinterpret_cast<const uint4*>(p.in.norm_w);
    const bool norm = !Lean && p.in.norm;
    float acc = 0.0f, acc2 = 0.0f, ss = 0.0f;
    for (int base = c_lo; base < c_hi; base += 32 * U) {
        if (base != c_lo) load(base);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = base + u * 32 + lane;
            if (c < c_hi) {
                dot_chunk<M == kGeglu>(x4, nw4, norm, c, v[u], v2[u], acc, acc2, ss);
            }
        }
    }
    acc = warp_sum(acc);
    if constexpr (M == kGeglu) acc2 = warp_sum(acc2);
    if (norm) ss = warp_sum(ss);
    if constexpr (kRowWarps > 1) sum_row_warps<W, kSplit>(partial, lane, warp, acc, acc2, ss);
    if (norm) {
        const float inv = 1.0f / sqrtf(ss / static_cast<float>(K) + p.in.eps) * p.in.norm_scale;
        acc *= inv;
        acc2 *= inv;
    }
    if (lane == 0 && warp % kRowWarps == 0 && active) {
        float* y = p.seg[s].y + local;
        if constexpr (M == kStore)
            *y = acc;
        else if constexpr (M == kGeglu || M == kGegluSplit)
            *y = gelu_tanh(acc) * acc2;
        else
            *y = gelu_tanh(acc) * p.aux[row];
    }
}

// ---- async (Tuning::gemv async_geglu: the GeGLU launches) ----
// The matrix as one sequence of rounds in memory order: row r's round j covers 16-byte chunks [j, j + 1) *
// kRound of its K (the last round of a row may be partial). Warp g of G takes rounds [g N / G, (g + 1) N /
// G), a contiguous run of the weights, and streams it through a private ring of kStages shared-memory stages
// that cp.async fills: rounds t + 1 and t + 2 are in flight while round t is computed, and, unlike a register
// double buffer (`stream`, which lost: 118 registers, 16 warps per SM, one round ahead), the
// bytes in flight hold no registers. Each lane reads back only the chunks it copied itself, so the ring needs
// no barrier, only cp.async.wait_group. A row cut between warps is summed through the scratch: each warp has
// at most two such pieces (its first and its last row), stored under (warp, 0 = first row | 1 = last row);
// the last piece to arrive (a counter per row) adds them in warp order, so the result does not depend on
// timing.
// The ring: 3 stages of 4 KB per warp (8 16-byte chunks per lane per round; two rounds in flight), 96 KB per
// block of 8 warps, two blocks per SM. (6 stages of 2 KB, five rounds in flight, measured slower still: 31B
// +8.6%, E2B +12.6%.)
constexpr int kAsyncBlocksPerSm = 2;
constexpr size_t kAsyncSmem = 96 * 1024;
constexpr int kAsyncMinRounds = 3;

__device__ __forceinline__ void cp_async16(uint4* smem, const uint4* gmem) {
    const unsigned int s = static_cast<unsigned int>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ int64_t async_round_lo(int64_t g, int64_t N, int64_t G) {
    return g * N / G;
}
__device__ __forceinline__ int64_t async_warp_of(int64_t t, int64_t N, int64_t G) {
    return ((t + 1) * G - 1) / N;  // the largest g with async_round_lo(g) <= t
}

// A warp's issue of its run into its ring (the kernel's state, by reference): round `issued` ((lrow, lj): its
// row and its round within the row, advanced here) into ring stage `stage`, as one cp.async group; past the
// run an empty group keeps the group count uniform.
template <int M, int kUnit, int kStageChunks>
struct AsyncIssue {
    int64_t& issued;
    const int64_t& t_hi;
    const RowsParams& p;
    int& lrow;
    const int& K;
    uint4* const& ring;
    int& lj;
    const int& lane;
    const int& nchunk;
    const int& R;
    __device__ __forceinline__ void operator()(int stage) const {
        constexpr int kRound = 32 * kUnit;  // chunks of a row per round
        if (issued < t_hi) {
            int s = 0;
            while (s + 1 < p.nseg && lrow >= p.seg_end[s]) ++s;
            const int64_t off = static_cast<int64_t>(lrow - (s ? p.seg_end[s - 1] : 0)) * K;
            const uint4* w = reinterpret_cast<const uint4*>(p.seg[s].w + off);
            const uint4* w2 = reinterpret_cast<const uint4*>((M == kGeglu ? p.w2 : p.seg[s].w) + off);
            uint4* dst = ring + stage * kStageChunks;
            const int c0 = lj * kRound;
#pragma unroll
            for (int u = 0; u < kUnit; ++u) {
                const int c = c0 + u * 32 + lane;
                if (c < nchunk) {
                    cp_async16(dst + u * 32 + lane, w + c);
                    if constexpr (M == kGeglu) cp_async16(dst + (kUnit + u) * 32 + lane, w2 + c);
                }
            }
            if (++lj == R) {
                lj = 0;
                ++lrow;
            }
        }
        ++issued;
        cp_async_commit();
    }
};

// The end of warp g's part of `row`: a row cut between warps meets in the scratch (each warp stores its
// piece; the last to arrive, by a counter per row, adds all in warp order, so the sum does not depend on
// timing). Returns whether this warp now holds the row's total (for lane 0; other lanes: true).
__device__ __forceinline__ bool async_sum_shared_row(const GemvStreamScratch& sc, int64_t g, int64_t t_lo,
                                                     int64_t t_hi, int row, int R, int64_t N, int64_t G,
                                                     int lane, float& acc, float& acc2, float& ss) {
    const int64_t r0 = static_cast<int64_t>(row) * R, r1 = r0 + R - 1;
    bool last = true;
    if (r0 < t_lo || r1 >= t_hi) {  // shared with other warps
        const int64_t g0 = async_warp_of(r0, N, G), g1 = async_warp_of(r1, N, G);
        if (lane == 0) {
            // slot 0: this warp's first row; 1: its last (a warp inside one row has only slot 0)
            float* mine = sc.part + (g * 2 + (t_lo / R == row ? 0 : 1)) * 3;
            mine[0] = acc;
            mine[1] = acc2;
            mine[2] = ss;
            __threadfence();
            const unsigned int ticket = atomicAdd(sc.count + row, 1u);
            last = ticket == static_cast<unsigned int>(g1 - g0);
            if (last) {
                __threadfence();
                acc = acc2 = ss = 0.0f;
                for (int64_t q = g0; q <= g1; ++q) {  // warp order: the same sum whoever finishes
                    const float* pq = sc.part + (q * 2 + (async_round_lo(q, N, G) / R == row ? 0 : 1)) * 3;
                    acc += __ldcg(pq);
                    acc2 += __ldcg(pq + 1);
                    ss += __ldcg(pq + 2);
                }
                sc.count[row] = 0u;  // ready for the next launch (the stream orders them)
            }
        }
    }
    return last;
}

// A row's output, from the warp lane that holds its total: the input norm's scale, then the epilogue.
template <int M>
__device__ __forceinline__ void async_store_row(const RowsParams& p, const int& row, int K, bool norm,
                                                float acc, float acc2, float ss) {
    if (norm) {
        const float inv = 1.0f / sqrtf(ss / static_cast<float>(K) + p.in.eps) * p.in.norm_scale;
        acc *= inv;
        acc2 *= inv;
    }
    int s = 0;
    while (s + 1 < p.nseg && row >= p.seg_end[s]) ++s;
    float* y = p.seg[s].y + (row - (s ? p.seg_end[s - 1] : 0));
    if constexpr (M == kStore)
        *y = acc;
    else if constexpr (M == kGeglu)
        *y = gelu_tanh(acc) * acc2;
    else
        *y = gelu_tanh(acc) * p.aux[row];
}

template <int M, int kLaneChunks, int kStages>
__global__ void __launch_bounds__(kWarps * 32, kAsyncBlocksPerSm)
    async_kernel(const RowsParams p, int R, int64_t N) {
    static_assert(size_t{kWarps} * kStages * 32 * kLaneChunks * 16 == kAsyncSmem, "ring size");
    constexpr int kAsyncRoundChunks = 32 * kLaneChunks;  // 16-byte chunks per stage
    constexpr int kUnit =
        M == kGeglu ? kLaneChunks / 2 : kLaneChunks;  // chunks per lane per matrix per round
    constexpr int kRound = 32 * kUnit;                // chunks of a row per round
    extern __shared__ uint4 ring_all[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint4* ring = ring_all + static_cast<size_t>(warp) * kStages * kAsyncRoundChunks;
    const int64_t G = static_cast<int64_t>(gridDim.x) * kWarps;
    const int64_t g = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
    const int64_t t_lo = async_round_lo(g, N, G), t_hi = async_round_lo(g + 1, N, G);
    const int K = p.in.K, nchunk = K >> 3;
    const GemvStreamScratch sc = p.in.stream;

    // the next round to issue, as (row, round within the row), advanced one round at a time
    int64_t issued = t_lo;
    int lrow = static_cast<int>(t_lo / R), lj = static_cast<int>(t_lo % R);
    const AsyncIssue<M, kUnit, kAsyncRoundChunks> issue{issued, t_hi, p, lrow, K, ring, lj, lane, nchunk, R};
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) issue(s);  // weights only: safe before the previous kernel ends
    pdl_begin();

    const float4* x4 = reinterpret_cast<const float4*>(p.in.x);
    const uint4* nw4 = reinterpret_cast<const uint4*>(p.in.norm_w);
    const bool norm = p.in.norm;
    float acc = 0.0f, acc2 = 0.0f, ss = 0.0f;
    int crow = static_cast<int>(t_lo / R), cj = static_cast<int>(t_lo % R);
    int stage = 0;
    for (int64_t t = t_lo; t < t_hi; ++t) {
        issue(stage == 0 ? kStages - 1 : stage - 1);  // round t + kStages - 1 into the stage freed at t - 1
        cp_async_wait<kStages - 1>();                 // round t has landed (this lane's chunks of it)
        const uint4* src = ring + stage * kAsyncRoundChunks;
        const int c0 = cj * kRound;
#pragma unroll
        for (int u = 0; u < kUnit; ++u) {
            const int c = c0 + u * 32 + lane;
            if (c < nchunk) {
                dot_chunk<M == kGeglu>(x4, nw4, norm, c, src[u * 32 + lane],
                                       M == kGeglu ? src[(kUnit + u) * 32 + lane] : src[u * 32 + lane], acc,
                                       acc2, ss);
            }
        }
        stage = stage + 1 == kStages ? 0 : stage + 1;
        // the end of this warp's part of the row: the row's output, or this warp's piece of it
        const int row = crow;
        const bool row_end = ++cj == R;
        if (row_end) {
            cj = 0;
            ++crow;
        }
        if (!row_end && t + 1 != t_hi) continue;
        acc = warp_sum(acc);
        if constexpr (M == kGeglu) acc2 = warp_sum(acc2);
        if (norm) ss = warp_sum(ss);
        const bool last = async_sum_shared_row(sc, g, t_lo, t_hi, row, R, N, G, lane, acc, acc2, ss);
        if (lane == 0 && last) async_store_row<M>(p, row, K, norm, acc, acc2, ss);
        acc = acc2 = ss = 0.0f;
    }
    cp_async_wait<0>();  // no copy outlives the block
}

void check_aligned(const void* p, const char* what) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
        throw Error(std::string("internal: ") + what + " is not 16-byte aligned for the warp-per-row GEMV");
}

template <int M, int W, int U, bool Lean>
void launch_w(RowsParams& p, cudaStream_t s) {
    constexpr int rpb = kWarps / (M == kGegluSplit ? 2 * W : W);
    launch_kernel(rows_kernel<M, W, U, Lean>, dim3((p.total_rows + rpb - 1) / rpb), dim3(kWarps * 32), 0, s,
                  p);
    CUDA_CHECK_LAUNCH();
}

template <int M, int U, bool Lean>
void launch_by_w(RowsParams& p, cudaStream_t s, int w) {
    switch (w) {
        case 8:
            if constexpr (M != kGegluSplit)
                return launch_w<M, 8, U, Lean>(p, s);  // (split: 16 warps per row)
            [[fallthrough]];
        case 4:
            return launch_w<M, 4, U, Lean>(p, s);
        case 2:
            return launch_w<M, 2, U, Lean>(p, s);
        default:
            return launch_w<M, 1, U, Lean>(p, s);
    }
}

// The async kernel when the launch has a scratch and at least kAsyncMinRounds rounds per warp on a full grid
// (two blocks per SM); false leaves the launch to the warpk kernel.
template <int M, int kLaneChunks, int kStages>
bool launch_async(RowsParams& p, cudaStream_t s) {
    constexpr int kRound = 32 * (M == kGeglu ? kLaneChunks / 2 : kLaneChunks);
    const GemvStreamScratch& sc = p.in.stream;
    if (!sc.part || !sc.count || p.total_rows > sc.rows) return false;
    const int R = (p.in.K / 8 + kRound - 1) / kRound;
    const int64_t N = static_cast<int64_t>(p.total_rows) * R;
    const int64_t blocks = int64_t{kAsyncBlocksPerSm} * device_sms();
    if (N < blocks * kWarps * kAsyncMinRounds || blocks * kWarps > sc.warps) return false;
    launch_kernel(async_kernel<M, kLaneChunks, kStages>, dim3(static_cast<unsigned>(blocks)),
                  dim3(kWarps * 32), kAsyncSmem, s, p, R, N);
    CUDA_CHECK_LAUNCH();
    return true;
}

template <int M>
void launch_rows(RowsParams& p, cudaStream_t s) {
    if (p.in.K <= 0 || p.in.K % 8 != 0)  // (K > 0: the kernel's PDL wait is behind a branch on it)
        throw Error("internal: GEMV input width " + std::to_string(p.in.K) +
                    " is not a positive multiple of 8");
    check_aligned(p.in.x, "the GEMV input");
    if (p.in.norm_w) check_aligned(p.in.norm_w, "the norm weight");
    p.total_rows = 0;
    for (int i = 0; i < p.nseg; ++i) {
        check_aligned(p.seg[i].w, "a weight matrix");
        p.seg_end[i] = (p.total_rows += p.seg[i].rows);
    }
    if (p.w2) check_aligned(p.w2, "the up projection");
    if (p.total_rows == 0) return;
    if constexpr (M == kGeglu)
        if (p.in.kernel == GemvKernel::kRowsAsyncGeglu && launch_async<M, 8, 3>(p, s)) return;
    constexpr RowsProduct product = M == kGeglu     ? RowsProduct::kGeglu
                                    : M == kGeluMul ? RowsProduct::kGeluMul
                                                    : RowsProduct::kPlain;
    const RowsPlan plan = gemv_rows_plan(product, p.in, p.total_rows, device_sms());
    if constexpr (M == kGeglu) {
        if (plan.split)
            return plan.lean ? launch_by_w<kGegluSplit, 4, true>(p, s, plan.warps)
                             : launch_by_w<kGegluSplit, kU, false>(p, s, plan.warps);
        return plan.chunks == 4 ? launch_by_w<M, 4, false>(p, s, plan.warps)
                                : launch_by_w<M, kU, false>(p, s, plan.warps);
    } else {
        if (plan.chunks == 8) return launch_by_w<M, kU, false>(p, s, plan.warps);
        return plan.lean ? launch_by_w<M, 4, true>(p, s, plan.warps)
                         : launch_by_w<M, 4, false>(p, s, plan.warps);
    }
}

}  // namespace

template <int M, int C, int S>
void allow_ring() {
    CUDA_CHECK(cudaFuncSetAttribute(async_kernel<M, C, S>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(kAsyncSmem)));
}

int64_t gemv_async_prepare() {
    allow_ring<kGeglu, 8, 3>();
    return int64_t{kAsyncBlocksPerSm} * device_sms() * kWarps;
}

void gemv_rows(const GemvInput& in, const GemvSeg* segs, int nseg, cudaStream_t s) {
    RowsParams p;
    p.in = in;
    p.nseg = nseg;
    for (int i = 0; i < nseg; ++i) p.seg[i] = segs[i];
    launch_rows<kStore>(p, s);
}

void gemv_rows_geglu(const GemvInput& in, const bf16* wg, const bf16* wu, int rows, float* y,
                     cudaStream_t s) {
    RowsParams p;
    p.in = in;
    p.nseg = 1;
    p.seg[0] = {wg, y, rows, 0};
    p.w2 = wu;
    launch_rows<kGeglu>(p, s);
}

void gemv_rows_gelu_mul(const GemvInput& in, const bf16* w, int rows, const float* aux, float* y,
                        cudaStream_t s) {
    RowsParams p;
    p.in = in;
    p.nseg = 1;
    p.seg[0] = {w, y, rows, 0};
    p.aux = aux;
    launch_rows<kGeluMul>(p, s);
}

}  // namespace markbase::cuda
