// Kernel launches through cudaLaunchKernelEx so that each kernel may be scheduled while its predecessor in
// the stream is still finishing (programmatic dependent launch, Hopper). Every kernel starts with pdl_wait()
// (device_common.cuh), which returns only once the previous kernel has completed and its writes are
// visible, so correctness never depends on the attribute; what overlaps is launch latency and, in the GEMVs,
// the first batch of the next weights (H200: E2B -0.17 ms and 26B-A4B -0.18 ms per token with the
// warp-per-row GEMVs, docs/performance.md).
#pragma once

#include <cuda_runtime.h>

#include "cuda/check.h"

namespace markbase::cuda {

// The configuration launch_kernel_cluster launches with (also for occupancy queries): cluster_x > 0 cuts the
// grid's x dimension into thread-block clusters of cluster_x blocks (sizes above 8 need the kernel's
// cudaFuncAttributeNonPortableClusterSizeAllowed), pdl adds programmatic dependent launch. attr holds the
// attributes cfg points to.
inline cudaLaunchConfig_t launch_config(dim3 grid, dim3 block, size_t smem, cudaStream_t s, int cluster_x,
                                        bool pdl, cudaLaunchAttribute (&attr)[2]) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    unsigned n = 0;
    if (cluster_x > 0) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = static_cast<unsigned>(cluster_x);
        attr[n].val.clusterDim.y = 1;
        attr[n].val.clusterDim.z = 1;
        ++n;
    }
    if (pdl) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n].val.programmaticStreamSerializationAllowed = 1;
        ++n;
    }
    cfg.attrs = n ? attr : nullptr;
    cfg.numAttrs = n;
    return cfg;
}

template <class... KArgs, class... Args>
void launch_kernel_cluster(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                           int cluster_x, Args... args) {
    cudaLaunchAttribute attr[2];
    const cudaLaunchConfig_t cfg = launch_config(grid, block, smem, s, cluster_x, true, attr);
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...));
}

template <class... KArgs, class... Args>
void launch_kernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                   Args... args) {
    launch_kernel_cluster(kernel, grid, block, smem, s, 0, args...);
}

// The current device's SM count (per thread: tensor-parallel ranks drive their devices from threads).
inline int device_sms() {
    thread_local int dev = -1, sms = 0;
    int d = 0;
    CUDA_CHECK(cudaGetDevice(&d));
    if (d != dev) {
        CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d));
        dev = d;
    }
    return sms;
}

}  // namespace markbase::cuda
