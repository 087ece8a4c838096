// Thread-block cluster building blocks (sm_90): the cluster barrier's phases and distributed shared memory.
// A block may touch another block's shared memory only once every block of the cluster has started, and a
// block's shared memory must outlive every store into it: the kernels using these arrive (relaxed) at their
// start and wait just before their first remote store, and every remote store precedes an arrive (release)
// that its owner waits on (acquire) before reading. The PTX fallback for older GPUs compiles these to traps;
// the host never launches a cluster kernel there (attention_cluster_fits).
#pragma once

#include <cooperative_groups.h>

namespace markbase::cuda {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MARKBASE_CLUSTER_ASM(x) asm volatile(x ::: "memory")
#else
#define MARKBASE_CLUSTER_ASM(x) __trap()
#endif
__device__ __forceinline__ void cluster_arrive_relaxed() {
    MARKBASE_CLUSTER_ASM("barrier.cluster.arrive.relaxed.aligned;");
}
__device__ __forceinline__ void cluster_arrive_release() {
    MARKBASE_CLUSTER_ASM("barrier.cluster.arrive.release.aligned;");
}
__device__ __forceinline__ void cluster_wait_acquire() {
    MARKBASE_CLUSTER_ASM("barrier.cluster.wait.acquire.aligned;");
}
// The address of the same shared-memory variable in block `rank` of this cluster (a generic pointer).
__device__ __forceinline__ float* cluster_map(float* p, unsigned rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return cooperative_groups::this_cluster().map_shared_rank(p, rank);
#else
    (void)rank;
    __trap();
    return p;
#endif
}

}  // namespace markbase::cuda
