// The end of a step on the device: the argmax (accumulated by the lm_head GEMV into one 64-bit key) becomes
// the next step's input token, the position advances, and the id is appended to the greedy-decoding output,
// so consecutive graph replays chain without the host. Also the softcap for full-logit prefill.
#include <algorithm>

#include "cuda/check.h"
#include "cuda/device_common.cuh"
#include "cuda/kernels.h"
#include "cuda/launch.h"

namespace markbase::cuda {

namespace {

__global__ void finish_kernel(const unsigned long long* key, int* state, int advance, int* out_ids,
                              int out_cap) {
    pdl_begin();
    finish_token(*key, state, advance, out_ids, out_cap);
}

__global__ void softcap_kernel(float* x, int64_t n, float cap) {
    pdl_begin();
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        x[i] = cap * tanhf(x[i] / cap);
}

}  // namespace

void finish_step(const unsigned long long* argmax_key, int* state, int advance, int* out_ids, int out_cap,
                 cudaStream_t s) {
    launch_kernel(finish_kernel, dim3(1), dim3(1), 0, s, argmax_key, state, advance, out_ids, out_cap);
    CUDA_CHECK_LAUNCH();
}

void softcap_inplace(float* logits, int64_t n, float cap, cudaStream_t s) {
    const int64_t blocks = std::min<int64_t>((n + 255) / 256, 8192);
    launch_kernel(softcap_kernel, dim3(static_cast<unsigned>(blocks)), dim3(256), 0, s, logits, n, cap);
    CUDA_CHECK_LAUNCH();
}

}  // namespace markbase::cuda
