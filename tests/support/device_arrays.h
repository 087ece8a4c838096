// Kernel tests' host side: bf16 bits rounded as the device rounds them (to nearest even), and host vectors
// copied to and from device memory (failures reported through gtest).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#ifdef MARKBASE_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace markbase::testing {

inline uint16_t to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float from_bf16(uint16_t b) {
    const uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

#ifdef MARKBASE_HAS_CUDA
template <class T>
T* to_device(const std::vector<T>& v) {
    T* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, sizeof(T) * v.size()), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, v.data(), sizeof(T) * v.size(), cudaMemcpyHostToDevice), cudaSuccess);
    return p;
}
template <class T>
std::vector<T> to_host(const T* p, size_t n) {
    std::vector<T> v(n);
    EXPECT_EQ(cudaMemcpy(v.data(), p, sizeof(T) * n, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
}
#endif

}  // namespace markbase::testing
