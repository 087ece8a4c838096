// quant_gemv_lab.cu's variants of the product kernel (gemv_quant.cu), plain products only (one segment, no
// norm, int4 symmetric).
//   v3: persistent blocks. The product launches a block per tile of 8 * NT rows, each block staging all of x
//       (K floats as f16 halves) before its first MMA, its 8 warps splitting K eight ways: on the 31B's int4
//       q/k/v a warp walks ~5 super-steps of a tile and the block lives about as long as its prologue. Here
//       the grid is at most 2 blocks a SM (balanced: every block walks the same number of rounds), x is
//       staged once per block, and a tile of 8 rows is walked by KS warps (K split KS ways, their sums met
//       in shared memory behind a named barrier of those KS warps), so a warp streams K / KS of each tile it
//       takes. int4's group scales are loaded with the weights (no staging, no barrier per tile).
//       Run 1 (H200, a401719): the listed products a token, v3 against the product then: 31B int4 8.85
//       against 9.57 ms, FP8 9.18 against 10.99. KS chosen per shape beat KS = 1 on every model and KS = 8 on
//       three (E4B: KS = 8 by 0.1%); 6 super-steps a buffer against 4: int4 lost on three models (31B 9.11
//       against 8.85 ms), FP8 won on the 31B (9.01 against 9.18) and lost on E2B and the 26B-A4B. Promoted
//       with 4, the next tile's loads issued under a tile's last set (gemv_quant.cu); kept here with two
//       switches:
//         Trick: int4 codes through int4_word_to_f16 (2 instructions a pair, not 3): within 3% either way
//           (run 2: E2B 960 against 975 us, 26B-A4B 1,500 against 1,533, 31B 8,871 against 8,798);
//         XAll: every lane loads x's fragments (no predicate, no zeroing): int4 +43% on the 31B (12,569
//           against 8,798 us; 4x the shared memory wavefronts), FP8 +1%: the product loads them in lanes
//           g < 2 only.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/quant_operands.cuh"

namespace qv {

using namespace markbase::cuda::quant;  // NOLINT: the product's operand pieces
using markbase::cuda::ld_stream;
using markbase::cuda::mma_f16;

// int4: nibbles sh/4 and sh/4 + 4 of w as the f16 pair (n - zero): 0x6400 | n is 1024 + n exactly, and
// zz holds 1024 + zero in both halves (v3 without Trick: a shift, a LOP3 and a subtraction a pair)
__device__ __forceinline__ uint32_t nib2_to_f16x2(uint32_t w, int sh, uint32_t zz) {
    const uint32_t h = ((w >> sh) & 0x000f000fu) | 0x64006400u;
    const __half2 d = __hsub2(*reinterpret_cast<const __half2*>(&h), *reinterpret_cast<const __half2*>(&zz));
    return *reinterpret_cast<const uint32_t*>(&d);
}

__device__ __forceinline__ void bar_named(int id, int threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// One super-step of one tile, the weights as B (8 rows a tile), x as A's rows 0 (hi) and 1 (lo): FP8 straight
// into the sums; int4 from zero, then times the group scales of this lane's C columns (rows 2t, 2t + 1), sc.
// int4 codes to f16 by int4_word_to_f16 (Trick) or by a shift, a LOP3 and a subtraction a pair
// (nib2_to_f16x2). (The product's step takes the weights as A, 16 rows a tile: quant_operands.cuh.)
template <Fmt F, bool Trick>
__device__ __forceinline__ void step_of(float (&c)[4], uint4 v, const uint32_t (&ax)[kMmas<F>],
                                        const uint32_t (&ay)[kMmas<F>], float2 sc) {
    const uint32_t wv[4] = {v.x, v.y, v.z, v.w};
    if constexpr (F == Fmt::kFp8) {
#pragma unroll
        for (int j = 0; j < 4; ++j)
            mma_f16(c, ax[j], 0u, ay[j], 0u, markbase::cuda::fp8x2_to_f16x2(wv[j] & 0xffffu),
                    markbase::cuda::fp8x2_to_f16x2(wv[j] >> 16));
    } else {
        constexpr uint32_t zz = 0x64086408u;  // 1024 + 8 in both halves: symmetric codes
        constexpr uint32_t zh = 0xd480d480u;  // -(64 + 8) in both halves
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            uint32_t b[4];
            if constexpr (Trick) {
                int4_word_to_f16(wv[i], zz, zh, b);
            } else {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    b[2 * h] = nib2_to_f16x2(wv[i], 8 * h, zz);
                    b[2 * h + 1] = nib2_to_f16x2(wv[i], 8 * h + 4, zz);
                }
            }
            mma_f16(d, ax[2 * i], 0u, ay[2 * i], 0u, b[0], b[1]);
            mma_f16(d, ax[2 * i + 1], 0u, ay[2 * i + 1], 0u, b[2], b[3]);
        }
        c[0] = fmaf(d[0], sc.x, c[0]);
        c[1] = fmaf(d[1], sc.y, c[1]);
    }
}

template <Fmt F>
__host__ __device__ constexpr int64_t padded_k(int K) {
    return (K + kStepK<F> - 1) / kStepK<F> * kStepK<F>;
}

// XAll: every lane loads x's fragments (lanes g >= 2 those of g & 1: their C rows are never read), no
// predicate and no zeroing, at 4x the shared memory wavefronts.
template <Fmt F, int KS, int U, bool Trick, bool XAll>
__global__ void __launch_bounds__(kWarps * 32, 2) persist_kernel(const QuantParams p, int ntiles) {
    extern __shared__ uint2 xs[];
    __shared__ float red[32];
    __shared__ float part[2][kWarps][8];
    constexpr int kSlots = kWarps / KS;  // tiles a block walks at once
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int slot = warp / KS, ks = warp % KS;
    const int64_t rb = row_bytes<F>(p.K);
    const int nss_row = static_cast<int>(rb / 16), nss = (nss_row + 3) / 4;
    const int G = static_cast<int>(markbase::int4_groups(p.K));
    const int s_lo = ks * nss / KS, s_hi = (ks + 1) * nss / KS;
    const int stride = gridDim.x * kSlots;
    int tile = blockIdx.x * kSlots + slot;

    uint4 v[2][U];
    float2 sc[2][U];
    const uint4* a = nullptr;
    const float* srow = nullptr;  // int4: the scales of rows 2t, 2t + 1 of the tile
    auto point = [&](int tl) {
        a = reinterpret_cast<const uint4*>(p.m[0].q + (int64_t{tl} * 8 + g) * rb);
        if constexpr (F == Fmt::kInt4) srow = p.m[0].scale + (int64_t{tl} * 8 + 2 * t) * G;
    };
    auto load = [&](int k, int base) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int s = base + u;
            const bool ok = s < s_hi && (F == Fmt::kFp8 || s * 4 + t < nss_row);
            v[k][u] = ok ? ld_stream(a + s * 4 + t) : make_uint4(0, 0, 0, 0);
            if constexpr (F == Fmt::kInt4)
                sc[k][u] = s < s_hi && g < 2 ? make_float2(__ldg(srow + s), __ldg(srow + G + s))
                                             : make_float2(0.0f, 0.0f);
        }
    };
    if (tile < ntiles) {
        point(tile);
        load(0, s_lo);  // weights only: before the previous kernel's end
    }
    markbase::cuda::pdl_begin_after_loads(p.K);
    stage_x<F>(p, p.x, xs, red);
    __syncthreads();

    bool loaded = true;
    for (int par = 0; tile < ntiles; tile += stride, par ^= 1) {
        if (!loaded) {
            point(tile);
            load(0, s_lo);
        }
        loaded = false;
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        auto step = [&](int k, int base) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int s = base + u;
                if (s >= s_hi) break;
                uint32_t ax[kMmas<F>] = {}, ay[kMmas<F>] = {};
                if (XAll || g < 2) x_fragments<F>(xs, s, g & 1, t, ax, ay);
                step_of<F, Trick>(c, v[k][u], ax, ay, sc[k][u]);
            }
        };
        for (int base = s_lo; base < s_hi; base += 2 * U) {
            if (base + U < s_hi) load(1, base + U);
            step(0, base);
            if (base + U >= s_hi) break;
            if (base + 2 * U < s_hi) load(0, base + 2 * U);
            step(1, base + U);
        }
        // C rows 0 (hi) and 1 (lo) sit in lanes t and 4 + t: weight rows 2t and 2t + 1 of the tile
        const float r0 = c[0] + __shfl_down_sync(0xffffffffu, c[0], 4);
        const float r1 = c[1] + __shfl_down_sync(0xffffffffu, c[1], 4);
        auto store = [&](int row, float val) {
            float s = 16.0f;  // undoes x's 2^-4
            if constexpr (F == Fmt::kFp8) s *= __ldg(p.m[0].scale + row);
            p.y[0][row] = val * s;
        };
        if constexpr (KS == 1) {
            if (lane < 4) {
                store(tile * 8 + 2 * lane, r0);
                store(tile * 8 + 2 * lane + 1, r1);
            }
        } else {
            if (lane < 4) {
                part[par][warp][2 * lane] = r0;
                part[par][warp][2 * lane + 1] = r1;
            }
            bar_named(1 + slot, KS * 32);
            if (ks == 0 && lane < 8) {
                float s = 0.0f;
#pragma unroll
                for (int w = 0; w < KS; ++w) s += part[par][slot * KS + w][lane];
                store(tile * 8 + lane, s);
            }
        }
    }
}

// KS = 0: the fewest warps a tile that still give every warp of 2 blocks a SM a tile (at most 8).
template <Fmt F, int KS, int U, bool Trick, bool XAll>
void launch_persist_ks(const QuantParams& p, int ntiles, int sms, cudaStream_t s) {
    constexpr int kSlots = kWarps / KS;
    const int smem = static_cast<int>(padded_k<F>(p.K) * 4);
    static bool attr = false;
    if (!attr) {
        cudaFuncSetAttribute(persist_kernel<F, KS, U, Trick, XAll>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(padded_k<F>(kMaxK) * 4));
        attr = true;
    }
    int blocks = std::min((ntiles + kSlots - 1) / kSlots, 2 * sms);
    const int rounds = (ntiles + blocks * kSlots - 1) / (blocks * kSlots);
    blocks = (ntiles + rounds * kSlots - 1) / (rounds * kSlots);
    persist_kernel<F, KS, U, Trick, XAll><<<blocks, kWarps * 32, smem, s>>>(p, ntiles);
}

template <Fmt F, int KS, int U, bool Trick = false, bool XAll = false>
void launch_persist(const QuantParams& p, cudaStream_t s) {
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    const int ntiles = p.seg_end[0] / 8;
    if constexpr (KS > 0) {
        launch_persist_ks<F, KS, U, Trick, XAll>(p, ntiles, sms, s);
    } else {
        const int warps = 2 * sms * kWarps;
        if (ntiles >= warps) return launch_persist_ks<F, 1, U, Trick, XAll>(p, ntiles, sms, s);
        if (2 * ntiles >= warps) return launch_persist_ks<F, 2, U, Trick, XAll>(p, ntiles, sms, s);
        if (4 * ntiles >= warps) return launch_persist_ks<F, 4, U, Trick, XAll>(p, ntiles, sms, s);
        return launch_persist_ks<F, 8, U, Trick, XAll>(p, ntiles, sms, s);
    }
}

}  // namespace qv
