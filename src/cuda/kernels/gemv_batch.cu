// Batched decode's projections at a few sequences: y[t] = W @ x[t] for up to kGemvBatchMax tokens per pass,
// each weight row read once for all of them, in fp32 as the one-token GEMVs compute. (The cuBLAS path reads
// the fp32 activations as two bf16 halves, one split kernel and one sum kernel around every GEMM; at 8
// sequences it ran the E2B's q/k/v at 393 GB/s and its MLP at 1,584 GB/s: bench --profile -np 8.)
//
// A warp takes R rows. Each lane streams 16-byte chunks of them (kU per row in flight), turns a chunk into 8
// floats once and applies it to every token's input (read through L1, which the block's warps share). The
// R x 8 partial sums (R x 8 x 2 for the GeGLU's gate and up) are reduced across the warp in 31 shuffles
// that leave each lane one finished sum, and all lanes store together.
#include <algorithm>
#include <string>

#include "cuda/check.h"
#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"
#include "cuda/kernels/launch.h"

namespace markbase::cuda {

namespace {

enum Mode { kStore = 0, kGeglu = 1, kGeluMul = 2 };
constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kT = kGemvBatchMax;  // tokens per pass
constexpr int kU = 2;              // 16-byte chunks per row in flight

struct Params {
    const float* x = nullptr;  // [n][ldx]
    int K = 0;
    int64_t ldx = 0;
    int n = 0;  // tokens of this pass, <= kT
    GemvSeg seg[3];
    int seg_end[3] = {0, 0, 0};  // cumulative row counts
    int nseg = 0, total_rows = 0;
    const bf16* w2 = nullptr;    // kGeglu: the up rows (seg[0] holds the gate rows)
    const float* aux = nullptr;  // kGeluMul: [n][ld_aux] multipliers
    int64_t ld_aux = 0;
};

// The 32 partial sums of each lane, reduced over the warp: afterwards lane l holds the whole sum of value l.
// Each step halves the values a lane carries, keeping the half its lane bit selects (16 + 8 + 4 + 2 + 1
// shuffles; the step width is a template argument so that every index is known and v stays in registers).
template <int Off>
__device__ __forceinline__ void transpose_step(float (&v)[32], int lane) {
    const bool upper = (lane & Off) != 0;
#pragma unroll
    for (int i = 0; i < Off; ++i) {
        const float send = upper ? v[i] : v[i + Off];
        const float keep = upper ? v[i + Off] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, Off);
    }
    if constexpr (Off > 1) transpose_step<Off / 2>(v, lane);
}
__device__ __forceinline__ float transpose_sum(float (&v)[32], int lane) {
    transpose_step<16>(v, lane);
    return v[0];
}

__device__ __forceinline__ void unpack8(const uint4 w, float (&f)[8]) {
    f[0] = bf16_lo(w.x);
    f[1] = bf16_hi(w.x);
    f[2] = bf16_lo(w.y);
    f[3] = bf16_hi(w.y);
    f[4] = bf16_lo(w.z);
    f[5] = bf16_hi(w.z);
    f[6] = bf16_lo(w.w);
    f[7] = bf16_hi(w.w);
}

__device__ __forceinline__ float dotf8(const float (&w)[8], const float4 a, const float4 b, float s) {
    s = fmaf(w[0], a.x, s);
    s = fmaf(w[1], a.y, s);
    s = fmaf(w[2], a.z, s);
    s = fmaf(w[3], a.w, s);
    s = fmaf(w[4], b.x, s);
    s = fmaf(w[5], b.y, s);
    s = fmaf(w[6], b.z, s);
    return fmaf(w[7], b.w, s);
}

// Row `row` (< total_rows) of the launch: its segment and its index there.
__device__ __forceinline__ int seg_of(const Params& p, int row, int& local) {
    int s = 0;
    while (s + 1 < p.nseg && row >= p.seg_end[s]) ++s;
    local = row - (s ? p.seg_end[s - 1] : 0);
    return s;
}

// This lane's chunks of the warp's R rows against every token: acc[r * kT + t] (the GeGLU's up products at
// R * kT + r * kT + t), not yet reduced over the warp.
template <int M, int R>
__device__ __forceinline__ void rows_dots(const Params& p, const uint4* const (&wr)[R],
                                          const uint4* const (&wu)[R], const bool (&valid)[R], int lane,
                                          float (&acc)[32]) {
    const int nchunk = p.K >> 3;
    for (int base = 0; base < nchunk; base += 32 * kU) {
        uint4 wv[R][kU], wv2[R][kU];
#pragma unroll
        for (int u = 0; u < kU; ++u) {
            const int c = base + u * 32 + lane;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const bool ok = valid[r] && c < nchunk;
                wv[r][u] = ok ? ld_stream(wr[r] + c) : make_uint4(0, 0, 0, 0);
                if constexpr (M == kGeglu) wv2[r][u] = ok ? ld_stream(wu[r] + c) : make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int u = 0; u < kU; ++u) {
            const int c = base + u * 32 + lane;
            if (c >= nchunk) continue;
            float wf[R][8], wf2[R][8];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                unpack8(wv[r][u], wf[r]);
                if constexpr (M == kGeglu) unpack8(wv2[r][u], wf2[r]);
            }
#pragma unroll
            for (int t = 0; t < kT; ++t) {
                if (t >= p.n) continue;
                const float4* xr = reinterpret_cast<const float4*>(p.x + t * p.ldx) + 2 * c;
                const float4 a = __ldg(xr), b = __ldg(xr + 1);
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    acc[r * kT + t] = dotf8(wf[r], a, b, acc[r * kT + t]);
                    if constexpr (M == kGeglu)
                        acc[R * kT + r * kT + t] = dotf8(wf2[r], a, b, acc[R * kT + r * kT + t]);
                }
            }
        }
    }
}

template <int M, int R>
__global__ void __launch_bounds__(kThreads) gemv_batch_kernel(const Params p) {
    static_assert(R * kT * (M == kGeglu ? 2 : 1) == 32, "the warp's sums fill its 32 lanes");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row0 = (blockIdx.x * kWarps + warp) * R;
    // the warp's rows (a row past the end reads row 0 and stores nothing)
    const uint4* wr[R];
    const uint4* wu[R];
    bool valid[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        valid[r] = row0 + r < p.total_rows;
        int local = 0;
        const int s = seg_of(p, valid[r] ? row0 + r : 0, local);
        wr[r] = reinterpret_cast<const uint4*>(p.seg[s].w + static_cast<int64_t>(local) * p.K);
        wu[r] = M == kGeglu ? reinterpret_cast<const uint4*>(p.w2 + static_cast<int64_t>(local) * p.K) : wr[r];
    }
    pdl_begin();
    float acc[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
    rows_dots<M, R>(p, wr, wu, valid, lane, acc);
    const float sum = transpose_sum(acc, lane);
    // lane l holds value l: row r = (l mod R kT) / kT, token t = l mod kT (the GeGLU: l >= 16 the up sums)
    const float up = M == kGeglu ? __shfl_down_sync(0xffffffffu, sum, R * kT) : 0.0f;
    if (M == kGeglu && lane >= R * kT) return;
    const int r = lane / kT, t = lane % kT, row = row0 + r;
    if (t >= p.n || row >= p.total_rows) return;
    int local = 0;
    const GemvSeg& sg = p.seg[seg_of(p, row, local)];
    float v = sum;
    if constexpr (M == kGeglu) v = gelu_tanh(sum) * up;
    if constexpr (M == kGeluMul) v = gelu_tanh(sum) * p.aux[t * p.ld_aux + row];
    sg.y[t * sg.ldy + local] = v;
}

// Passes of kT tokens; one block per kWarps x R rows.
template <int M, int R>
void launch(Params p, int n, cudaStream_t s) {
    if (p.K % 8 != 0 || p.ldx % 4 != 0)
        throw Error("internal: batched GEMV input width " + std::to_string(p.K) + " / stride " +
                    std::to_string(p.ldx) + " not a multiple of 8 / 4");
    p.total_rows = 0;
    for (int i = 0; i < p.nseg; ++i) p.seg_end[i] = (p.total_rows += p.seg[i].rows);
    if (p.total_rows == 0 || n <= 0) return;
    const int blocks = (p.total_rows + kWarps * R - 1) / (kWarps * R);
    const Params first = p;
    for (int t0 = 0; t0 < n; t0 += kT) {
        p.n = std::min(kT, n - t0);
        p.x = first.x + t0 * first.ldx;
        if (first.aux) p.aux = first.aux + t0 * first.ld_aux;
        for (int i = 0; i < p.nseg; ++i) p.seg[i].y = first.seg[i].y + t0 * first.seg[i].ldy;
        launch_kernel(gemv_batch_kernel<M, R>, dim3(blocks), dim3(kThreads), 0, s, p);
        CUDA_CHECK_LAUNCH();
    }
}

Params params(const GemvRows& in) {
    Params p;
    p.x = in.x;
    p.K = in.K;
    p.ldx = in.ldx;
    return p;
}

}  // namespace

void gemv_batch(const GemvRows& in, const GemvSeg* segs, int nseg, cudaStream_t s) {
    if (nseg < 1 || nseg > 3) throw Error("internal: batched GEMV of " + std::to_string(nseg) + " matrices");
    Params p = params(in);
    p.nseg = nseg;
    for (int i = 0; i < nseg; ++i) p.seg[i] = segs[i];
    launch<kStore, 4>(p, in.n, s);
}

void gemv_batch_geglu(const GemvRows& in, const bf16* wg, const bf16* wu, int rows, float* y, int64_t ldy,
                      cudaStream_t s) {
    Params p = params(in);
    p.nseg = 1;
    p.seg[0] = {wg, y, rows, ldy};
    p.w2 = wu;
    launch<kGeglu, 2>(p, in.n, s);
}

void gemv_batch_gelu_mul(const GemvRows& in, const bf16* w, int rows, const float* aux, int64_t ld_aux, float* y,
                         int64_t ldy, cudaStream_t s) {
    Params p = params(in);
    p.nseg = 1;
    p.seg[0] = {w, y, rows, ldy};
    p.aux = aux;
    p.ld_aux = ld_aux;
    launch<kGeluMul, 4>(p, in.n, s);
}

}  // namespace markbase::cuda
