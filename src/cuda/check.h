// Every CUDA runtime and cuBLAS call goes through these: a failure throws markbase::Error naming the call,
// the error and file:line, so a broken launch never passes silently as exit code 0.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "model/error.h"

namespace markbase::cuda {

[[noreturn]] inline void throw_cuda(cudaError_t e, const char* call, const char* file, int line) {
    throw Error(std::string("CUDA error: ") + call + " failed with " + cudaGetErrorName(e) + " (" +
                cudaGetErrorString(e) + ") at " + file + ":" + std::to_string(line));
}
[[noreturn]] inline void throw_cublas(cublasStatus_t s, const char* call, const char* file, int line) {
    throw Error(std::string("cuBLAS error: ") + call + " failed with " + cublasGetStatusName(s) + " (" +
                cublasGetStatusString(s) + ") at " + file + ":" + std::to_string(line));
}

}  // namespace markbase::cuda

#define CUDA_CHECK(call)                                                                              \
    do {                                                                                              \
        const cudaError_t mb_err_ = (call);                                                           \
        if (mb_err_ != cudaSuccess) ::markbase::cuda::throw_cuda(mb_err_, #call, __FILE__, __LINE__); \
    } while (0)

#define CUBLAS_CHECK(call)                                                     \
    do {                                                                       \
        const cublasStatus_t mb_st_ = (call);                                  \
        if (mb_st_ != CUBLAS_STATUS_SUCCESS)                                   \
            ::markbase::cuda::throw_cublas(mb_st_, #call, __FILE__, __LINE__); \
    } while (0)

// After a kernel launch: catches bad launch configurations (and, when debugging, faults via a sync).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
