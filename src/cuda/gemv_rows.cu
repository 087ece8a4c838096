// Decode GEMVs at one token, one warp per output row (MARKBASE_CUDA_GEMV=warp): the kernel lab's best layout
// on every decode shape of the four variants (bench/kernels/gemv_lab.cu v11: 8 independent 16-byte weight
// loads in flight per lane, x read through L1, no shared memory, no barrier, many small blocks that the
// hardware scheduler balances). What the lab kernel lacks and a model step needs is folded in here:
//  - the input RMSNorm, inside each warp: every warp reads all of x anyway, so it also sums x^2 and applies
//    the norm weight per element; y = rsqrt(mean(x^2) + eps) * scale * (W . (x * w)). No prologue, no
//    staging, no extra kernel;
//  - the sandwich-norm residual update that follows o_proj, down and the PLE projection, run once by the
//    last block to finish (ResidualTail) instead of by every block of the next GEMV;
//  - the first batch of weights is loaded before waiting for the previous kernel (weights never depend on
//    it), so with programmatic dependent launch the stream of bytes starts during the predecessor's tail.
#include <string>

#include "cuda/check.h"
#include "cuda/device_common.cuh"
#include "cuda/kernels.h"
#include "cuda/launch.h"
#include "cuda/peer_sum.cuh"

namespace markbase::cuda {

namespace {

enum Mode { kStore = 0, kGeglu = 1, kGeluMul = 2 };
constexpr int kWarps = 8;
constexpr int kU = 8;  // 16-byte chunks per lane in flight per matrix

struct RowsParams {
    GemvInput in;
    GemvSeg seg[3];
    int seg_end[3] = {0, 0, 0};
    int nseg = 0;
    int total_rows = 0;
    const bf16* w2 = nullptr;    // kGeglu: the up projection
    const float* aux = nullptr;  // kGeluMul: the multiplier
    ResidualTail tail;
    PeerSum peer;  // tensor parallel with the sum in the tail (world > 1): see ResidualTail
};

// x = (x + RMSNorm(y) * w) * scale by the last block to finish; y is every row this grid wrote. One block
// walks the whole vector, so latency, not bandwidth, sets its length: each thread issues a batch of
// independent loads before using any (a plain strided loop waited one L2 round trip per element and cost
// 8-45 us per call on the H200).
constexpr int kTailBatch = 8;

// Once every warp of this block has stored its rows: whether this is the last block of the grid to get here
// (its ticket from `counter`); the other blocks are done.
__device__ __forceinline__ bool last_block_to_finish(unsigned int* counter) {
    __shared__ unsigned int ticket;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        ticket = atomicAdd(counter, 1u);
    }
    __syncthreads();
    return ticket == gridDim.x - 1;
}

__device__ void residual_tail(const RowsParams& p) {
    __shared__ float red[32];
    if (!last_block_to_finish(p.tail.counter)) return;
    __threadfence();
    const int H = p.total_rows, T = blockDim.x;
    const float* y = p.seg[0].y;
    float* x = p.tail.x;
    float part[kTailBatch];
#pragma unroll
    for (int j = 0; j < kTailBatch; ++j) part[j] = 0.0f;
    for (int k0 = threadIdx.x; k0 < H; k0 += T * kTailBatch) {
        float v[kTailBatch];
#pragma unroll
        for (int j = 0; j < kTailBatch; ++j) {
            const int k = k0 + j * T;
            v[j] = k < H ? __ldcg(y + k) : 0.0f;  // written by other blocks: from L2, never a stale L1 line
        }
#pragma unroll
        for (int j = 0; j < kTailBatch; ++j) part[j] = fmaf(v[j], v[j], part[j]);
    }
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kTailBatch; ++j) ss += part[j];
    ss = block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(H) + p.tail.eps);
    for (int k0 = threadIdx.x; k0 < H; k0 += T * kTailBatch) {
        float yv[kTailBatch], xv[kTailBatch], wv[kTailBatch];
#pragma unroll
        for (int j = 0; j < kTailBatch; ++j) {
            const int k = k0 + j * T;
            if (k < H) {
                yv[j] = __ldcg(y + k);
                xv[j] = __ldcg(x + k);
                wv[j] = bf16_at(p.tail.w, k);
            }
        }
#pragma unroll
        for (int j = 0; j < kTailBatch; ++j) {
            const int k = k0 + j * T;
            if (k < H) x[k] = (xv[j] + yv[j] * inv * wv[j]) * p.tail.scale;
        }
    }
    if (threadIdx.x == 0) *p.tail.counter = 0u;  // ready for the next launch (the stream orders them)
}

// The same update with y summed over the tensor-parallel ranks (ResidualTail.peer): every block stored its
// rows into each rank's inbox and fenced them at system scope before taking its ticket; the last block
// publishes the call, waits for the peers' and updates x from the sum in rank order (as peer_sum does).
__device__ void peer_tail(const RowsParams& p, unsigned long long call) {
    __shared__ float red[32];
    if (!last_block_to_finish(p.tail.counter)) return;
    __threadfence_system();
    peer_exchange(p.peer, call);
    // as residual_tail: batches of independent loads, the sum recomputed in the second pass
    const int H = p.total_rows, T = blockDim.x;
    float* x = p.tail.x;
    float part[kTailBatch];
#pragma unroll
    for (int j = 0; j < kTailBatch; ++j) part[j] = 0.0f;
    for (int k0 = threadIdx.x; k0 < H; k0 += T * kTailBatch) {
        float v[kTailBatch];
#pragma unroll
        for (int j = 0; j < kTailBatch; ++j)
            v[j] = k0 + j * T < H ? peer_total(p.peer, call, k0 + j * T) : 0.0f;
#pragma unroll
        for (int j = 0; j < kTailBatch; ++j) part[j] = fmaf(v[j], v[j], part[j]);
    }
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kTailBatch; ++j) ss += part[j];
    ss = block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(H) + p.tail.eps);
    for (int k0 = threadIdx.x; k0 < H; k0 += T * kTailBatch) {
        float yv[kTailBatch], xv[kTailBatch], wv[kTailBatch];
#pragma unroll
        for (int j = 0; j < kTailBatch; ++j) {
            const int k = k0 + j * T;
            if (k < H) {
                yv[j] = peer_total(p.peer, call, k);
                xv[j] = __ldcg(x + k);
                wv[j] = bf16_at(p.tail.w, k);
            }
        }
#pragma unroll
        for (int j = 0; j < kTailBatch; ++j) {
            const int k = k0 + j * T;
            if (k < H) x[k] = (xv[j] + yv[j] * inv * wv[j]) * p.tail.scale;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        *p.tail.counter = 0u;
        *p.peer.calls = call;
    }
}

// W warps share a row (W = 1: the lab's v11), each streaming a contiguous 1/W of K; their partial sums (and
// partial sums of x^2) meet in shared memory. W > 1 cuts a row's dependent load rounds by W and makes the
// work units W times finer, so rows with a long K (31B down and o_proj: 5376 rows, one unit per warp = 672
// blocks = 1.27 waves at 4 blocks per SM) no longer end on a mostly idle partial wave.
// Peer: the tensor-parallel tail (kStore with ResidualTail.peer), a separate instantiation so that the
// one-GPU kernels keep their registers.
template <int M, int W, bool Peer = false>
__global__ void __launch_bounds__(kWarps * 32, M == kGeglu ? 2 : 4) rows_kernel(const RowsParams p) {
    static_assert(W == 1 || W == 2 || W == 4 || W == 8, "warps per row");
    constexpr int kRowsPerBlock = kWarps / W;
    __shared__ float partial[kWarps][3];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row = blockIdx.x * kRowsPerBlock + warp / W, part = warp % W;
    const bool active = row < p.total_rows;
    const int K = p.in.K, nchunk = K >> 3;
    const int per = W == 1 ? nchunk : (nchunk + W - 1) / W;
    const int c_lo = part * per, c_hi = min(nchunk, c_lo + per);  // this warp's chunks of the row
    int s = 0;
    while (s + 1 < p.nseg && row >= p.seg_end[s]) ++s;
    const int local = active ? row - (s ? p.seg_end[s - 1] : 0) : 0;
    const uint4* w = reinterpret_cast<const uint4*>(p.seg[s].w + static_cast<int64_t>(local) * K);
    const uint4* w2 =
        M == kGeglu ? reinterpret_cast<const uint4*>(p.w2 + static_cast<int64_t>(local) * K) : w;

    uint4 v[kU], v2[kU];
    auto load = [&](int base) {
#pragma unroll
        for (int u = 0; u < kU; ++u) {
            const int c = base + u * 32 + lane;
            const bool ok = active && c < c_hi;
            v[u] = ok ? ld_stream(w + c) : make_uint4(0, 0, 0, 0);
            if constexpr (M == kGeglu) v2[u] = ok ? ld_stream(w2 + c) : make_uint4(0, 0, 0, 0);
        }
    };
    load(c_lo);   // weights only: safe before the previous kernel has finished
    pdl_begin();  // from here on x (and y, the tail's x) may be touched

    const float4* x4 = reinterpret_cast<const float4*>(p.in.x);
    const uint4* nw4 = reinterpret_cast<const uint4*>(p.in.norm_w);
    const bool norm = p.in.norm;
    float acc = 0.0f, acc2 = 0.0f, ss = 0.0f;
    for (int base = c_lo; base < c_hi; base += 32 * kU) {
        if (base != c_lo) load(base);
#pragma unroll
        for (int u = 0; u < kU; ++u) {
            const int c = base + u * 32 + lane;
            if (c < c_hi) {
                float4 a = __ldg(x4 + 2 * c), b = __ldg(x4 + 2 * c + 1);
                if (norm) {
                    ss = sq8(a, b, ss);
                    if (nw4) scale8(a, b, __ldg(nw4 + c));
                }
                acc += dot8(v[u], a, b);
                if constexpr (M == kGeglu) acc2 += dot8(v2[u], a, b);
            }
        }
    }
    acc = warp_sum(acc);
    if constexpr (M == kGeglu) acc2 = warp_sum(acc2);
    if (norm) ss = warp_sum(ss);
    if constexpr (W > 1) {
        if (lane == 0) {
            partial[warp][0] = acc;
            partial[warp][1] = acc2;
            partial[warp][2] = ss;
        }
        __syncthreads();
        if (part == 0) {  // the row's first warp adds its parts in a fixed order (deterministic)
            acc = acc2 = ss = 0.0f;
#pragma unroll
            for (int j = 0; j < W; ++j) {
                acc += partial[warp + j][0];
                acc2 += partial[warp + j][1];
                ss += partial[warp + j][2];
            }
        }
    }
    if (norm) {
        const float inv = 1.0f / sqrtf(ss / static_cast<float>(K) + p.in.eps) * p.in.norm_scale;
        acc *= inv;
        acc2 *= inv;
    }
    // tensor parallel with the sum in the tail: this call's number (the previous sums have finished: the
    // stream orders them, and pdl_begin above waited for the kernel before)
    constexpr bool peers = Peer && M == kStore;
    unsigned long long call = 0;
    if constexpr (peers) call = *p.peer.calls + 1;
    if (lane == 0 && part == 0 && active) {
        float* y = p.seg[s].y + local;
        if constexpr (peers) {  // the partial row into every rank's inbox, fenced before this block's ticket
            for (int q = 0; q < p.peer.world; ++q) peer_row(p.peer, q, call)[local] = acc;
            __threadfence_system();
        }
        if constexpr (M == kStore)
            *y = acc;
        else if constexpr (M == kGeglu)
            *y = gelu_tanh(acc) * acc2;
        else
            *y = gelu_tanh(acc) * p.aux[row];
    }
    if (M == kStore && p.tail.x) {
        if constexpr (peers)
            peer_tail(p, call);
        else
            residual_tail(p);
    }
}

void check_aligned(const void* p, const char* what) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
        throw Error(std::string("internal: ") + what + " is not 16-byte aligned for the warp-per-row GEMV");
}

// Warps per row for `warpk`: enough that each warp streams about one batch of kU chunks per lane (one
// dependent load round), at most 8.
int warps_per_row(int K) {
    const int rounds = (K / 8 + 32 * kU - 1) / (32 * kU);
    int w = 1;
    while (w < rounds && w < 8) w <<= 1;
    return w;
}

template <int M, int W>
void launch_w(RowsParams& p, cudaStream_t s) {
    constexpr int rpb = kWarps / W;
    const dim3 grid((p.total_rows + rpb - 1) / rpb);
    if constexpr (M == kStore) {
        if (p.peer.world > 1) {
            launch_kernel(rows_kernel<M, W, true>, grid, dim3(kWarps * 32), 0, s, p);
            CUDA_CHECK_LAUNCH();
            return;
        }
    }
    launch_kernel(rows_kernel<M, W>, grid, dim3(kWarps * 32), 0, s, p);
    CUDA_CHECK_LAUNCH();
}

template <int M>
void launch_rows(RowsParams& p, cudaStream_t s) {
    if (p.in.K % 8 != 0)
        throw Error("internal: GEMV input width " + std::to_string(p.in.K) + " is not a multiple of 8");
    if (p.in.res_y) throw Error("internal: the warp-per-row GEMV takes no residual prologue");
    check_aligned(p.in.x, "the GEMV input");
    if (p.in.norm_w) check_aligned(p.in.norm_w, "the norm weight");
    p.total_rows = 0;
    for (int i = 0; i < p.nseg; ++i) {
        check_aligned(p.seg[i].w, "a weight matrix");
        p.seg_end[i] = (p.total_rows += p.seg[i].rows);
    }
    if (p.w2) check_aligned(p.w2, "the up projection");
    if (p.tail.x && (p.nseg != 1 || !p.tail.counter))
        throw Error("internal: a residual tail needs one output segment and a counter");
    if (p.total_rows == 0) return;
    switch (p.in.variant == kGemvVariantWarpK ? warps_per_row(p.in.K) : 1) {
        case 8:
            return launch_w<M, 8>(p, s);
        case 4:
            return launch_w<M, 4>(p, s);
        case 2:
            return launch_w<M, 2>(p, s);
        default:
            return launch_w<M, 1>(p, s);
    }
}

}  // namespace

void gemv_rows(const GemvInput& in, const GemvSeg* segs, int nseg, const ResidualTail* tail, cudaStream_t s) {
    RowsParams p;
    p.in = in;
    p.nseg = nseg;
    for (int i = 0; i < nseg; ++i) p.seg[i] = segs[i];
    if (tail) p.tail = *tail;
    if (tail && tail->peer) {
        p.peer = *tail->peer;
        if (p.peer.world < 2 || nseg != 1 || segs[0].rows > p.peer.max_n)
            throw Error(
                "internal: a peer tail needs a set-up PeerSum and one segment of at most its row width");
    }
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
