// The end of a PLE layer (E2B, E4B) at one token in one launch, by one thread-block cluster (GEMMA4.md 2.4):
//   x1 = (x + RMSNorm(m) * post_ffn_norm) * ffn_scale          the FFN's residual update (m = down's output)
//   g  = gelu(per_layer_input_gate @ x1) * PLE_i              [P]
//   y  = per_layer_projection @ g                               [H]
//   x2 = (x1 + RMSNorm(y) * post_per_layer_input_norm) * layer_scalar
//   xn = RMSNorm(x2) * next_w                                   the next GEMV's normalised input (PRENORM)
// The dense path runs this as four launches (the update, the gate GEMV, the projection GEMV, the update),
// each a whole-grid phase of ~2-3 us on the H200 for 1.6-2.6 MB of weights. Here the C blocks of one cluster
// (C = 16 where the GPU schedules it, else 8) each own P / C gate rows and H / C projection rows; their
// weights (the whole PLE block: 1.6 MB on E2B, 2.6 MB on E4B), x and the norm weights are copied into shared
// memory before the PDL wait, so only m is read after it. Each block pushes its gate outputs, and its
// partials of the two sums of squares that the norms need, into every block's shared memory (remote stores,
// no remote loads), each exchange closed by a cluster barrier: three barriers instead of three launch
// boundaries.
#include <cooperative_groups.h>

#include <cmath>
#include <string>

#include "cuda/check.h"
#include "cuda/device_common.cuh"
#include "cuda/kernels.h"
#include "cuda/launch.h"

namespace markbase::cuda {

namespace {

namespace cg = cooperative_groups;

constexpr int kPleThreads = 512;

// Shared memory of one block, in 16-byte units: gate rows [P/C][H] and projection rows [H/C][P] (bf16), the
// FFN norm weight [H] (as fp32), x then x1 [H], g [P] (every block's gate outputs, pushed by their owners),
// PLE_i of this block's gate rows [P/C], and its projection outputs and both norm weights of its rows [H/C]
// each.
struct PleLayout {
    int rg, rp;                                     // gate and projection rows of a block
    int wg, wp, wf, x1, gall, pl, ys, pw, nw, end;  // offsets in uint4
};
__host__ __device__ inline PleLayout ple_layout(int H, int P, int C) {
    PleLayout l;
    l.rg = P / C;
    l.rp = H / C;
    const int g4 = (l.rg + 3) / 4, p4 = (l.rp + 3) / 4;
    l.wg = 0;
    l.wp = l.wg + l.rg * H / 8;
    l.wf = l.wp + l.rp * P / 8;
    l.x1 = l.wf + H / 4;
    l.gall = l.x1 + H / 4;
    l.pl = l.gall + P / 4;
    l.ys = l.pl + g4;
    l.pw = l.ys + p4;
    l.nw = l.pw + p4;
    l.end = l.nw + p4;
    return l;
}

constexpr int kMaxCluster = 16;
constexpr int kMaxRowsPerThread = 2;  // H / C <= 2 * kPleThreads

__global__ void __launch_bounds__(kPleThreads, 1) ple_block_kernel(const PleBlockArgs a) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    constexpr int kW = kPleThreads / 32;
    extern __shared__ uint4 sm[];
    // Static shared memory sits at the same offset in every block, which the pushes below rely on.
    __shared__ float wred[3][kW];            // the warps' partials of the three local sums of squares
    __shared__ float cpart[2][kMaxCluster];  // every block's partial of the y and x2 sums, pushed into slot b
    __shared__ uint64_t bar;                 // the bulk copies' completion
    const cg::cluster_group cl = cg::this_cluster();
    const int C = static_cast<int>(cl.num_blocks()), b = static_cast<int>(cl.block_rank());
    const int H = a.H, P = a.P, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const PleLayout L = ple_layout(H, P, C);
    uint4* wg = sm + L.wg;
    uint4* wp = sm + L.wp;
    float* wf = reinterpret_cast<float*>(sm + L.wf);
    float4* x14 = reinterpret_cast<float4*>(sm + L.x1);
    float* x1 = reinterpret_cast<float*>(x14);
    float* gall = reinterpret_cast<float*>(sm + L.gall);
    float* pl = reinterpret_cast<float*>(sm + L.pl);
    float* ys = reinterpret_cast<float*>(sm + L.ys);
    float* pw = reinterpret_cast<float*>(sm + L.pw);
    float* nw = reinterpret_cast<float*>(sm + L.nw);
    const unsigned bar_s = static_cast<unsigned>(__cvta_generic_to_shared(&bar));
    const long long t0 = clock64();
    // lab_trace: block b's clock (cycles since its start) at checkpoint k, by thread 0
    auto trace = [&](int k) {
        if (a.lab_trace && tid == 0) a.lab_trace[b * kPleTracePoints + k] = clock64() - t0;
    };
    // Cluster barriers, split: arrive (release: this block's pushes are visible) and wait (acquire).
    auto arrive = [] { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); };
    auto wait = [] { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); };

    // Before the PDL wait: everything but m. The weights are constants; x was last written by the attention's
    // update (two launches back: this launch starts only once down, the one before, has passed its own wait),
    // PLE_i by ple_mix at the start of the step. One thread copies the weight rows and x by cp.async.bulk (32
    // KB pieces, completing on `bar`); the norm weights (bf16, not necessarily 16-byte aligned) and PLE_i go
    // through registers into shared memory, whose stores keep those loads above the wait.
    {
        const uint4* gsrc = reinterpret_cast<const uint4*>(a.gate + static_cast<int64_t>(b) * L.rg * H);
        const uint4* psrc = reinterpret_cast<const uint4*>(a.proj + static_cast<int64_t>(b) * L.rp * P);
        const uint4* xsrc = reinterpret_cast<const uint4*>(a.x);
        if (a.lab_mode == 0) {
            if (tid == 0) {
                const unsigned bytes_g = L.rg * H * 2u, bytes_p = L.rp * P * 2u, bytes_x = H * 4u;
                asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar_s) : "memory");
                asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar_s),
                             "r"(bytes_g + bytes_p + bytes_x)
                             : "memory");
                auto bulk = [&](void* dst, const void* src, unsigned bytes) {
                    for (unsigned o = 0; o < bytes; o += 32768u) {
                        const unsigned n = bytes - o < 32768u ? bytes - o : 32768u;
                        const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst)) + o;
                        asm volatile(
                            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], "
                            "%2, "
                            "[%3];" ::"r"(d),
                            "l"(static_cast<const char*>(src) + o), "r"(n), "r"(bar_s)
                            : "memory");
                    }
                };
                bulk(wg, gsrc, bytes_g);
                bulk(wp, psrc, bytes_p);
                bulk(x14, xsrc, bytes_x);
            }
        } else {  // the lab's 1 (no weights: wrong output) and 2 (per-thread cp.async)
            auto cp_async16 = [](void* smem, const void* gmem) {
                const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(smem));
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(gmem) : "memory");
            };
            if (a.lab_mode == 2) {
                for (int i = tid; i < L.rg * H / 8; i += kPleThreads) cp_async16(wg + i, gsrc + i);
                for (int i = tid; i < L.rp * P / 8; i += kPleThreads) cp_async16(wp + i, psrc + i);
            }
            for (int i = tid; i < H / 4; i += kPleThreads) cp_async16(x14 + i, xsrc + i);
            asm volatile("cp.async.commit_group;" ::: "memory");
        }
        for (int k = tid; k < H; k += kPleThreads) wf[k] = bf16_at(a.ffn_w, k);
        for (int r = tid; r < L.rg; r += kPleThreads) pl[r] = a.ple[b * L.rg + r];
        for (int r = tid; r < L.rp; r += kPleThreads) {
            pw[r] = bf16_at(a.post_w, b * L.rp + r);
            nw[r] = bf16_at(a.next_w, b * L.rp + r);
        }
    }
    // Barrier 0, whose wait comes before the first push: every block of the cluster has started (the CUDA
    // guide's condition for touching another block's shared memory).
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
    trace(0);
    pdl_begin();
    trace(1);

    // x1 = (x + RMSNorm(m) * ffn_w) * ffn_scale, the whole vector in every block (as residual_wide_kernel)
    const float4* m4 = reinterpret_cast<const float4*>(a.m);
    constexpr int kMaxM4 = 4;  // H <= 4 * 4 * kPleThreads
    float4 mv[kMaxM4];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxM4; ++j) {
        const int i = tid + j * kPleThreads;
        mv[j] = i < H / 4 ? __ldcg(m4 + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        ss = fmaf(mv[j].x, mv[j].x, ss);
        ss = fmaf(mv[j].y, mv[j].y, ss);
        ss = fmaf(mv[j].z, mv[j].z, ss);
        ss = fmaf(mv[j].w, mv[j].w, ss);
    }
    ss = warp_sum(ss);
    if (lane == 0) wred[0][warp] = ss;
    if (a.lab_mode == 0) {
        for (;;) {
            unsigned ok;
            asm volatile(
                "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n selp.u32 %0, 1, "
                "0, "
                "p;\n}\n"
                : "=r"(ok)
                : "r"(bar_s)
                : "memory");
            if (ok) break;
        }
    } else {
        asm volatile("cp.async.wait_all;" ::: "memory");
    }
    __syncthreads();
    trace(2);
    float tm = 0.0f;
    for (int w = 0; w < kW; ++w) tm += wred[0][w];
    const float inv_m = 1.0f / sqrtf(tm / static_cast<float>(H) + a.eps);
    const float4* wf4 = reinterpret_cast<const float4*>(wf);
#pragma unroll
    for (int j = 0; j < kMaxM4; ++j) {
        const int i = tid + j * kPleThreads;
        if (i < H / 4) {
            const float4 w = wf4[i];
            float4 x = x14[i];
            x.x = (x.x + mv[j].x * inv_m * w.x) * a.ffn_scale;
            x.y = (x.y + mv[j].y * inv_m * w.y) * a.ffn_scale;
            x.z = (x.z + mv[j].z * inv_m * w.z) * a.ffn_scale;
            x.w = (x.w + mv[j].w * inv_m * w.w) * a.ffn_scale;
            x14[i] = x;
        }
    }
    __syncthreads();
    trace(3);

    // This block's gate rows, a warp per row: g = gelu(row . x1) * PLE_i, pushed by lanes 0..C-1 into every
    // block's g (remote stores, made visible by barrier 1).
    wait();  // barrier 0
    for (int r = warp; r < L.rg; r += kW) {
        const uint4* wr = wg + r * (H / 8);
        float s0 = 0.0f, s1 = 0.0f;
#pragma unroll 4
        for (int c = lane; c < H / 8; c += 64) {
            s0 += dot8(wr[c], x14[2 * c], x14[2 * c + 1]);
            if (c + 32 < H / 8) s1 += dot8(wr[c + 32], x14[2 * c + 64], x14[2 * c + 65]);
        }
        const float g = gelu_tanh(warp_sum(s0 + s1)) * pl[r];
        if (lane < C) cl.map_shared_rank(gall, lane)[b * L.rg + r] = g;
    }
    trace(4);
    arrive();
    wait();  // barrier 1: g is complete in every block
    trace(5);

    // This block's projection rows, a warp per row: y[r] = row . g. The sum of their squares: the warps',
    // then the block's, pushed by warp 0 into every block's cpart[0][b] (barrier 2).
    float sq = 0.0f;
    {
        const float4* g4 = reinterpret_cast<const float4*>(gall);
#pragma unroll 2
        for (int r = warp; r < L.rp; r += kW) {
            const uint4* wr = wp + r * (P / 8);
            float s = 0.0f;
            for (int c = lane; c < P / 8; c += 32) s += dot8(wr[c], g4[2 * c], g4[2 * c + 1]);
            s = warp_sum(s);
            if (lane == 0) ys[r] = s;
            sq = fmaf(s, s, sq);
        }
    }
    if (lane == 0) wred[1][warp] = sq;
    __syncthreads();
    if (warp == 0) {
        const float v = warp_sum(lane < kW ? wred[1][lane] : 0.0f);
        if (lane < C) cl.map_shared_rank(&cpart[0][0], lane)[b] = v;
    }
    trace(6);
    arrive();
    wait();  // barrier 2
    trace(7);
    float ty = 0.0f;
    for (int c = 0; c < C; ++c) ty += cpart[0][c];  // in rank order: the same in every block
    const float inv_y = 1.0f / sqrtf(ty / static_cast<float>(H) + a.eps);

    // x2 = (x1 + RMSNorm(y) * post_w) * layer_scale on this block's rows; the sum of its squares as above
    const int k0 = b * L.rp;
    float x2[kMaxRowsPerThread];
    float s2 = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxRowsPerThread; ++j) {
        const int r = tid + j * kPleThreads;
        x2[j] = r < L.rp ? (x1[k0 + r] + ys[r] * inv_y * pw[r]) * a.layer_scale : 0.0f;
        s2 = fmaf(x2[j], x2[j], s2);
    }
    s2 = warp_sum(s2);
    if (lane == 0) wred[2][warp] = s2;
    __syncthreads();
    if (warp == 0) {
        const float v = warp_sum(lane < kW ? wred[2][lane] : 0.0f);
        if (lane < C) cl.map_shared_rank(&cpart[1][0], lane)[b] = v;
    }
    trace(8);
    arrive();
    wait();  // barrier 3: after it no block touches another's shared memory
    trace(9);
    float tx = 0.0f;
    for (int c = 0; c < C; ++c) tx += cpart[1][c];
    const float inv_x = 1.0f / sqrtf(tx / static_cast<float>(H) + a.eps);
#pragma unroll
    for (int j = 0; j < kMaxRowsPerThread; ++j) {
        const int r = tid + j * kPleThreads;
        if (r < L.rp) {
            a.x[k0 + r] = x2[j];  // in place: every block copied x before barrier 1
            a.xn[k0 + r] = x2[j] * inv_x * nw[r];
        }
    }
    trace(10);
#else
    (void)a;
    __trap();  // the host enables this kernel on compute capability 9.0 and above only
#endif
}

size_t ple_smem_bytes(int H, int P, int C) {
    return static_cast<size_t>(ple_layout(H, P, C).end) * 16;
}

}  // namespace

int ple_block_cluster(int H, int P) {
    int dev = 0, major = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    if (major < 9 || H <= 0 || P <= 0 || H % 8 || P % 8 || H > 16 * kPleThreads) return 0;  // kMaxM4
    int smem_max = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    for (const int C : {16, 8}) {
        if (H % C || P % C || H / C > kMaxRowsPerThread * kPleThreads) continue;
        const size_t smem = ple_smem_bytes(H, P, C);
        if (smem + 1024 > static_cast<size_t>(smem_max)) continue;
        CUDA_CHECK(cudaFuncSetAttribute(ple_block_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem)));
        if (C > 8)
            CUDA_CHECK(
                cudaFuncSetAttribute(ple_block_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(C);
        cfg.blockDim = dim3(kPleThreads);
        cfg.dynamicSmemBytes = smem;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = C;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        int clusters = 0;
        if (cudaOccupancyMaxActiveClusters(&clusters, ple_block_kernel, &cfg) != cudaSuccess) {
            cudaGetLastError();
            continue;
        }
        if (clusters > 0) return C;
    }
    return 0;
}

void ple_block(const PleBlockArgs& a, int C, cudaStream_t s) {
    if (C <= 0 || C > kMaxCluster || a.H % C || a.P % C || a.H % 8 || a.P % 8 || a.H > 16 * kPleThreads ||
        a.H / C > kMaxRowsPerThread * kPleThreads)
        throw Error("internal: ple_block with H " + std::to_string(a.H) + ", P " + std::to_string(a.P) +
                    " and a cluster of " + std::to_string(C));
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(C);
    cfg.blockDim = dim3(kPleThreads);
    cfg.dynamicSmemBytes = ple_smem_bytes(a.H, a.P, C);
    cfg.stream = s;
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = C;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    int n = 1;
    if (pdl_enabled()) {
        attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[1].val.programmaticStreamSerializationAllowed = 1;
        n = 2;
    }
    cfg.attrs = attr;
    cfg.numAttrs = n;
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, ple_block_kernel, a));
    CUDA_CHECK_LAUNCH();
}

}  // namespace markbase::cuda
