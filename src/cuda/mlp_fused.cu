// A dense layer's FFN at one token as one launch (MARKBASE_CUDA_MLP_FUSED=1): y += W_down (gelu(W_gate xn) *
// (W_up xn)), with no boundary between the gate/up product and the down product.
//
// Why: the two launches it replaces are the two largest of a dense layer (E2B: 56-113 MB of its ~106 MB per
// layer), and the boundary between them is a grid-wide dependency: every down row needs every GeGLU output.
// Session 16's timeline had the gate/up launch ~2.3 us and the down launch ~1 us over their bytes per E2B
// layer; the grid barrier a persistent kernel would put there costs as much as the launch (session 7).
// Split-K removes the dependency instead of making it cheaper: block b computes the GeGLU outputs of its own
// slice of the intermediate indices, j in [b S, (b + 1) S), and then the down product over exactly that
// slice, y[r] += sum_j W_down[r][j] m[j] for every output row r, added to y with vector atomics. A block
// waits only for its own slice (one block barrier), so the down weights stream straight after the gate/up
// weights.
//
// The cost: y is summed in fp32 atomics in no fixed order (run-to-run differences at the last bits; the
// greedy ids can differ on a near-tie), every block reads every down row's 2 S-byte slice (row r's slices of
// all blocks together are the whole row, and the blocks sweep the rows in the same order, so DRAM still sees
// whole rows), and y must be zero before the launch: the update that reads y clears it
// (residual_add_norm's clear_y), and the buffer starts zeroed.
//
// Layout: one block per SM (16 warps), S = I / blocks with S a multiple of 8. Phase 1: warp w takes the
// slice's indices w, w + 16, ...; a lane streams 16-byte chunks lane + 32 u of the gate row and the up row
// (8 in flight per matrix), x through L1, as gemv_rows' GeGLU. Phase 2: a pair of lanes takes four
// consecutive output rows, each lane every other 16-byte chunk of the four rows' slices (a pair reads 32
// contiguous bytes of a row: whole sectors), the pair's sums meet by a shuffle, and the even lane adds the
// four rows with one 16-byte atomic. The first index's gate/up weights are requested before the PDL wait
// (weights never depend on the previous kernel) and the first quad's down weights before the block barrier.
#include <algorithm>
#include <string>

#include "cuda/check.h"
#include "cuda/device_common.cuh"
#include "cuda/kernels.h"
#include "cuda/launch.h"
#include "model/error.h"

namespace markbase::cuda {

namespace {

constexpr int kFusedWarps = 16;
constexpr int kFusedThreads = kFusedWarps * 32;
constexpr int kFusedU = 8;   // gate/up: 16-byte chunks per lane in flight per matrix
constexpr int kFusedDU = 4;  // down: chunks per lane in flight per row of the quad (the lane's every other)

// y[0..3] += v[0..3]: one 16-byte atomic on sm_90 (its result unused, so a reduction), four before
__device__ __forceinline__ void add4(float* y, const float (&v)[4]) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    atomicAdd(reinterpret_cast<float4*>(y), make_float4(v[0], v[1], v[2], v[3]));
#else
    for (int r = 0; r < 4; ++r) atomicAdd(y + r, v[r]);
#endif
}

struct FusedMlpParams {
    const float* x = nullptr;  // [H] the normalised input
    const bf16* wg = nullptr;  // [I][H]
    const bf16* wu = nullptr;  // [I][H]
    const bf16* wd = nullptr;  // [H][I]
    float* y = nullptr;        // [H], zero on entry; += W_down m
    int H = 0, I = 0, S = 0;
    bool pdl_late = false;
};

__global__ void __launch_bounds__(kFusedThreads, 1) mlp_fused_kernel(const FusedMlpParams p) {
    __shared__ __align__(16) float ms[kMlpFusedMaxSlice];  // this block's GeGLU outputs
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int H = p.H, nchunk = H >> 3, S = p.S;
    const int64_t j0 = static_cast<int64_t>(blockIdx.x) * S;

    // ---- phase 1: m[j] = gelu(gate_j . x) * (up_j . x) for this block's j
    uint4 g[kFusedU], u[kFusedU];
    auto load_gu = [&](int j, int base) {
        const uint4* wg = reinterpret_cast<const uint4*>(p.wg + (j0 + j) * H);
        const uint4* wu = reinterpret_cast<const uint4*>(p.wu + (j0 + j) * H);
#pragma unroll
        for (int k = 0; k < kFusedU; ++k) {
            const int c = base + k * 32 + lane;
            const bool ok = c < nchunk;
            g[k] = ok ? ld_stream(wg + c) : make_uint4(0, 0, 0, 0);
            u[k] = ok ? ld_stream(wu + c) : make_uint4(0, 0, 0, 0);
        }
    };
    pdl_begin_late(p.pdl_late);
    if (warp < S) load_gu(warp, 0);        // weights only: safe before the previous kernel has finished
    pdl_begin_after_loads(H, p.pdl_late);  // from here on x may be read
    const float4* x4 = reinterpret_cast<const float4*>(p.x);
    for (int j = warp; j < S; j += kFusedWarps) {
        float ag = 0.0f, au = 0.0f;
        for (int base = 0; base < nchunk; base += 32 * kFusedU) {
            if (j != warp || base != 0) load_gu(j, base);
#pragma unroll
            for (int k = 0; k < kFusedU; ++k) {
                const int c = base + k * 32 + lane;
                if (c < nchunk) {
                    const float4 a = __ldg(x4 + 2 * c), b = __ldg(x4 + 2 * c + 1);
                    ag += dot8(g[k], a, b);
                    au += dot8(u[k], a, b);
                }
            }
        }
        ag = warp_sum(ag);
        au = warp_sum(au);
        if (lane == 0) ms[j] = gelu_tanh(ag) * au;
    }

    // ---- phase 2: y[r] += W_down[r][j0 .. j0 + S) . m for every r, four rows per lane pair
    const int sc = S >> 3;        // 16-byte chunks of a row's slice
    const int64_t ld = p.I >> 3;  // chunks per down row
    const int par = lane & 1, nq = H >> 2;
    const uint4* wd = reinterpret_cast<const uint4*>(p.wd + j0);
    uint4 d[4][kFusedDU];
    auto load_d = [&](int q, int base) {
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
            for (int k = 0; k < kFusedDU; ++k) {
                const int c = base + 2 * k + par;
                const bool ok = q < nq && c < sc;
                d[r][k] =
                    ok ? ld_stream(wd + static_cast<int64_t>(4 * q + r) * ld + c) : make_uint4(0, 0, 0, 0);
            }
    };
    constexpr int kPairs = kFusedThreads / 2;  // quads in flight over the block
    const int q_first = warp * 16 + (lane >> 1);
    load_d(q_first, 0);  // the down weights do not wait for phase 1
    __syncthreads();     // ms is complete
    const float4* m4 = reinterpret_cast<const float4*>(ms);
    for (int q0 = warp * 16; q0 < nq; q0 += kPairs) {  // whole warps per round (the shuffle below)
        const int q = q0 + (lane >> 1);
        float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int base = 0; base < sc; base += 2 * kFusedDU) {
            if (q0 != warp * 16 || base != 0) load_d(q, base);
#pragma unroll
            for (int k = 0; k < kFusedDU; ++k) {
                const int c = base + 2 * k + par;
                if (c < sc) {
                    const float4 a = m4[2 * c], b = m4[2 * c + 1];
#pragma unroll
                    for (int r = 0; r < 4; ++r) s[r] += dot8(d[r][k], a, b);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < 4; ++r) s[r] += __shfl_xor_sync(0xffffffffu, s[r], 1);
        if (par == 0 && q < nq) add4(p.y + 4 * q, s);
    }
}

}  // namespace

int mlp_fused_blocks(int H, int I, int sms) {
    if (H <= 0 || I <= 0 || H % 8 != 0 || sms <= 0) return 0;
    for (int nb = std::min(sms, I / 8); nb >= 1; --nb)
        if (I % (8 * nb) == 0) return I / nb <= kMlpFusedMaxSlice ? nb : 0;
    return 0;
}

void mlp_fused(const float* xn, int H, const bf16* wg, const bf16* wu, const bf16* wd, int I, float* y,
               int blocks, bool pdl_late, cudaStream_t s) {
    if (blocks <= 0 || I % (8 * blocks) != 0 || I / blocks > kMlpFusedMaxSlice || H % 8 != 0)
        throw Error("internal: mlp_fused with " + std::to_string(blocks) + " blocks for H " +
                    std::to_string(H) + ", I " + std::to_string(I));
    FusedMlpParams p;
    p.x = xn;
    p.wg = wg;
    p.wu = wu;
    p.wd = wd;
    p.y = y;
    p.H = H;
    p.I = I;
    p.S = I / blocks;
    p.pdl_late = pdl_late;
    launch_kernel(mlp_fused_kernel, dim3(blocks), dim3(kFusedThreads), 0, s, p);
    CUDA_CHECK_LAUNCH();
}

}  // namespace markbase::cuda
