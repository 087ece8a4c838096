// The building blocks of a cp.async ring in shared memory that moe_gemm.cu and tile_gemm.cu share: 16-byte
// copies (zeros where a row does not exist), the ring's groups, ldmatrix, and 128-byte shared rows whose
// 16-byte chunks are XOR-swizzled by row & 7, so that the 8 rows an ldmatrix phase reads hit distinct banks.
#pragma once

#include <cstdint>

namespace markbase::cuda {

__device__ __forceinline__ uint32_t shared_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared, zeros where !ok (src-size 0 reads nothing)
__device__ __forceinline__ void cp16(uint32_t dst, const void* src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
// Until at most N of this thread's groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void ldmatrix4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
// The byte offset of 16-byte chunk c (0..7) of shared row `row`: chunks XOR-swizzled by row & 7.
__device__ __forceinline__ uint32_t swz(int row, int c) {
    return static_cast<uint32_t>(row * 128 + ((c ^ (row & 7)) << 4));
}

}  // namespace markbase::cuda
