// Quantised weights at one token on the tensor cores: y = W @ x, W FP8 e4m3 with a scale per row
// (model/fp8.h) or int4 with a scale (and zero point) per group of 128 weights along K (model/int4.h). Why
// the tensor cores for a GEMV: at one byte per weight the CUDA-core kernels (a float conversion, a multiply
// and an add per weight, fp32 x read per weight) were bound by instructions and L1, not memory: the kernel
// lab (bench/kernels/quant_gemv_lab.cu) streamed FP8 at 1.2-1.9 TB/s, slower per weight than bf16 at 3.7-4.3
// TB/s. Here the weights become f16 pairs in one or two instructions (e4m3x2 -> f16x2 in hardware; a nibble
// pair OR 0x6400 is 1024 + n exactly, less 1024 + zero) and mma.sync m16n8k16 does 16 x 8 x 16 multiply-adds
// in another: the weights are the B operand (8 rows a tile), x the A operand's first two rows (its f16 high
// and low halves, so x keeps ~22 bits), the other 14 rows zero.
//  - A lane's 16-byte load is 16 FP8 or 32 int4 weights of row g = lane / 4; the 4 lanes of a row cover a
//    "super-step" of 64 bytes: 64 FP8 weights (4 MMAs a lane), or 128 int4 weights (8 MMAs), one group.
//    Both sides of each MMA take their k in the same (permuted) order, so the loads feed the fragments
//    as they are; x is staged in that order.
//  - int4: each super-step's MMAs start from zero and are added into the sums times the rows' group scales
//    (fp32), so the weights enter the MMA as exact small integers; a row's last group may be shorter (K a
//    multiple of 64: the 26B-A4B's 704- and 2112-wide inputs), its missing half zero on both sides.
//  - A block is 8 warps on 8 * NT rows, each warp a contiguous eighth of the super-steps.
//  - x is staged once per block in shared memory as the MMA's A pairs, scaled by 2^-4 (f16's range then
//    holds |x| up to 10^6 and resolves 2^-20 absolute), the input norm's weight folded in; the norm's sum of
//    squares is a block reduction there.
//  - The weights' first U super-steps are loaded before the PDL wait (they never depend on the previous
//    kernel), then x is staged (and int4's group scales and zero points), then the MMAs, each set of loads
//    issued before the previous set's MMAs (two register buffers); the 8 warps' sums meet in shared memory in
//    a fixed order.
//  - Experts (the MoE's decode): grid.y is the slot, its rows those of expert group_expert[slot].
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <string>

#include "cuda/check.h"
#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"
#include "cuda/kernels/launch.h"
#include "cuda/kernels/quant_operands.cuh"

namespace markbase::cuda {

namespace {

using namespace quant;  // NOLINT: the kernel's own pieces (quant_operands.cuh)

// One super-step of one tile into c: FP8 straight into the sums; int4 from zero, then times the scales of
// this lane's C columns (rows 2t, 2t + 1 of the tile), its weights less its row's (g) zero point.
template <Fmt F>
__device__ __forceinline__ void mma_chunk(float (&c)[4], uint4 v, const uint32_t (&ax)[kMmas<F>],
                                          const uint32_t (&ay)[kMmas<F>], const float* gs, const uint8_t* gz,
                                          int G, int s, int g, int t) {
    const uint32_t wv[4] = {v.x, v.y, v.z, v.w};
    if constexpr (F == Fmt::kInt4) {
        const uint32_t zz = 0x64006400u + 0x00010001u * gz[g * G + s];
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                mma_f16(d, ax[2 * i + h], ay[2 * i + h], nib2_to_f16x2(wv[i], 8 * h, zz),
                        nib2_to_f16x2(wv[i], 8 * h + 4, zz));
        c[0] = fmaf(d[0], gs[2 * t * G + s], c[0]);
        c[1] = fmaf(d[1], gs[(2 * t + 1) * G + s], c[1]);
    } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
            mma_f16(c, ax[j], ay[j], fp8x2_to_f16x2(wv[j] & 0xffffu), fp8x2_to_f16x2(wv[j] >> 16));
    }
}

// Shared memory: x staged (Kp * 4 bytes), then int4's group scales and zero points (stage_groups).
template <Fmt F>
__host__ __device__ constexpr int64_t padded_k(int K) {
    return (K + kStepK<F> - 1) / kStepK<F> * kStepK<F>;
}
template <Fmt F, int NT, bool Geglu>
__host__ __device__ constexpr int64_t smem_bytes(int K) {
    const int64_t groups = F == Fmt::kInt4 ? int64_t{8} * NT * int4_groups(K) * (Geglu ? 2 : 1) : 0;
    return padded_k<F>(K) * 4 + groups * 5;
}

// Blocks per SM the registers must allow: 2 (16 warps, each with its next loads in flight while it multiplies
// the last ones, cover the memory's latency).
constexpr int kMinBlocks = 2;

template <Fmt F, int NT, int U, bool Geglu>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks) quant_mma_kernel(const QuantParams p) {
    extern __shared__ uint2 xs[];
    __shared__ float red[32];
    __shared__ float part[kWarps][NT * 8][Geglu ? 2 : 1];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int slot = blockIdx.y, row0 = blockIdx.x * 8 * NT;
    if (p.group_expert) pdl_begin();  // the experts were chosen by the previous kernel
    const Tiles<NT, Geglu> tl = tiles_of<F, NT, Geglu>(p, row0, g, slot);
    const int nss_row = static_cast<int>(row_bytes<F>(p.K) / 16);  // 16-byte chunks of a row
    const int nss = (nss_row + 3) / 4, G = static_cast<int>(int4_groups(p.K));
    const int s_lo = warp * nss / kWarps, s_hi = (warp + 1) * nss / kWarps;
    float* gs = reinterpret_cast<float*>(xs + padded_k<F>(p.K) / 2);
    uint8_t* gz = reinterpret_cast<uint8_t*>(gs + 8 * NT * G * (Geglu ? 2 : 1));

    // two sets of U super-steps: the next one's loads are in flight while the current one's MMAs run
    uint4 v[2][U][NT], v2[2][U][NT];
    auto load = [&](int k, int base) {
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int i = 0; i < NT; ++i) {
                const int s = base + u;
                // (int4's short last group: the lanes past K load nothing)
                const bool ok = tl.ok[i] && s < s_hi && (F == Fmt::kFp8 || s * 4 + t < nss_row);
                v[k][u][i] = ok ? ld_stream(tl.a[i] + s * 4 + t) : make_uint4(0, 0, 0, 0);
                if constexpr (Geglu)
                    v2[k][u][i] = ok ? ld_stream(tl.b[i] + s * 4 + t) : make_uint4(0, 0, 0, 0);
            }
    };
    load(0, s_lo);  // weights only: safe before the previous kernel has finished
    if (!p.group_expert) pdl_begin_after_loads(p.K);  // from here on x may be touched

    const float ss = stage_x<F>(p, p.x + static_cast<int64_t>(slot) * p.x_slot_stride, xs, red);
    if constexpr (F == Fmt::kInt4) stage_groups<NT, Geglu>(p, row0, slot, gs, gz);
    __syncthreads();

    float c[NT][4] = {}, c2[NT][4] = {};
    auto step = [&](int k, int base) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int s = base + u;
            if (s >= s_hi) break;
            uint32_t ax[kMmas<F>] = {}, ay[kMmas<F>] = {};
            if (g < 2) {
                const uint2* src = xs + ((s * 2 + g) * 4 + t) * kMmas<F>;
#pragma unroll
                for (int j = 0; j < kMmas<F>; j += 2) {
                    const uint4 a = *reinterpret_cast<const uint4*>(src + j);
                    ax[j] = a.x;
                    ay[j] = a.y;
                    ax[j + 1] = a.z;
                    ay[j + 1] = a.w;
                }
            }
#pragma unroll
            for (int i = 0; i < NT; ++i) {
                const int ti = 8 * i * G;
                mma_chunk<F>(c[i], v[k][u][i], ax, ay, gs + ti, gz + ti, G, s, g, t);
                if constexpr (Geglu) {
                    const int tu = 8 * NT * G + ti;
                    mma_chunk<F>(c2[i], v2[k][u][i], ax, ay, gs + tu, gz + tu, G, s, g, t);
                }
            }
        }
    };
    // unrolled by two so that the buffers' index is a constant (registers, not local memory)
    for (int base = s_lo; base < s_hi; base += 2 * U) {
        if (base + U < s_hi) load(1, base + U);
        step(0, base);
        if (base + U >= s_hi) break;
        if (base + 2 * U < s_hi) load(0, base + 2 * U);
        step(1, base + U);
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
#pragma unroll
    for (int i = 0; i < NT; ++i) {  // (unrolled: a dynamic index would put the tiles in local memory)
        if (i != static_cast<int>(threadIdx.x) / 8 || !tl.in[i]) continue;
        // the row found again (its pointers kept through the loop would cost registers)
        const int64_t erow = expert_row(p, slot);
        const RowAt at = row_at(p, row0 + threadIdx.x, erow < 0 ? 0 : erow);
        float* y = pick(p.y, at.seg) + static_cast<int64_t>(slot) * p.out_stride + at.local;
        if (!tl.ok[i]) {  // a slot of another rank's expert
            *y = 0.0f;
            continue;
        }
        // FP8's row scales (int4's are in the sums already)
        float sa = 1.0f, sb = 1.0f;
        if constexpr (F == Fmt::kFp8) {
            sa = __ldg(pick(p.m, at.seg).scale + at.row);
            if constexpr (Geglu) sb = __ldg(p.m2.scale + at.row);
        }
        if constexpr (Geglu)
            *y = gelu_tanh(a * inv * sa) * (b * inv * sb);
        else
            *y = a * inv * sa;
    }
}

template <Fmt F, int NT, int U, bool Geglu>
void launch_nt(const QuantParams& p, int slots, cudaStream_t s) {
    const int tiles = (p.total_rows + 8 * NT - 1) / (8 * NT);
    const size_t smem = static_cast<size_t>(smem_bytes<F, NT, Geglu>(p.K));
    launch_kernel(quant_mma_kernel<F, NT, U, Geglu>, dim3(tiles, slots), dim3(kWarps * 32), smem, s, p);
    CUDA_CHECK_LAUNCH();
}

// NT: 8-row tiles per block, as many as keep >= 2 blocks per SM; U: super-steps per buffer, so that each of
// the two buffers holds kChunksInFlight 16-byte loads per lane (Geglu: twice).
template <Fmt F>
constexpr int kChunksInFlight = 4;
template <Fmt F, bool Geglu>
void launch_quant(QuantParams& p, int slots, cudaStream_t s) {
    if (p.K <= 0 || p.K % kSuper || p.K > kMaxK)
        throw Error("internal: the quantised GEMV takes input widths that are multiples of 64 up to " +
                    std::to_string(kMaxK) + ", not " + std::to_string(p.K));
    p.total_rows = 0;
    for (int i = 0; i < p.nseg; ++i) {
        const int rows = p.seg_end[i];
        if (rows % 8)
            throw Error("internal: quantised GEMV segments take multiples of 8 rows, not " +
                        std::to_string(rows));
        p.seg_end[i] = (p.total_rows += rows);
    }
    if (p.total_rows == 0) return;
    const int64_t want = 2 * int64_t{device_sms()};
    auto blocks = [&](int nt) { return int64_t{(p.total_rows + 8 * nt - 1) / (8 * nt)} * slots; };
    constexpr int Q = kChunksInFlight<F>;
    if constexpr (Geglu) {
        if (blocks(2) >= want) return launch_nt<F, 2, Q / 4, true>(p, slots, s);
        return launch_nt<F, 1, Q / 2, true>(p, slots, s);
    } else {
        if (blocks(4) >= want) return launch_nt<F, 4, Q / 4, false>(p, slots, s);
        if (blocks(2) >= want) return launch_nt<F, 2, Q / 2, false>(p, slots, s);
        return launch_nt<F, 1, Q, false>(p, slots, s);
    }
}

template <bool Geglu>
void launch_quant(Fmt f, QuantParams& p, int slots, cudaStream_t s) {
    if (f == Fmt::kInt4) return launch_quant<Fmt::kInt4, Geglu>(p, slots, s);
    if (f == Fmt::kFp8) return launch_quant<Fmt::kFp8, Geglu>(p, slots, s);
    throw Error("internal: the quantised GEMV was given bf16 weights");
}

// The matrix from row `row` on (rows of K weights): its q, scales and zero points advanced alike.
QuantMatrix quant_rows_from(WeightFormat f, const QuantMatrix& m, int64_t row, int K) {
    if (!m.q) return m;
    if (f == WeightFormat::kInt4) {
        const int64_t G = int4_groups(K);
        return {m.q + row * (K / 2), m.scale + row * G, m.zero ? m.zero + row * G : nullptr};
    }
    return {m.q + row * K, m.scale + row, nullptr};
}

QuantParams params_of(const GemvInput& in) {
    QuantParams p;
    p.x = in.x;
    p.K = in.K;
    p.norm = in.norm;
    p.norm_w = in.norm_w;
    p.norm_scale = in.norm_scale;
    p.eps = in.eps;
    return p;
}

template <Fmt F, int NT, int U, bool Geglu>
void allow_smem() {
    CUDA_CHECK(cudaFuncSetAttribute(quant_mma_kernel<F, NT, U, Geglu>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem_bytes<F, NT, Geglu>(kMaxK))));
}

template <Fmt F>
void allow_all() {
    constexpr int Q = kChunksInFlight<F>;
    allow_smem<F, 4, Q / 4, false>();
    allow_smem<F, 2, Q / 2, false>();
    allow_smem<F, 1, Q, false>();
    allow_smem<F, 2, Q / 4, true>();
    allow_smem<F, 1, Q / 2, true>();
}

}  // namespace

void gemv_quant_prepare() {
    allow_all<Fmt::kFp8>();
    allow_all<Fmt::kInt4>();
}

void gemv_quant(const GemvInput& in, const GemvSeg* segs, int nseg, cudaStream_t s) {
    QuantParams p = params_of(in);
    p.nseg = nseg;
    for (int i = 0; i < nseg; ++i) {
        if (!segs[i].q.q || !segs[i].q.scale || segs[i].format != segs[0].format)
            throw Error("internal: a quantised launch mixes formats");
        p.m[i] = segs[i].q;
        p.y[i] = segs[i].y;
        p.seg_end[i] = segs[i].rows;
    }
    launch_quant<false>(segs[0].format, p, 1, s);
}

void gemv_quant_geglu(const GemvInput& in, WeightFormat f, const QuantMatrix& wg, const QuantMatrix& wu,
                      int rows, float* y, cudaStream_t s) {
    QuantParams p = params_of(in);
    p.nseg = 1;
    p.m[0] = wg;
    p.y[0] = y;
    p.seg_end[0] = rows;
    p.m2 = wu;
    launch_quant<true>(f, p, 1, s);
}

void moe_gate_up_decode_quant(WeightFormat f, const float* x, int H, const QuantMatrix& gate_up, int Ie,
                              int K, const int* group_expert, float* h, cudaStream_t s) {
    QuantParams p;
    p.x = x;
    p.K = H;
    p.nseg = 1;
    p.m[0] = gate_up;
    p.y[0] = h;
    p.seg_end[0] = Ie;
    // the up rows follow the gate rows within each expert: the same matrix Ie rows on
    p.m2 = quant_rows_from(f, gate_up, Ie, H);
    p.group_expert = group_expert;
    p.expert_rows = 2 * static_cast<int64_t>(Ie);
    p.out_stride = Ie;
    launch_quant<true>(f, p, K, s);
}

void moe_down_decode_quant(WeightFormat f, const float* h, int Ie, const QuantMatrix& down, int H, int K,
                           const int* group_expert, float* slots, cudaStream_t s) {
    QuantParams p;
    p.x = h;
    p.K = Ie;
    p.x_slot_stride = Ie;
    p.nseg = 1;
    p.m[0] = down;
    p.y[0] = slots;
    p.seg_end[0] = H;
    p.group_expert = group_expert;
    p.expert_rows = H;
    p.out_stride = H;
    launch_quant<false>(f, p, K, s);
}

}  // namespace markbase::cuda
