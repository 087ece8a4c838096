// The profile mode's gate: one thread holds the stream until the host has enqueued a whole step (or a timeout
// passes), so the events around each kernel time the GPU's work and the gaps between kernels, not how fast
// the host enqueues them. Without it, a kernel shorter than its host-side launch cost reads as that cost.
#include "cuda/check.h"
#include "cuda/kernels/kernels.h"

namespace markbase::cuda {

namespace {

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void gate_kernel(const volatile int* flag, unsigned long long timeout_ns, int* timed_out) {
    const unsigned long long t0 = global_ns();
    while (*flag == 0) {
        if (global_ns() - t0 > timeout_ns) {
            *timed_out = 1;
            return;
        }
        __nanosleep(1000);
    }
}

}  // namespace

void stream_gate(const int* flag, double timeout_s, int* timed_out, cudaStream_t s) {
    gate_kernel<<<1, 1, 0, s>>>(flag, static_cast<unsigned long long>(timeout_s * 1e9), timed_out);
    CUDA_CHECK_LAUNCH();
}

}  // namespace markbase::cuda
