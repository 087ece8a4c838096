// FP8 weights at one token on the tensor cores: y = (W @ x) * scale per row, W e4m3 [rows, K] (model/fp8.h).
// Why the tensor cores for a GEMV: at one byte per weight the CUDA-core kernels (a float conversion, a
// multiply and an add per weight, fp32 x read per weight) were bound by instructions and L1, not memory: the
// kernel lab (bench/kernels/fp8_gemv_lab.cu) streamed FP8 at 1.2-1.9 TB/s, slower per weight than bf16 at
// 3.7-4.3 TB/s. Here the hardware converts two e4m3 bytes to an f16 pair in one instruction and mma.sync
// m16n8k16 does 16 x 8 x 16 multiply-adds in another: the weights are the B operand (8 rows a tile, each
// lane 4 bytes of one row per MMA), x the A operand's first two rows (its f16 high and low halves, so x keeps
// ~22 bits), the other 14 rows zero.
//  - A block is 8 warps on 8 * NT rows, each warp a contiguous eighth of K (its "super-steps" of 64 bytes: a
//    lane's 16-byte load of row g = lane / 4 at byte 16 (lane % 4), i.e. 4 MMAs' k for NT tiles).
//  - x is staged once per block in shared memory as the MMA's A pairs, scaled by 2^-4 (f16's range then
//    holds |x| up to 10^6 and resolves 2^-20 absolute), the input norm's weight folded in; the norm's sum of
//    squares is a block reduction there.
//  - The weights' first U super-steps are loaded before the PDL wait (they never depend on the previous
//    kernel), then x is staged, then the MMAs; the 8 warps' sums meet in shared memory in a fixed order.
//  - Experts (the MoE's decode): grid.y is the slot, its rows those of expert group_expert[slot].
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <string>

#include "cuda/check.h"
#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"
#include "cuda/kernels/launch.h"

namespace markbase::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kSuper = 64;  // bytes of a row per super-step: 4 lanes x 16
constexpr int kMaxK = 32768;

struct Fp8Params {
    const float* x = nullptr;
    int K = 0;
    int64_t x_slot_stride = 0;  // elements between slots' inputs (0: one x for all)
    bool norm = false;
    const bf16* norm_w = nullptr;
    float norm_scale = 1.0f, eps = 1e-6f;
    const uint8_t* w[3] = {};
    const float* scale[3] = {};
    float* y[3] = {};
    int seg_end[3] = {};
    int nseg = 0, total_rows = 0;
    const uint8_t* w2 = nullptr;  // Geglu: the up projection (seg 0's rows)
    const float* scale2 = nullptr;
    const int* group_expert = nullptr;  // experts: slot -> expert (< 0: a zero row)
    int64_t expert_stride = 0, scale_stride = 0, out_stride = 0;
};

__device__ __forceinline__ uint32_t fp8x2_to_f16x2(uint32_t two) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
    return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

__device__ __forceinline__ uint32_t f16x2_bits(__half2 h) {
    return *reinterpret_cast<uint32_t*>(&h);
}

__device__ __forceinline__ void mma_f16(float (&c)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}

// x staged as A pairs: for super-step s, part (0 hi, 1 lo), lane column t, MMA j: the pair of x at bytes
// 16t + 4j + {0, 1} and {2, 3} of the super-step (uint2), laid out [s][part][t][j]. Returns the block's sum
// of x^2 (norm only; every thread gets it).
__device__ __forceinline__ float stage_x(const Fp8Params& p, const float* x, uint2* xs, float* red) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const uint2* nw = reinterpret_cast<const uint2*>(p.norm_w);
    float ss = 0.0f;
    for (int e = threadIdx.x; e < p.K / 4; e += kWarps * 32) {
        float4 f = __ldg(x4 + e);
        if (p.norm) {
            ss = fmaf(f.x, f.x, fmaf(f.y, f.y, fmaf(f.z, f.z, fmaf(f.w, f.w, ss))));
            if (nw) {
                const uint2 n = __ldg(nw + e);
                f.x *= bf16_lo(n.x);
                f.y *= bf16_hi(n.x);
                f.z *= bf16_lo(n.y);
                f.w *= bf16_hi(n.y);
            }
        }
        f.x *= 0.0625f;
        f.y *= 0.0625f;
        f.z *= 0.0625f;
        f.w *= 0.0625f;
        const __half2 h01 = __floats2half2_rn(f.x, f.y), h23 = __floats2half2_rn(f.z, f.w);
        const float2 b01 = __half22float2(h01), b23 = __half22float2(h23);
        const __half2 l01 = __floats2half2_rn(f.x - b01.x, f.y - b01.y);
        const __half2 l23 = __floats2half2_rn(f.z - b23.x, f.w - b23.y);
        const int k = 4 * e, s = k / kSuper, r = k % kSuper, t = r >> 4, j = (r >> 2) & 3;
        xs[((s * 2 + 0) * 4 + t) * 4 + j] = make_uint2(f16x2_bits(h01), f16x2_bits(h23));
        xs[((s * 2 + 1) * 4 + t) * 4 + j] = make_uint2(f16x2_bits(l01), f16x2_bits(l23));
    }
    if (!p.norm) return 0.0f;
    return block_sum(ss, red);
}

template <int NT, bool Geglu>
struct Tiles {
    const uint4* w[NT];
    const uint4* w2[NT];
    const float* scale[NT];
    const float* scale2[NT];
    float* y[NT];
    bool ok[NT];  // rows in range and an expert held
    bool in[NT];  // rows in range
};

// a[s] by selects: indexing the kernel's parameters at run time would copy them to local memory
template <class T>
__device__ __forceinline__ T pick(const T (&a)[3], int s) {
    return s == 0 ? a[0] : s == 1 ? a[1] : a[2];
}

// Tile i's rows [row0 + 8i, +8): their segment, this lane's row pointer (row g), the scales and outputs.
template <int NT, bool Geglu>
__device__ __forceinline__ Tiles<NT, Geglu> tiles_of(const Fp8Params& p, int row0, int g, int slot) {
    Tiles<NT, Geglu> tl;
    int64_t woff = 0, soff = 0;
    bool expert_ok = true;
    if (p.group_expert) {
        const int e = p.group_expert[slot];
        expert_ok = e >= 0;
        woff = static_cast<int64_t>(expert_ok ? e : 0) * p.expert_stride;
        soff = static_cast<int64_t>(expert_ok ? e : 0) * p.scale_stride;
    }
#pragma unroll
    for (int i = 0; i < NT; ++i) {
        const int r = row0 + 8 * i;
        int s = 0;  // (no loop: the tiles must stay in registers)
        if (p.nseg > 1 && r >= p.seg_end[0]) s = 1;
        if (p.nseg > 2 && r >= p.seg_end[1]) s = 2;
        const int local = r - (s == 0 ? 0 : s == 1 ? p.seg_end[0] : p.seg_end[1]);
        tl.in[i] = r < p.total_rows;
        tl.ok[i] = tl.in[i] && expert_ok;
        const int64_t at = woff + static_cast<int64_t>(tl.ok[i] ? local + g : 0) * p.K;
        tl.w[i] = reinterpret_cast<const uint4*>(pick(p.w, s) + at);
        tl.scale[i] = pick(p.scale, s) + soff + local;
        tl.y[i] = pick(p.y, s) + static_cast<int64_t>(slot) * p.out_stride + local;
        if constexpr (Geglu) {
            tl.w2[i] = reinterpret_cast<const uint4*>(p.w2 + at);
            tl.scale2[i] = p.scale2 + soff + local;
        }
    }
    return tl;
}

template <int NT, int U, bool Geglu>
__global__ void __launch_bounds__(kWarps * 32, 3) fp8_mma_kernel(const Fp8Params p) {
    extern __shared__ uint2 xs[];
    __shared__ float red[32];
    __shared__ float part[kWarps][NT * 8][Geglu ? 2 : 1];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int slot = blockIdx.y;
    if (p.group_expert) pdl_begin();  // the experts were chosen by the previous kernel
    const Tiles<NT, Geglu> tl = tiles_of<NT, Geglu>(p, blockIdx.x * 8 * NT, g, slot);
    const int nss = p.K / kSuper;
    const int s_lo = warp * nss / kWarps, s_hi = (warp + 1) * nss / kWarps;

    uint4 v[U][NT], v2[U][NT];
    auto load = [&](int base) {
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int i = 0; i < NT; ++i) {
                const int s = base + u;
                const bool ok = tl.ok[i] && s < s_hi;
                v[u][i] = ok ? ld_stream(tl.w[i] + s * 4 + t) : make_uint4(0, 0, 0, 0);
                if constexpr (Geglu) v2[u][i] = ok ? ld_stream(tl.w2[i] + s * 4 + t) : make_uint4(0, 0, 0, 0);
            }
    };
    load(s_lo);  // weights only: safe before the previous kernel has finished
    if (!p.group_expert) pdl_begin_after_loads(p.K);  // from here on x may be touched

    const float ss = stage_x(p, p.x + static_cast<int64_t>(slot) * p.x_slot_stride, xs, red);
    __syncthreads();

    float c[NT][4] = {}, c2[NT][4] = {};
    for (int base = s_lo; base < s_hi; base += U) {
        if (base != s_lo) load(base);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int s = base + u;
            if (s >= s_hi) break;
            uint4 a0 = make_uint4(0, 0, 0, 0), a1 = make_uint4(0, 0, 0, 0);  // pairs for j = 0, 1 / 2, 3
            if (g < 2) {
                const uint4* src = reinterpret_cast<const uint4*>(xs + ((s * 2 + g) * 4 + t) * 4);
                a0 = src[0];
                a1 = src[1];
            }
            const uint32_t ax[4] = {a0.x, a0.z, a1.x, a1.z}, ay[4] = {a0.y, a0.w, a1.y, a1.w};
#pragma unroll
            for (int i = 0; i < NT; ++i) {
                const uint32_t wv[4] = {v[u][i].x, v[u][i].y, v[u][i].z, v[u][i].w};
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    mma_f16(c[i], ax[j], ay[j], fp8x2_to_f16x2(wv[j] & 0xffffu), fp8x2_to_f16x2(wv[j] >> 16));
                if constexpr (Geglu) {
                    const uint32_t wu[4] = {v2[u][i].x, v2[u][i].y, v2[u][i].z, v2[u][i].w};
#pragma unroll
                    for (int j = 0; j < 4; ++j)
                        mma_f16(c2[i], ax[j], ay[j], fp8x2_to_f16x2(wu[j] & 0xffffu),
                                fp8x2_to_f16x2(wu[j] >> 16));
                }
            }
        }
    }
    // C rows 0 (hi) and 1 (lo) sit in lanes t and 4 + t: columns (weight rows) 2t and 2t + 1 of each tile
#pragma unroll
    for (int i = 0; i < NT; ++i) {
        const float r0 = c[i][0] + __shfl_down_sync(0xffffffffu, c[i][0], 4);
        const float r1 = c[i][1] + __shfl_down_sync(0xffffffffu, c[i][1], 4);
        float u0 = 0.0f, u1 = 0.0f;
        if constexpr (Geglu) {
            u0 = c2[i][0] + __shfl_down_sync(0xffffffffu, c2[i][0], 4);
            u1 = c2[i][1] + __shfl_down_sync(0xffffffffu, c2[i][1], 4);
        }
        if (lane < 4) {
            part[warp][8 * i + 2 * lane][0] = r0;
            part[warp][8 * i + 2 * lane + 1][0] = r1;
            if constexpr (Geglu) {
                part[warp][8 * i + 2 * lane][Geglu ? 1 : 0] = u0;
                part[warp][8 * i + 2 * lane + 1][Geglu ? 1 : 0] = u1;
            }
        }
    }
    __syncthreads();
    if (threadIdx.x >= NT * 8) return;
    float a = 0.0f, b = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
        a += part[w][threadIdx.x][0];
        if constexpr (Geglu) b += part[w][threadIdx.x][Geglu ? 1 : 0];
    }
    // 16 undoes x's 2^-4; the norm's scale as the bf16 kernels apply it
    const float inv = p.norm ? 16.0f / sqrtf(ss / static_cast<float>(p.K) + p.eps) * p.norm_scale : 16.0f;
    const int r = threadIdx.x % 8;
#pragma unroll
    for (int i = 0; i < NT; ++i) {  // (unrolled: a dynamic index would put the tiles in local memory)
        if (i != static_cast<int>(threadIdx.x) / 8 || !tl.in[i]) continue;
        if (!tl.ok[i]) {  // a slot of another rank's expert
            tl.y[i][r] = 0.0f;
        } else if constexpr (Geglu) {
            tl.y[i][r] = gelu_tanh(a * inv * __ldg(tl.scale[i] + r)) * (b * inv * __ldg(tl.scale2[i] + r));
        } else {
            tl.y[i][r] = a * inv * __ldg(tl.scale[i] + r);
        }
    }
}

template <int NT, int U, bool Geglu>
void launch_nt(const Fp8Params& p, int slots, cudaStream_t s) {
    const int tiles = (p.total_rows + 8 * NT - 1) / (8 * NT);
    launch_kernel(fp8_mma_kernel<NT, U, Geglu>, dim3(tiles, slots), dim3(kWarps * 32),
                  static_cast<size_t>(p.K) * 4, s, p);
    CUDA_CHECK_LAUNCH();
}

// NT: 8-row tiles per block, as many as keep >= 2 blocks per SM; U: super-steps in flight per lane, 8 16-byte
// loads per lane in all (the bf16 warp-per-row kernels' 8 chunks).
template <bool Geglu>
void launch_fp8(Fp8Params& p, int slots, cudaStream_t s) {
    if (p.K <= 0 || p.K % kSuper || p.K > kMaxK)
        throw Error("internal: the FP8 GEMV takes input widths that are multiples of 64 up to " +
                    std::to_string(kMaxK) + ", not " + std::to_string(p.K));
    p.total_rows = 0;
    for (int i = 0; i < p.nseg; ++i) {
        const int rows = p.seg_end[i];
        if (rows % 8)
            throw Error("internal: FP8 GEMV segments take multiples of 8 rows, not " + std::to_string(rows));
        p.seg_end[i] = (p.total_rows += rows);
    }
    if (p.total_rows == 0) return;
    const int64_t want = 2 * int64_t{device_sms()};
    auto blocks = [&](int nt) { return int64_t{(p.total_rows + 8 * nt - 1) / (8 * nt)} * slots; };
    if constexpr (Geglu) {
        if (blocks(2) >= want) return launch_nt<2, 2, true>(p, slots, s);
        return launch_nt<1, 4, true>(p, slots, s);
    } else {
        if (blocks(4) >= want) return launch_nt<4, 2, false>(p, slots, s);
        if (blocks(2) >= want) return launch_nt<2, 4, false>(p, slots, s);
        return launch_nt<1, 8, false>(p, slots, s);
    }
}

Fp8Params params_of(const GemvInput& in) {
    Fp8Params p;
    p.x = in.x;
    p.K = in.K;
    p.norm = in.norm;
    p.norm_w = in.norm_w;
    p.norm_scale = in.norm_scale;
    p.eps = in.eps;
    return p;
}

template <int NT, int U, bool Geglu>
void allow_smem() {
    CUDA_CHECK(cudaFuncSetAttribute(fp8_mma_kernel<NT, U, Geglu>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    kMaxK * 4));
}

}  // namespace

void gemv_fp8_prepare() {
    allow_smem<4, 2, false>();
    allow_smem<2, 4, false>();
    allow_smem<1, 8, false>();
    allow_smem<2, 2, true>();
    allow_smem<1, 4, true>();
}

void gemv_fp8(const GemvInput& in, const GemvSeg* segs, int nseg, cudaStream_t s) {
    Fp8Params p = params_of(in);
    p.nseg = nseg;
    for (int i = 0; i < nseg; ++i) {
        if (!segs[i].w8 || !segs[i].scale) throw Error("internal: an FP8 launch mixes FP8 and bf16 segments");
        p.w[i] = segs[i].w8;
        p.scale[i] = segs[i].scale;
        p.y[i] = segs[i].y;
        p.seg_end[i] = segs[i].rows;
    }
    launch_fp8<false>(p, 1, s);
}

void gemv_fp8_geglu(const GemvInput& in, const QuantMatrix& wg, const QuantMatrix& wu, int rows, float* y,
                    cudaStream_t s) {
    Fp8Params p = params_of(in);
    p.nseg = 1;
    p.w[0] = wg.q;
    p.scale[0] = wg.scale;
    p.y[0] = y;
    p.seg_end[0] = rows;
    p.w2 = wu.q;
    p.scale2 = wu.scale;
    launch_fp8<true>(p, 1, s);
}

void moe_gate_up_decode_fp8(const float* x, int H, const QuantMatrix& gate_up, int Ie, int K,
                            const int* group_expert, float* h, cudaStream_t s) {
    Fp8Params p;
    p.x = x;
    p.K = H;
    p.nseg = 1;
    p.w[0] = gate_up.q;
    p.scale[0] = gate_up.scale;
    p.y[0] = h;
    p.seg_end[0] = Ie;
    p.w2 = gate_up.q + static_cast<int64_t>(Ie) * H;
    p.scale2 = gate_up.scale + Ie;
    p.group_expert = group_expert;
    p.expert_stride = 2 * static_cast<int64_t>(Ie) * H;
    p.scale_stride = 2 * static_cast<int64_t>(Ie);
    p.out_stride = Ie;
    launch_fp8<true>(p, K, s);
}

void moe_down_decode_fp8(const float* h, int Ie, const QuantMatrix& down, int H, int K, const int* group_expert,
                         float* slots, cudaStream_t s) {
    Fp8Params p;
    p.x = h;
    p.K = Ie;
    p.x_slot_stride = Ie;
    p.nseg = 1;
    p.w[0] = down.q;
    p.scale[0] = down.scale;
    p.y[0] = slots;
    p.seg_end[0] = H;
    p.group_expert = group_expert;
    p.expert_stride = static_cast<int64_t>(H) * Ie;
    p.scale_stride = H;
    p.out_stride = H;
    launch_fp8<false>(p, K, s);
}

}  // namespace markbase::cuda
