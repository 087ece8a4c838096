// REQUIRE_CUDA(): skip a test, with the reason, where there is no usable CUDA device or no CUDA backend in
// this build (CI has none; the GPU machine runs them).
#pragma once

#include <gtest/gtest.h>

#ifdef MARKBASE_HAS_CUDA
#include "cuda/backend.h"
#define REQUIRE_CUDA()                                                             \
    do {                                                                           \
        const ::markbase::CudaDeviceInfo info_ = ::markbase::cuda_device_info();   \
        if (!info_.available) GTEST_SKIP() << "no CUDA device: " << info_.why_not; \
    } while (0)
#else
#define REQUIRE_CUDA() \
    GTEST_SKIP() << "no CUDA device: this build has no CUDA backend (MARKBASE_CUDA off or nvcc missing)"
#endif
