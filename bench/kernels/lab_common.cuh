// What the kernel labs (gemv_lab.cu, stream_gemm_lab.cu, persist_lab.cu, attn_lab.cu) share: the CUDA and
// cuBLAS error checks, the counter hash their random data is drawn from, and event timing.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(call)                                                                                      \
    do {                                                                                              \
        cudaError_t e_ = (call);                                                                      \
        if (e_ != cudaSuccess) {                                                                      \
            std::fprintf(stderr, "%s failed: %s at %s:%d\n", #call, cudaGetErrorString(e_), __FILE__, \
                         __LINE__);                                                                   \
            std::exit(1);                                                                             \
        }                                                                                             \
    } while (0)

#define CB(call)                                                                                    \
    do {                                                                                            \
        cublasStatus_t s_ = (call);                                                                 \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                          \
            std::fprintf(stderr, "%s failed: %d at %s:%d\n", #call, static_cast<int>(s_), __FILE__, \
                         __LINE__);                                                                 \
            std::exit(1);                                                                           \
        }                                                                                           \
    } while (0)

namespace lab {

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// uniform [-1, 1) from element i of the stream named by seed
__device__ __forceinline__ float uniform_pm1(uint64_t seed, int64_t i) {
    const uint64_t h = mix64(seed + (static_cast<uint64_t>(i) + 1) * 0x9e3779b97f4a7c15ull);
    return static_cast<float>(h >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// The median over reps calls of `run` on stream s, CUDA events around each call, after one warm-up call.
template <class F>
float time_ms(int reps, cudaStream_t s, F&& run) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    run();  // warm-up
    CK(cudaStreamSynchronize(s));
    std::vector<float> t;
    for (int r = 0; r < reps; ++r) {
        CK(cudaEventRecord(e0, s));
        run();
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms = 0.0f;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        t.push_back(ms);
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return median(t);
}

}  // namespace lab
