// Kernel launches through cudaLaunchKernelEx so that, when enabled, each kernel may be scheduled while its
// predecessor in the stream is still finishing (programmatic dependent launch, Hopper). Every kernel starts
// with pdl_wait() (device_common.cuh), which returns only once the previous kernel has completed and its
// writes are visible, so correctness never depends on the attribute; what overlaps is launch latency and, in
// the GEMVs, the first batch of the next weights. On by default (H200: E2B -0.17 ms and 26B-A4B -0.18 ms per
// token with the warp-per-row GEMVs, bench/NOTES.md); MARKBASE_CUDA_PDL=0 turns it off.
#pragma once

#include <cuda_runtime.h>

#include "cuda/check.h"

namespace markbase::cuda {

bool pdl_enabled();

template <class... KArgs, class... Args>
void launch_kernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                   Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    if (pdl_enabled()) {
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
    }
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...));
}

// The same with the grid's x dimension cut into thread-block clusters of cluster_x blocks (sizes above 8
// need the kernel's cudaFuncAttributeNonPortableClusterSizeAllowed).
template <class... KArgs, class... Args>
void launch_kernel_cluster(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                           int cluster_x, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = static_cast<unsigned>(cluster_x);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (pdl_enabled()) {
        attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[1].val.programmaticStreamSerializationAllowed = 1;
        cfg.numAttrs = 2;
    }
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...));
}

}  // namespace markbase::cuda
