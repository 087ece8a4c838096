// Kernel lab for a persistent decode step (docs/performance.md, "Decisions"): is one kernel with grid-wide
// barriers between phases faster than the production chain of launches (programmatic dependent launch, one
// CUDA graph)?
// The workload is E2B's decode layer without attention, over its 35 layers at real widths (3.7 GB of
// distinct bf16 weights, so L2 never serves them): per layer
//   qkv = Wqkv . norm(x)             [2560 x 1536]
//   o   = Wo . qkv[0:2048]           [1536 x 2048]   (attention left out: o_proj reads q directly)
//   x   = x + norm(o) * w
//   g   = gelu(Wg . norm(x)) * (Wu . norm(x))     [I x 1536], I = 6144 (layers 0-14) or 12288
//   m   = Wd . g                     [1536 x I]
//   x   = x + norm(m) * w
//   p   = gelu(Wpg . x) * ple_l      [256 x 1536]
//   o2  = Wpp . p                    [1536 x 256]
//   x   = (x + norm(o2) * w) * layer_scalar
// Variants:
//   A  the production launchers (src/cuda: gemv / gemv_geglu / gemv_gelu_mul at warpk, and
//      residual_add_norm), PDL on, 9 launches per layer captured as one graph
//   B  one cooperative kernel, a grid barrier after every phase (9 per layer); each block stages the phase's
//      input vector in shared memory (the input norm folded into the staging), then the same warp-per-row
//      products as A (the same U and warps per row); the residual updates by block 0
//   C  B, and each warp loads its first weights of the next phase before the barrier (they never depend on
//      it)
//   D  C with the residual updates folded into the next product's staging (every block computes the new x
//      in shared memory, block 0 also stores it): 6 barriers per layer
// Also the bare cost of a phase boundary: 315 empty PDL launches in a graph vs 315 grid barriers.
// Correctness gate: B, C and D's final x against A's (relative error, 1e-3).
//   markbase_persist_lab [--reps N]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"
#include "cuda/kernels/launch.h"
#include "lab_common.cuh"

namespace {

using markbase::bf16;
using namespace markbase::cuda;

constexpr int kH = 1536, kQKV = 2560, kQ = 2048, kP = 256, kLayers = 35;
constexpr float kEps = 1e-6f;
constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr int kMaxK = 12288;  // the widest staged input (down's)
constexpr int kCounters = 128;
enum Mode { kStore = 0, kGeglu = 1, kGeluMul = 2 };

struct Layer {
    const bf16 *qkv, *o, *g, *u, *d, *pg, *pp;      // weights, [out][in]
    const bf16 *n_in, *n_pa, *n_pf, *n_ffn, *n_pp;  // norm weights [kH]
    const float* ple;                               // [kP]
    int I;
    float scalar;
};
struct Bufs {
    float* x[2];  // the residual stream (B, C: x[0] in place; D: ping-pong)
    float *qkv, *o, *g, *m, *p, *o2;
    unsigned int* counter;  // the grid barrier's counters (grid_sync), kCounters of them
    int* timed_out;
    unsigned long long* stamps;  // null, or block 0's clock at the start and after every barrier
    unsigned long long* stats;   // null, or S's stage-wait counts (persist_stream.cuh)
};

struct Mat {
    const bf16* w;
    const bf16* w2;
    int rows, K;
};

// ---- the persistent kernel's pieces ----

__device__ __forceinline__ uint64_t now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ unsigned int ld_acquire(const unsigned int* p) {
    unsigned int v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
// Spins until *p >= target (as a wrapping count). Bounded at 2 s (and not at all once one wait has timed
// out) so a bug reports instead of hanging the machine.
__device__ __forceinline__ void wait_for(const unsigned int* p, unsigned int target, int* timed_out) {
    const uint64_t t0 = now_ns();
    for (int i = 0;; ++i) {
        if (static_cast<int>(ld_acquire(p) - target) >= 0) return;
        if ((i & 1023) == 1023 && (now_ns() - t0 > 2000000000ull || *static_cast<volatile int*>(timed_out))) {
            *timed_out = 1;
            return;
        }
    }
}

// Grid barrier number n (1, 2, ...; the counters start at zero). Kinds:
//   0  thread 0 of each block: __threadfence, atomicAdd on one counter, spin (cooperative groups' pattern)
//   1  one red.release (an arrival with no fence and no reply), spin
//   2  two levels: blocks in groups of kGroup arrive on their group's counter (atom.acq_rel); a group's last
//      arrival arrives on the top counter, waits for every group, then opens its group's flag; the others
//      spin on their group's flag (kGroup + ~grid/kGroup spinners per address instead of the whole grid)
// counters: [0] top, [1 + g] group g's arrivals, [kFlags + g] group g's flag.
constexpr int kGroup = 16, kFlags = 64;
template <int Kind>
__device__ __forceinline__ void grid_sync(unsigned int* counters, unsigned int n, int* timed_out) {
    __syncthreads();
    if (threadIdx.x == 0) {
        if constexpr (Kind == 0) {
            __threadfence();
            atomicAdd(counters, 1u);
            wait_for(counters, n * gridDim.x, timed_out);
        } else if constexpr (Kind == 1) {
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counters) : "memory");
            wait_for(counters, n * gridDim.x, timed_out);
        } else {
            const unsigned int g = blockIdx.x / kGroup, groups = (gridDim.x + kGroup - 1) / kGroup;
            const unsigned int size = min(static_cast<unsigned int>(kGroup), gridDim.x - g * kGroup);
            unsigned int old;
            asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], 1;"
                         : "=r"(old)
                         : "l"(counters + 1 + g)
                         : "memory");
            if (old + 1 == n * size) {
                asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counters) : "memory");
                wait_for(counters, n * groups, timed_out);
                asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(counters + kFlags + g), "r"(n)
                             : "memory");
            } else {
                wait_for(counters + kFlags + g, n, timed_out);
            }
        }
    }
    __syncthreads();
}

// Block-unit bu of a product: kWarps / W rows, each split over W warps (production's warpk layout).
template <int W>
struct Unit {
    int row, c_lo, c_hi;
    __device__ Unit(const Mat& m, int bu) {
        const int warp = threadIdx.x >> 5, nchunk = m.K >> 3, per = (nchunk + W - 1) / W;
        row = bu * (kWarps / W) + warp / W;
        c_lo = (warp % W) * per;
        c_hi = min(nchunk, c_lo + per);
        if (row >= m.rows) c_hi = c_lo;  // nothing to load
    }
};

template <int M, int W, int U>
__device__ __forceinline__ void load_round(const Mat& m, const Unit<W>& un, int base, uint4* v, uint4* v2) {
    const int lane = threadIdx.x & 31;
    const uint4* w = reinterpret_cast<const uint4*>(m.w) + static_cast<int64_t>(un.row) * (m.K >> 3);
    const uint4* w2 = reinterpret_cast<const uint4*>(m.w2) + static_cast<int64_t>(un.row) * (m.K >> 3);
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int c = base + u * 32 + lane;
        const bool ok = c < un.c_hi;
        v[u] = ok ? ld_stream(w + c) : make_uint4(0, 0, 0, 0);
        if constexpr (M == kGeglu) v2[u] = ok ? ld_stream(w2 + c) : make_uint4(0, 0, 0, 0);
    }
}

// The first round of this block's first unit, before the barrier (variants C, D).
template <int M, int W, int U>
__device__ __forceinline__ bool preload(const Mat& m, uint4* v, uint4* v2) {
    const int nunits = (m.rows + kWarps / W - 1) / (kWarps / W);
    if (static_cast<int>(blockIdx.x) >= nunits) return false;
    const Unit<W> un(m, blockIdx.x);
    load_round<M, W, U>(m, un, un.c_lo, v, v2);
    return true;
}

// y = product of the staged input xs (shared memory) with m's rows, times inv (the input norm's scale).
template <int M, int W, int U>
__device__ void gemv_phase(const Mat& m, const float* xs, float inv, float* y, const float* aux, uint4* v,
                           uint4* v2, bool preloaded, float (*partial)[2]) {
    constexpr int RPB = kWarps / W;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nunits = (m.rows + RPB - 1) / RPB;
    const float4* x4 = reinterpret_cast<const float4*>(xs);
    for (int bu = blockIdx.x; bu < nunits; bu += gridDim.x) {
        const Unit<W> un(m, bu);
        float acc = 0.0f, acc2 = 0.0f;
        for (int base = un.c_lo; base < un.c_hi; base += 32 * U) {
            if (!preloaded || base != un.c_lo) load_round<M, W, U>(m, un, base, v, v2);
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int c = base + u * 32 + lane;
                if (c < un.c_hi) {
                    const float4 a = x4[2 * c], b = x4[2 * c + 1];
                    acc += dot8(v[u], a, b);
                    if constexpr (M == kGeglu) acc2 += dot8(v2[u], a, b);
                }
            }
        }
        preloaded = false;
        acc = warp_sum(acc);
        if constexpr (M == kGeglu) acc2 = warp_sum(acc2);
        if constexpr (W > 1) {
            if (lane == 0) {
                partial[warp][0] = acc;
                partial[warp][1] = acc2;
            }
            __syncthreads();
            if (warp % W == 0) {
                acc = acc2 = 0.0f;
#pragma unroll
                for (int j = 0; j < W; ++j) {
                    acc += partial[warp + j][0];
                    acc2 += partial[warp + j][1];
                }
            }
            __syncthreads();
        }
        if (lane == 0 && warp % W == 0 && un.row < m.rows) {
            acc *= inv;
            acc2 *= inv;
            if constexpr (M == kStore)
                y[un.row] = acc;
            else if constexpr (M == kGeglu)
                y[un.row] = gelu_tanh(acc) * acc2;
            else
                y[un.row] = gelu_tanh(acc) * aux[un.row];
        }
    }
}

// xs = src (times nw when given); returns the RMSNorm scale of src when norm, else 1. src was written by
// other blocks in this kernel: read from L2 (ld.cg), never a stale L1 line.
__device__ float stage(float* xs, const float* src, int K, bool norm, const bf16* nw, float* red) {
    float ss = 0.0f;
#pragma unroll 4
    for (int k = threadIdx.x * 4; k < K; k += kThreads * 4) {
        float4 a = __ldcg(reinterpret_cast<const float4*>(src + k));
        ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
        if (nw) {
            a.x *= bf16_at(nw, k);
            a.y *= bf16_at(nw, k + 1);
            a.z *= bf16_at(nw, k + 2);
            a.w *= bf16_at(nw, k + 3);
        }
        *reinterpret_cast<float4*>(xs + k) = a;
    }
    if (!norm) {
        __syncthreads();
        return 1.0f;
    }
    ss = block_sum(ss, red);  // its barriers also publish xs
    return 1.0f / sqrtf(ss / static_cast<float>(K) + kEps);
}

// The residual update folded into staging (variant D): xn = (x + RMSNorm(y) * rw) * rscale over kH, kept in
// xs (times nw when given) and stored by block 0 to x_out; returns xn's RMSNorm scale when norm, else 1.
__device__ float stage_fold(float* xs, const float* x, const float* y, const bf16* rw, float rscale,
                            float* x_out, bool norm, const bf16* nw, float* red) {
    constexpr int kPer = (kH + kThreads - 1) / kThreads;  // 6
    float yv[kPer], xv[kPer];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        const int k = threadIdx.x + j * kThreads;
        yv[j] = k < kH ? __ldcg(y + k) : 0.0f;
        xv[j] = k < kH ? __ldcg(x + k) : 0.0f;
        ss = fmaf(yv[j], yv[j], ss);
    }
    ss = block_sum(ss, red);
    const float inv_y = 1.0f / sqrtf(ss / static_cast<float>(kH) + kEps);
    float sx = 0.0f;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        const int k = threadIdx.x + j * kThreads;
        if (k < kH) {
            const float xn = (xv[j] + yv[j] * inv_y * bf16_at(rw, k)) * rscale;
            sx = fmaf(xn, xn, sx);
            if (blockIdx.x == 0) x_out[k] = xn;
            xs[k] = nw ? xn * bf16_at(nw, k) : xn;
        }
    }
    if (!norm) {
        __syncthreads();
        return 1.0f;
    }
    sx = block_sum(sx, red);
    return 1.0f / sqrtf(sx / static_cast<float>(kH) + kEps);
}

// x = (x + RMSNorm(y) * w) * scale in place, by block 0 (B, C): stage_fold's update (each thread reads its
// elements before writing them; xs is restaged by the next phase).
__device__ void residual_block0(float* xs, float* x, const float* y, const bf16* w, float scale, float* red) {
    if (blockIdx.x == 0) stage_fold(xs, x, y, w, scale, x, false, nullptr, red);
}

// Layer matrices and their compile-time shapes (production's U and warps per row for these K).
__device__ __forceinline__ Mat m_qkv(const Layer& L) {
    return {L.qkv, nullptr, kQKV, kH};
}
__device__ __forceinline__ Mat m_o(const Layer& L) {
    return {L.o, nullptr, kH, kQ};
}
__device__ __forceinline__ Mat m_gu(const Layer& L) {
    return {L.g, L.u, L.I, kH};
}
__device__ __forceinline__ Mat m_d(const Layer& L) {
    return {L.d, nullptr, kH, L.I};
}
__device__ __forceinline__ Mat m_pg(const Layer& L) {
    return {L.pg, nullptr, kP, kH};
}
__device__ __forceinline__ Mat m_pp(const Layer& L) {
    return {L.pp, nullptr, kH, kP};
}

template <bool Prefetch, bool Fold, int MinBlocks, int Barrier = 0>
__global__ void __launch_bounds__(kThreads, MinBlocks)
    persistent_kernel(const Layer* __restrict__ layers, int n_layers, Bufs b) {
    extern __shared__ float4 smem4[];
    float* xs = reinterpret_cast<float*>(smem4);
    __shared__ float red[32];
    __shared__ float partial[kWarps][2];
    uint4 v[8], v2[4];
    unsigned int nb = 0;  // barriers passed
    const bool stamp = b.stamps && blockIdx.x == 0 && threadIdx.x == 0;
    if (stamp) b.stamps[0] = now_ns();
    auto sync = [&] {
        grid_sync<Barrier>(b.counter, ++nb, b.timed_out);
        if (stamp) b.stamps[nb] = now_ns();
    };
    int cur = 0;  // D: which x buffer holds the stream
    bool pre = false;
    for (int l = 0; l < n_layers; ++l) {
        const Layer& L = layers[l];
        float inv;
        // qkv
        if (Fold && l > 0) {
            const Layer& P = layers[l - 1];
            inv = stage_fold(xs, b.x[cur], b.o2, P.n_pp, P.scalar, b.x[cur ^ 1], true, L.n_in, red);
            cur ^= 1;
        } else {
            inv = stage(xs, b.x[cur], kH, true, L.n_in, red);
        }
        gemv_phase<kStore, 2, 4>(m_qkv(L), xs, inv, b.qkv, nullptr, v, v2, pre, partial);
        if (Prefetch) pre = preload<kStore, 2, 4>(m_o(L), v, v2);
        sync();
        // o_proj
        stage(xs, b.qkv, kQ, false, nullptr, red);
        gemv_phase<kStore, 2, 4>(m_o(L), xs, 1.0f, b.o, nullptr, v, v2, pre, partial);
        if (Prefetch) pre = preload<kGeglu, 2, 4>(m_gu(L), v, v2);
        sync();
        // residual, GeGLU
        if (Fold) {
            inv = stage_fold(xs, b.x[cur], b.o, L.n_pa, 1.0f, b.x[cur ^ 1], true, L.n_pf, red);
            cur ^= 1;
        } else {
            residual_block0(xs, b.x[0], b.o, L.n_pa, 1.0f, red);
            sync();
            inv = stage(xs, b.x[0], kH, true, L.n_pf, red);
        }
        gemv_phase<kGeglu, 2, 4>(m_gu(L), xs, inv, b.g, nullptr, v, v2, pre, partial);
        if (Prefetch)
            pre = L.I > 8192 ? preload<kStore, 8, 8>(m_d(L), v, v2) : preload<kStore, 4, 8>(m_d(L), v, v2);
        sync();
        // down
        stage(xs, b.g, L.I, false, nullptr, red);
        if (L.I > 8192)
            gemv_phase<kStore, 8, 8>(m_d(L), xs, 1.0f, b.m, nullptr, v, v2, pre, partial);
        else
            gemv_phase<kStore, 4, 8>(m_d(L), xs, 1.0f, b.m, nullptr, v, v2, pre, partial);
        if (Prefetch) pre = preload<kGeluMul, 2, 4>(m_pg(L), v, v2);
        sync();
        // residual, PLE gate
        if (Fold) {
            inv = stage_fold(xs, b.x[cur], b.m, L.n_ffn, 1.0f, b.x[cur ^ 1], false, nullptr, red);
            cur ^= 1;
        } else {
            residual_block0(xs, b.x[0], b.m, L.n_ffn, 1.0f, red);
            sync();
            inv = stage(xs, b.x[0], kH, false, nullptr, red);
        }
        gemv_phase<kGeluMul, 2, 4>(m_pg(L), xs, inv, b.p, L.ple, v, v2, pre, partial);
        if (Prefetch) pre = preload<kStore, 1, 4>(m_pp(L), v, v2);
        sync();
        // PLE projection
        stage(xs, b.p, kP, false, nullptr, red);
        gemv_phase<kStore, 1, 4>(m_pp(L), xs, 1.0f, b.o2, nullptr, v, v2, pre, partial);
        if (Prefetch) pre = l + 1 < n_layers && preload<kStore, 2, 4>(m_qkv(layers[l + 1]), v, v2);
        sync();
        if (!Fold) {  // residual (D folds it into the next layer's qkv staging)
            residual_block0(xs, b.x[0], b.o2, L.n_pp, L.scalar, red);
            sync();
        }
    }
    if (Fold) {  // the last layer's update, and the stream back in x[0]
        if (blockIdx.x == 0) {
            const Layer& P = layers[n_layers - 1];
            stage_fold(xs, b.x[cur], b.o2, P.n_pp, P.scalar, b.x[0], false, nullptr, red);
        }
    }
}

template <int Kind>
__global__ void __launch_bounds__(kThreads) barriers_kernel(int n, unsigned int* counters, int* timed_out) {
    for (int i = 1; i <= n; ++i) grid_sync<Kind>(counters, i, timed_out);
}

__global__ void __launch_bounds__(kThreads) empty_kernel(int) {
    pdl_begin();
}

// bf16(center + spread * uniform[-1, 1)) from a counter hash
__global__ void fill_bf16(uint16_t* w, int64_t n, uint64_t seed, float center, float spread) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const float f = center + spread * lab::uniform_pm1(seed, i);
        uint32_t bits = __float_as_uint(f);
        bits += 0x7fffu + ((bits >> 16) & 1u);
        w[i] = static_cast<uint16_t>(bits >> 16);
    }
}
__global__ void fill_f32(float* x, int64_t n, uint64_t seed) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        x[i] = lab::uniform_pm1(seed, i);
    }
}

// ---- host ----

uint64_t g_seed = 1;
bf16* new_bf16(int64_t n, float center, float spread) {
    bf16* p = nullptr;
    CK(cudaMalloc(&p, static_cast<size_t>(n) * sizeof(bf16)));
    fill_bf16<<<1024, 256>>>(p, n, g_seed++ * 0x1234567ull, center, spread);
    CK(cudaGetLastError());
    return p;
}
float* new_f32(int64_t n, bool random) {
    float* p = nullptr;
    CK(cudaMalloc(&p, static_cast<size_t>(n) * sizeof(float)));
    if (random) {
        fill_f32<<<64, 256>>>(p, n, g_seed++ * 0x7654321ull);
        CK(cudaGetLastError());
    } else {
        CK(cudaMemset(p, 0, static_cast<size_t>(n) * sizeof(float)));
    }
    return p;
}

// A: the production launchers, one layer
void record_launches(const std::vector<Layer>& ls, const Bufs& b, cudaStream_t s) {
    auto input = [](const float* x, int K, const bf16* norm_w) {  // norm_w: the input RMSNorm's weights
        GemvInput in;
        in.kernel = GemvKernel::kRows;
        in.eps = kEps;
        in.x = x;
        in.K = K;
        in.norm = norm_w != nullptr;
        in.norm_w = norm_w;
        return in;
    };
    for (const Layer& L : ls) {
        const GemvSeg qkv{L.qkv, b.qkv, kQKV, 0}, o{L.o, b.o, kH, 0}, d{L.d, b.m, kH, 0},
            pp{L.pp, b.o2, kH, 0};
        gemv(input(b.x[0], kH, L.n_in), &qkv, 1, 1, s);
        gemv(input(b.qkv, kQ, nullptr), &o, 1, 1, s);
        residual_add_norm(b.x[0], b.o, L.n_pa, kH, 1, kEps, 1.0f, s);
        gemv_geglu(input(b.x[0], kH, L.n_pf), L.g, L.u, L.I, b.g, s);
        gemv(input(b.g, L.I, nullptr), &d, 1, 1, s);
        residual_add_norm(b.x[0], b.m, L.n_ffn, kH, 1, kEps, 1.0f, s);
        gemv_gelu_mul(input(b.x[0], kH, nullptr), L.pg, kP, L.ple, b.p, s);
        gemv(input(b.p, kP, nullptr), &pp, 1, 1, s);
        residual_add_norm(b.x[0], b.o2, L.n_pp, kH, 1, kEps, L.scalar, s);
    }
}

using lab::median;
using lab::time_ms;

struct Persistent {
    const void* fn;
    const char* name;
    int min_blocks;
};

#include "persist_stream.cuh"

// MB of weights read by a phase named in the per-phase report, at MLP width I (0: no weights)
double phase_mb(const char* name, int I) {
    const std::string n(name);
    if (n.rfind("qkv", 0) == 0) return 2.0 * kQKV * kH / 1e6;
    if (n == "o_proj") return 2.0 * kH * kQ / 1e6;
    if (n.rfind("gate_up", 0) == 0) return 4.0 * I * kH / 1e6;
    if (n == "down") return 2.0 * kH * I / 1e6;
    if (n.rfind("ple_gate", 0) == 0) return 2.0 * kP * kH / 1e6;
    if (n == "ple_proj") return 2.0 * kH * kP / 1e6;
    return 0.0;
}

}  // namespace

int main(int argc, char** argv) {
    int reps = 20;
    bool stream_only = false;  // --stream-only: A and the S variants (and not B-D or the bare boundaries)
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::max(3, std::atoi(argv[++i]));
        if (!std::strcmp(argv[i], "--stream-only")) stream_only = true;
    }
    cudaDeviceProp prop{};
    CK(cudaGetDeviceProperties(&prop, 0));
    const int sms = prop.multiProcessorCount;
    std::printf("persist_lab on %s (%d SMs): E2B decode layer without attention, %d layers\n", prop.name, sms,
                kLayers);

    std::vector<Layer> ls(kLayers);
    double bytes = 0.0;
    for (int l = 0; l < kLayers; ++l) {
        Layer& L = ls[l];
        L.I = l < 15 ? 6144 : 12288;
        L.scalar = 1.0f;
        const float a = 0.04f;
        L.qkv = new_bf16(int64_t{kQKV} * kH, 0.0f, a);
        L.o = new_bf16(int64_t{kH} * kQ, 0.0f, a);
        L.g = new_bf16(int64_t{L.I} * kH, 0.0f, a);
        L.u = new_bf16(int64_t{L.I} * kH, 0.0f, a);
        L.d = new_bf16(int64_t{kH} * L.I, 0.0f, a);
        L.pg = new_bf16(int64_t{kP} * kH, 0.0f, a);
        L.pp = new_bf16(int64_t{kH} * kP, 0.0f, a);
        L.n_in = new_bf16(kH, 1.0f, 0.2f);
        L.n_pa = new_bf16(kH, 1.0f, 0.2f);
        L.n_pf = new_bf16(kH, 1.0f, 0.2f);
        L.n_ffn = new_bf16(kH, 1.0f, 0.2f);
        L.n_pp = new_bf16(kH, 1.0f, 0.2f);
        L.ple = new_f32(kP, true);
        bytes += 2.0 * (double(kQKV) * kH + double(kH) * kQ + 3.0 * L.I * kH + 2.0 * kP * kH);
    }
    Layer* d_layers = nullptr;
    CK(cudaMalloc(&d_layers, sizeof(Layer) * kLayers));
    CK(cudaMemcpy(d_layers, ls.data(), sizeof(Layer) * kLayers, cudaMemcpyHostToDevice));
    Bufs b{};
    float* x0 = new_f32(kH, true);
    b.x[0] = new_f32(kH, false);
    b.x[1] = new_f32(kH, false);
    b.qkv = new_f32(kQKV, false);
    b.o = new_f32(kH, false);
    b.g = new_f32(kMaxK, false);
    b.m = new_f32(kH, false);
    b.p = new_f32(kP, false);
    b.o2 = new_f32(kH, false);
    CK(cudaMalloc(&b.counter, kCounters * sizeof(unsigned int)));
    const int n_stamps = 1 + std::max(9, stream::kSubStamps * stream::kPhases) * kLayers;
    unsigned long long* d_stamps = nullptr;
    CK(cudaMalloc(&d_stamps, n_stamps * sizeof(unsigned long long)));
    CK(cudaMalloc(&b.timed_out, sizeof(int)));
    CK(cudaMemset(b.timed_out, 0, sizeof(int)));
    CK(cudaDeviceSynchronize());
    std::printf("weights: %.2f GB (%.1f MB per layer), roofline %.3f ms at 4.16 TB/s\n", bytes / 1e9,
                bytes / kLayers / 1e6, bytes / 4.16e9);

    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    auto reset_x = [&] { CK(cudaMemcpyAsync(b.x[0], x0, kH * sizeof(float), cudaMemcpyDeviceToDevice, s)); };

    // A: graph of launches
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    record_launches(ls, b, s);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    reset_x();
    CK(cudaGraphLaunch(ge, s));
    std::vector<float> ref(kH), got(kH);
    CK(cudaMemcpyAsync(ref.data(), b.x[0], kH * sizeof(float), cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    bool ref_ok = true;
    for (float f : ref) ref_ok = ref_ok && std::isfinite(f);
    const float ta = time_ms(reps, s, [&] { CK(cudaGraphLaunch(ge, s)); });
    auto report = [&](const char* name, float ms, const char* extra) {
        std::printf("  %-34s %8.3f ms  %6.2f us/layer  %7.1f GB/s  %5.1f%% roofline  %s\n", name, ms,
                    1000.0 * ms / kLayers, bytes / ms / 1e6, 100.0 * bytes / ms / 1e6 / 4160.0, extra);
    };
    std::printf("decode chain (median of %d):\n", reps);
    report("A launches (production, PDL, graph)", ta, ref_ok ? "reference finite" : "REFERENCE NOT FINITE");

    const Persistent variants[] = {
        {reinterpret_cast<const void*>(persistent_kernel<false, false, 3>), "B persistent, 3 blocks/SM", 3},
        {reinterpret_cast<const void*>(persistent_kernel<false, false, 3, 1>), "B1 B, barrier kind 1", 3},
        {reinterpret_cast<const void*>(persistent_kernel<false, false, 3, 2>), "B2 B, barrier kind 2", 3},
        {reinterpret_cast<const void*>(persistent_kernel<true, true, 3, 2>), "D2 D, barrier kind 2", 3},
        {reinterpret_cast<const void*>(persistent_kernel<true, false, 3>), "C B + preload, 3 blocks/SM", 3},
        {reinterpret_cast<const void*>(persistent_kernel<true, true, 3>), "D C + folded residuals, 3/SM", 3},
        {reinterpret_cast<const void*>(persistent_kernel<true, true, 2>), "D at 2 blocks/SM", 2},
        {reinterpret_cast<const void*>(persistent_kernel<true, true, 4>), "D at 4 blocks/SM", 4},
    };
    int failures = 0;
    // One persistent variant: the correctness gate, the timing, and with `phases` (barriers per layer) block
    // 0's clock per phase.
    // sub: stamps per phase (S: staged, consumed, epilogue, barrier); cw: S's consumer warps (its stats)
    auto run_variant = [&](const void* fn, const char* name, int min_blocks, int threads, size_t smem,
                           const char* const* phase_names, int phases, int sub, int cw) {
        CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
        int occ = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, fn, threads, smem));
        cudaFuncAttributes fa{};
        CK(cudaFuncGetAttributes(&fa, fn));
        if (occ < 1) {
            std::printf("  %-34s does not fit (registers %d, %zu B of shared memory)\n", name, fa.numRegs,
                        smem);
            return;
        }
        const int blocks = std::min(occ, min_blocks) * sms;
        const int n_layers = kLayers;
        void* args[] = {const_cast<Layer**>(&d_layers), const_cast<int*>(&n_layers), &b};
        auto launch = [&] {
            CK(cudaMemsetAsync(b.counter, 0, kCounters * sizeof(unsigned int), s));
            CK(cudaLaunchCooperativeKernel(fn, dim3(blocks), dim3(threads), args, smem, s));
        };
        reset_x();
        launch();
        CK(cudaMemcpyAsync(got.data(), b.x[0], kH * sizeof(float), cudaMemcpyDeviceToHost, s));
        int timed_out = 0;
        CK(cudaMemcpyAsync(&timed_out, b.timed_out, sizeof(int), cudaMemcpyDeviceToHost, s));
        CK(cudaStreamSynchronize(s));
        double num = 0.0, den = 0.0;
        bool finite = true;
        for (int k = 0; k < kH; ++k) {
            finite = finite && std::isfinite(got[k]);
            num += (double(got[k]) - ref[k]) * (double(got[k]) - ref[k]);
            den += double(ref[k]) * ref[k];
        }
        const double rel = std::sqrt(num / std::max(den, 1e-30));
        const bool ok = finite && !timed_out && rel < 1e-3;
        failures += ok ? 0 : 1;
        if (timed_out)
            CK(cudaMemsetAsync(b.timed_out, 0, sizeof(int), s));  // (the next variant starts clean)
        const float t = time_ms(reps, s, launch);
        char extra[160];
        std::snprintf(extra, sizeof extra, "%d blocks, %d regs, rel err %.2e %s%s", blocks, fa.numRegs, rel,
                      ok ? "ok" : "FAIL", timed_out ? " (barrier timed out)" : "");
        report(name, t, extra);
        if (phases) {  // block 0's time per phase, barrier included
            b.stamps = d_stamps;
            launch();
            b.stamps = nullptr;
            std::vector<unsigned long long> st(n_stamps);
            CK(cudaMemcpyAsync(st.data(), d_stamps, n_stamps * sizeof(unsigned long long),
                               cudaMemcpyDeviceToHost, s));
            CK(cudaStreamSynchronize(s));
            for (int wide = 0; wide < 2; ++wide) {
                const int I = wide ? 12288 : 6144;
                std::printf("    %s layers (I = %d), us per phase (block 0, barrier included%s):",
                            wide ? "15-34" : "0-14", I,
                            sub > 1 ? "; [staging/consume/epilogue/barrier]" : "");
                for (int ph = 0; ph < phases; ++ph) {
                    double part[4] = {0, 0, 0, 0};
                    int cnt = 0;
                    for (int l = wide ? 15 : 0; l < (wide ? kLayers : 15); ++l) {
                        const int k = (l * phases + ph) * sub + 1;  // its first stamp
                        for (int j = 0; j < sub; ++j)
                            part[j] += static_cast<double>(st[k + j] - st[k + j - 1]) / 1000.0;
                        ++cnt;
                    }
                    double us = 0.0;
                    for (int j = 0; j < sub; ++j) us += part[j] / cnt;
                    const double mb = phase_mb(phase_names[ph], I);
                    if (mb > 0)
                        std::printf(" %s %.2f (%.0f GB/s)", phase_names[ph], us, mb / us * 1000.0);
                    else
                        std::printf(" %s %.2f", phase_names[ph], us);
                    if (sub > 1)
                        std::printf(" [%.2f/%.2f/%.2f/%.2f]", part[0] / cnt, part[1] / cnt, part[2] / cnt,
                                    part[3] / cnt);
                }
                std::printf("\n");
            }
        }
        if (cw) {  // how often a stage wait found its stage not ready
            unsigned long long* d_stats = nullptr;
            CK(cudaMalloc(&d_stats, 3 * sizeof(unsigned long long)));
            CK(cudaMemsetAsync(d_stats, 0, 3 * sizeof(unsigned long long), s));
            b.stats = d_stats;
            launch();
            b.stats = nullptr;
            unsigned long long h[3];
            CK(cudaMemcpyAsync(h, d_stats, sizeof h, cudaMemcpyDeviceToHost, s));
            CK(cudaStreamSynchronize(s));
            CK(cudaFree(d_stats));
            std::printf(
                "    stage waits that blocked: producer (no free stage) %.1f%% of %llu fills, consumers "
                "(stage not yet full) %.1f%% of %llu warp waits\n",
                100.0 * double(h[0]) / double(std::max(h[1], 1ull)), h[1],
                100.0 * double(h[2]) / double(std::max(h[1] * cw, 1ull)), h[1] * cw);
        }
    };
    static const char* const kPhase9[9] = {"qkv",      "o_proj",   "residual", "gate_up", "down",
                                           "residual", "ple_gate", "ple_proj", "residual"};
    if (!stream_only)
        for (const Persistent& pv : variants)
            run_variant(pv.fn, pv.name, pv.min_blocks, kThreads, kMaxK * sizeof(float), kPhase9,
                        pv.name[0] == 'B' ? 9 : 0, 1, 0);
    // S: the weights streamed through a ring of shared-memory stages (persist_stream.cuh); 6 barriers per
    // layer, the residuals folded into the staging as in D
    static const char* const kPhase6[6] = {"qkv(+res)", "o_proj",         "gate_up(+res)",
                                           "down",      "ple_gate(+res)", "ple_proj"};
    struct Streamed {
        const void* fn;
        const char* name;
        size_t smem;
        int cw;
    };
    using stream::smem_bytes;
    using stream::streamed_kernel;
    const Streamed streamed[] = {
        {reinterpret_cast<const void*>(streamed_kernel<10, 16384, 15, 2>),
         "S3 ring 10 x 16 KB, 15 warps, rows", smem_bytes<10, 16384>(), 15},
        {reinterpret_cast<const void*>(streamed_kernel<10, 16384, 15, 3>), "S4 S3, conflict-free x, 15 warps",
         smem_bytes<10, 16384>(), 15},
        {reinterpret_cast<const void*>(streamed_kernel<10, 16384, 8, 3>), "S4 S3, conflict-free x, 8 warps",
         smem_bytes<10, 16384>(), 8},
        {reinterpret_cast<const void*>(streamed_kernel<6, 16384, 15, 3>), "S4, ring 6 x 16 KB, 15 warps",
         smem_bytes<6, 16384>(), 15},
    };
    for (const Streamed& sv : streamed)
        run_variant(sv.fn, sv.name, 1, (sv.cw + 1) * 32, sv.smem, kPhase6, 6, stream::kSubStamps, sv.cw);
    if (stream_only) {
        std::printf("correctness gate: %s\n", failures ? "FAIL" : "all persistent variants match A");
        return failures ? 1 : 0;
    }

    // the bare phase boundary: empty launches vs grid barriers
    const int n_bound = 9 * kLayers;
    const int eblocks = 3 * sms;
    cudaGraph_t g2;
    cudaGraphExec_t ge2;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < n_bound; ++i) launch_kernel(empty_kernel, dim3(eblocks), dim3(kThreads), 0, s, 0);
    CK(cudaStreamEndCapture(s, &g2));
    CK(cudaGraphInstantiate(&ge2, g2, 0));
    const float te = time_ms(reps, s, [&] { CK(cudaGraphLaunch(ge2, s)); });
    std::printf(
        "phase boundary (%d of them): empty PDL launches in a graph (%d blocks of %d threads) %.3f us each\n",
        n_bound, eblocks, kThreads, 1000.0 * te / n_bound);
    int n = n_bound;
    void* bargs[] = {&n, &b.counter, &b.timed_out};
    const void* kinds[3] = {reinterpret_cast<const void*>(barriers_kernel<0>),
                            reinterpret_cast<const void*>(barriers_kernel<1>),
                            reinterpret_cast<const void*>(barriers_kernel<2>)};
    for (int kind = 0; kind < 3; ++kind) {
        std::printf("  grid barrier kind %d, us each:", kind);
        for (int per_sm = 1; per_sm <= 4; ++per_sm) {
            const float tb = time_ms(reps, s, [&] {
                CK(cudaMemsetAsync(b.counter, 0, kCounters * sizeof(unsigned int), s));
                CK(cudaLaunchCooperativeKernel(kinds[kind], dim3(per_sm * sms), dim3(kThreads), bargs, 0, s));
            });
            std::printf(" %d blocks %.3f", per_sm * sms, 1000.0 * tb / n_bound);
        }
        int timed_out = 0;
        CK(cudaMemcpy(&timed_out, b.timed_out, sizeof(int), cudaMemcpyDeviceToHost));
        std::printf("%s\n", timed_out ? " (TIMED OUT)" : "");
        failures += timed_out;
    }
    std::printf("correctness gate: %s\n", failures ? "FAIL" : "all persistent variants match A");
    return failures ? 1 : 0;
}
