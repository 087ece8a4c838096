// The end of a PLE layer at one token (E2B, E4B; GEMMA4.md 2.4) as one launch of one thread-block cluster:
//   x1 = (x + post_feedforward_layernorm(y)) * ffn_scale        y: the down projection's output
//   g  = gelu_tanh(per_layer_input_gate(x1)) * PLE_i            H -> P
//   x2 = (x1 + post_per_layer_input_norm(per_layer_projection(g))) * layer_scalar     P -> H
//   xn = RMSNorm(x2) * next_w                                   the next GEMV's normalised input (optional)
// In the launch-per-phase form these are four dependent launches (an update, two GEMVs of 0.8-1.3 MB and a
// second update), ~7 us per E2B layer in session 15's graph timeline for 1.6 MB of weights. Here the 16
// blocks of one cluster each copy their contiguous slice of both weight matrices into shared memory before
// the PDL wait (P / 16 gate rows, H / 16 projection rows: 64 H bytes per block), so after the wait only the
// chain is left: every block redoes the FFN update over all of H (two L2 reads of H floats), computes its
// 16 gate values, and hands them to every block through distributed shared memory; each block projects its
// H / 16 rows, and the two norms over H are sums of the 16 blocks' partials, gathered the same way (each
// block adds them in rank order, so every block holds the same factor). Cluster barriers replace the
// launches between the phases.
#include <string>

#include "cuda/check.h"
#include "cuda/cluster.cuh"
#include "cuda/device_common.cuh"
#include "cuda/kernels.h"
#include "cuda/launch.h"

namespace markbase::cuda {

namespace {

constexpr int kPleThreads = 512;  // 16 warps: one gate row each
constexpr int kPleWarps = kPleThreads / 32;
constexpr int kPlePer = 6;  // x values per thread in the FFN update: H <= 3072
constexpr int kPleMaxHidden = kPleThreads * kPlePer;

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(smem)), "l"(gmem) : "memory");
#else
    *static_cast<uint4*>(smem) = *static_cast<const uint4*>(gmem);
#endif
}
__device__ __forceinline__ void cp_async_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\ncp.async.wait_all;" ::: "memory");
#endif
}

// The bulk form (MARKBASE_CUDA_PLE_FUSED=3/4): one thread hands both slices to the tensor memory accelerator
// as two bulk copies that complete on an mbarrier, instead of 16-byte cp.async from every thread.
__device__ __forceinline__ void bulk_copy_start(unsigned long long* bar, void* dst0, const void* src0,
                                                unsigned n0, void* dst1, const void* src1, unsigned n1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const unsigned b = smem_u32(bar);
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(b) : "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(n0 + n1) : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            smem_u32(dst0)),
        "l"(src0), "r"(n0), "r"(b)
        : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            smem_u32(dst1)),
        "l"(src1), "r"(n1), "r"(b)
        : "memory");
#else
    (void)bar, (void)dst0, (void)src0, (void)n0, (void)dst1, (void)src1, (void)n1;
    __trap();
#endif
}
__device__ __forceinline__ void bulk_copy_wait(unsigned long long* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile(
        "{\n .reg .pred p;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0;\n @!p bra "
        "WAIT_%=;\n}" ::"r"(smem_u32(bar))
        : "memory");
#else
    (void)bar;
#endif
}

// Dynamic shared memory of one block, in this order: the gate slice [P/16][H/8] and the projection slice
// [H/16][P/8] as 16-byte chunks, x1 [H], g [P], the projection outputs z [H/16], and two rounds of the
// 16 blocks' partial sums of squares.
size_t ple_tail_smem(int H, int P) {
    return static_cast<size_t>(H) * P / kPleCluster * 2 * sizeof(bf16) +
           (static_cast<size_t>(H) + P + H / kPleCluster + 2 * kPleCluster) * sizeof(float);
}

// NC > 0 (MARKBASE_CUDA_PLE_FUSED=5, H == 256 NC): the weight slices in registers instead of shared memory,
// NC 16-byte chunks of the warp's gate row and one chunk of each of its NC projection rows per lane, so the
// block needs no large shared-memory carveout.
template <int NC>
__global__ void __launch_bounds__(kPleThreads) ple_tail_kernel(const PleTail a) {
    extern __shared__ uint4 sm4[];
    const int H = a.H, P = kPleDim, rank = blockIdx.x;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int rows_g = P / kPleCluster, rows_p = H / kPleCluster;  // this block's gate and projection rows
    const int hc = H / 8, pc = P / 8;                              // 16-byte chunks per row
    const bool small = NC > 0 || (a.ablate & 8);                   // no weight slices in shared memory
    uint4* wg = sm4;                                               // [rows_g][hc]
    uint4* wp = wg + rows_g * hc;                                  // [rows_p][pc]
    float* x1 = reinterpret_cast<float*>(small ? sm4 : wp + rows_p * pc);  // [H]
    float* gs = x1 + H;                                                    // [P]
    float* zs = gs + P;                                                    // [rows_p]
    float* part = zs + rows_p;                                             // [2][kPleCluster]
    __shared__ float red[32];
    __shared__ unsigned long long bulk_bar;

    cluster_arrive_relaxed();  // phase 1: this block has started
    // weights (written by no kernel of the step) and the norm weights, before the PDL wait
    uint4 rg[NC > 0 ? NC : 1], rp[NC > 0 ? NC : 1];
    if constexpr (NC > 0) {
        const uint4* g4 =
            reinterpret_cast<const uint4*>(a.gate) + static_cast<int64_t>(rank * rows_g + warp) * hc;
        const uint4* p4 = reinterpret_cast<const uint4*>(a.proj) + static_cast<int64_t>(rank) * rows_p * pc;
#pragma unroll
        for (int i = 0; i < NC; ++i) {
            rg[i] = ld_stream(g4 + lane + 32 * i);
            rp[i] = ld_stream(p4 + (warp + kPleWarps * i) * pc + lane);
        }
        if (a.ablate & 2)
            for (int i = tid; i < P + 2 * kPleCluster; i += kPleThreads) (i < P ? gs[i] : part[i - P]) = 0.0f;
    } else {
        const uint4* g4 = reinterpret_cast<const uint4*>(a.gate) + static_cast<int64_t>(rank) * rows_g * hc;
        const uint4* p4 = reinterpret_cast<const uint4*>(a.proj) + static_cast<int64_t>(rank) * rows_p * pc;
        if (a.bulk && !(a.ablate & 1)) {
            if (tid == 0) bulk_copy_start(&bulk_bar, wg, g4, rows_g * hc * 16, wp, p4, rows_p * pc * 16);
        } else if (!(a.ablate & 1)) {
            for (int i = tid; i < rows_g * hc; i += kPleThreads) cp_async16(wg + i, g4 + i);
            for (int i = tid; i < rows_p * pc; i += kPleThreads) cp_async16(wp + i, p4 + i);
        } else if (!small) {  // (zeros, so that the ablated step's logits stay finite)
            for (int i = tid; i < rows_g * hc + rows_p * pc; i += kPleThreads) wg[i] = make_uint4(0, 0, 0, 0);
        }
        if (a.ablate & 2)
            for (int i = tid; i < P + 2 * kPleCluster; i += kPleThreads) (i < P ? gs[i] : part[i - P]) = 0.0f;
    }
    float fw[kPlePer];
#pragma unroll
    for (int j = 0; j < kPlePer; ++j) {
        const int k = tid + j * kPleThreads;
        fw[j] = k < H ? bf16_at(a.ffn_w, k) : 0.0f;
    }
    const int row = rank * rows_p + tid;  // this thread's output row of x2 (tid < rows_p)
    const float post_w = tid < rows_p ? bf16_at(a.post_w, row) : 0.0f;
    const float next_w = tid < rows_p && a.next_w ? bf16_at(a.next_w, row) : 0.0f;
    pdl_begin_after_loads(a.H, false);  // (H > 0) the copies above stay above the wait

    // x1 = (x + RMSNorm(y) * ffn_w) * ffn_scale over all of H, in every block
    float yv[kPlePer], xv[kPlePer];
#pragma unroll
    for (int j = 0; j < kPlePer; ++j) {
        const int k = tid + j * kPleThreads;
        yv[j] = k < H && !(a.ablate & 4) ? a.y[k] : 0.0f;
        xv[j] = k < H && !(a.ablate & 4) ? a.x[k] : 0.0f;
    }
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kPlePer; ++j) ss = fmaf(yv[j], yv[j], ss);
    const float inv_y = 1.0f / sqrtf(block_sum(ss, red) / static_cast<float>(H) + a.eps);
#pragma unroll
    for (int j = 0; j < kPlePer; ++j) {
        const int k = tid + j * kPleThreads;
        if (k < H) x1[k] = (xv[j] + yv[j] * inv_y * fw[j]) * a.ffn_scale;
    }
    if (a.bulk && !(a.ablate & 1))
        bulk_copy_wait(&bulk_bar);  // (the barrier's init is visible: block_sum's barriers came after it)
    else
        cp_async_wait_all();
    __syncthreads();

    // g: warp w's gate row rank * rows_g + w (rows_g == kPleWarps), then to every block's gs
    {
        const float4* x14 = reinterpret_cast<const float4*>(x1);
        const uint4* wr = wg + warp * hc;
        float s = 0.0f;
        if constexpr (NC > 0) {
#pragma unroll
            for (int i = 0; i < NC; ++i)
                s += dot8(rg[i], x14[2 * (lane + 32 * i)], x14[2 * (lane + 32 * i) + 1]);
        } else {
            for (int c = lane; c < hc && !small; c += 32) s += dot8(wr[c], x14[2 * c], x14[2 * c + 1]);
        }
        s = warp_sum(s);
        const int r = rank * rows_g + warp;
        const float g = gelu_tanh(s) * a.ple[r];
        if (a.ablate & 2) {
            if (lane == 0) gs[r % kPleDim] = g;
            __syncthreads();
        } else {
            cluster_wait_acquire();  // phase 1: every block has started
            if (lane < kPleCluster) cluster_map(gs, lane)[r] = g;
            cluster_arrive_release();  // phase 2: the gate values
            cluster_wait_acquire();
        }
    }

    // z: the projection's rows_p rows of this block, warp w taking rows w, w + 16, ...; lane l holds g's
    // elements 8 l .. 8 l + 7 (P == 256: one chunk per lane and row)
    {
        const float4 ga = reinterpret_cast<const float4*>(gs)[2 * lane];
        const float4 gb = reinterpret_cast<const float4*>(gs)[2 * lane + 1];
        float zsq = 0.0f;
        auto project = [&](int r, float z) {
            if (lane == 0) zs[r] = z;
            zsq = fmaf(z, z, zsq);
        };
        if constexpr (NC > 0) {
#pragma unroll
            for (int i = 0; i < NC; ++i) project(warp + kPleWarps * i, warp_sum(dot8(rp[i], ga, gb)));
        } else {
            for (int r = warp; r < rows_p; r += kPleWarps)
                project(r, small ? 0.0f : warp_sum(dot8(wp[r * pc + lane], ga, gb)));
        }
        // one value per warp (every lane holds the warp's sum): the block's sum over its rows
        if (lane == 0) red[warp] = zsq;
        __syncthreads();
        if (warp == 0) {
            float t = lane < kPleWarps ? red[lane] : 0.0f;
            t = warp_sum(t);
            if (lane < kPleCluster) (a.ablate & 2 ? part + lane : cluster_map(part, lane) + rank)[0] = t;
        }
        if (a.ablate & 2) {
            __syncthreads();
        } else {
            cluster_arrive_release();  // phase 3: the projection's partial sums of squares
            cluster_wait_acquire();
        }
    }
    float tz = 0.0f;
    for (int c = 0; c < kPleCluster; ++c) tz += part[c];
    const float inv_z = 1.0f / sqrtf(tz / static_cast<float>(H) + a.eps);
    float x2 = 0.0f;
    if (tid < rows_p) {
        x2 = (x1[row] + zs[tid] * inv_z * post_w) * a.scale;
        a.x[row] = x2;  // in place: every block read all of x before phase 2
    }
    if (a.l2_next_gate) {  // PLE_FUSED=2: this block's slices of the next layer's weights, into L2
        const char* g1 = reinterpret_cast<const char*>(a.l2_next_gate) + int64_t{rank} * rows_g * hc * 16;
        const char* p1 = reinterpret_cast<const char*>(a.l2_next_proj) + int64_t{rank} * rows_p * pc * 16;
        for (int i = tid; i < rows_g * hc / 8; i += kPleThreads) prefetch_l2_evict_last(g1 + 128 * i);
        for (int i = tid; i < rows_p * pc / 8; i += kPleThreads) prefetch_l2_evict_last(p1 + 128 * i);
    }
    if (!a.next_w) return;  // (no remote stores are left)
    const float t = block_sum(x2 * x2, red);
    if (a.ablate & 2) {
        if (tid < kPleCluster) part[kPleCluster + tid] = t;
        __syncthreads();
    } else {
        if (tid < kPleCluster) cluster_map(part + kPleCluster, tid)[rank] = t;
        cluster_arrive_release();  // phase 4: x2's partial sums of squares
        cluster_wait_acquire();
    }
    float tx = 0.0f;
    for (int c = 0; c < kPleCluster; ++c) tx += part[kPleCluster + c];
    const float inv_x = 1.0f / sqrtf(tx / static_cast<float>(H) + a.eps);
    if (tid < rows_p) a.xn[row] = x2 * inv_x * next_w;
}

}  // namespace

bool ple_tail_fits(int H, int P) {
    static_assert(kPleMaxHidden == 3072 && kPleDim / kPleCluster == kPleWarps && kPleDim == 32 * 8,
                  "ple_tail_widths' limits, one gate row per warp, one chunk of g per lane");
    if (!ple_tail_widths(H, P)) return false;
    int dev = 0, major = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    if (major < 9) return false;
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    // the attribute is the kernel's, not the model's: sized for the widest H, so that models of different
    // widths can live in one process
    const size_t smem = ple_tail_smem(H, P), widest = ple_tail_smem(kPleMaxHidden, kPleDim);
    if (widest > static_cast<size_t>(optin)) return false;
    for (auto k : {ple_tail_kernel<6>, ple_tail_kernel<10>})
        CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    CUDA_CHECK(cudaFuncSetAttribute(ple_tail_kernel<0>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    CUDA_CHECK(cudaFuncSetAttribute(ple_tail_kernel<0>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(widest)));
    cudaLaunchAttribute attr[2];
    const cudaLaunchConfig_t cfg =
        launch_config(dim3(kPleCluster), dim3(kPleThreads), smem, nullptr, kPleCluster, false, attr);
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, ple_tail_kernel<0>, &cfg) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return clusters > 0;
}

void ple_tail(const PleTail& a, cudaStream_t s) {
    if (!ple_tail_widths(a.H, kPleDim))
        throw Error("internal: the fused PLE tail takes a hidden size that is a multiple of 256, up to " +
                    std::to_string(kPleMaxHidden) + "; got " + std::to_string(a.H));
    // ablations 8 (no weight slices in shared memory) and 16 (a plain grid, no cluster; with 2 only)
    const size_t smem = (a.ablate & 8) ? ple_tail_smem(a.H, kPleDim) - static_cast<size_t>(a.H) * kPleDim / 4
                                       : ple_tail_smem(a.H, kPleDim);
    const int cluster = (a.ablate & 16) ? 0 : kPleCluster;
    if (a.regs && (a.H == 256 * 6 || a.H == 256 * 10)) {  // E2B's and E4B's widths
        const size_t small = ple_tail_smem(a.H, kPleDim) - static_cast<size_t>(a.H) * kPleDim / 4;
        launch_kernel_cluster(a.H == 1536 ? ple_tail_kernel<6> : ple_tail_kernel<10>, dim3(kPleCluster),
                              dim3(kPleThreads), small, s, cluster, a);
    } else {
        launch_kernel_cluster(ple_tail_kernel<0>, dim3(kPleCluster), dim3(kPleThreads), smem, s, cluster, a);
    }
    CUDA_CHECK_LAUNCH();
}

}  // namespace markbase::cuda
