// Hopper's warpgroup MMA (wgmma, sm_90a): D[64][N] += A[64][16] B[16][N] in bf16 with fp32 accumulation, both
// operands read from shared memory through 64-bit matrix descriptors, issued by the 4 warps of a warpgroup at
// once and completed asynchronously (fence, commit, wait). The kernels that use it are compiled for sm_90a
// only (CMakeLists.txt: markbase_cuda_sm90a); elsewhere these trap.
//
// Both operands here are K-major tiles of 128-byte shared rows whose 16-byte chunks are XOR-swizzled by row &
// 7 (smem_ring.cuh's swz): the hardware's 128-byte swizzle, so a tile's 8-row groups must start 1024-aligned,
// 1024 bytes apart. A k16 step inside the row advances the start address by 32 bytes.
//
// The accumulators: thread t of the warpgroup (warp w = t / 32, lane l) holds N / 2 floats; element i is row
// 16 w + l / 4 + 8 ((i / 2) & 1), column 8 (i / 4) + 2 (l & 3) + (i & 1): mma.sync's m16n8 fragment, per n8
// tile.
#pragma once

#include <cstdint>

namespace markbase::cuda {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MARKBASE_HAS_WGMMA 1
#endif

// The descriptor of a K-major, 128-byte-swizzled tile at shared address `addr`: stride 1024 bytes between
// 8-row groups (the leading offset is unused in this layout; 1 by convention), layout type 1 (128-byte
// swizzle).
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t addr) {
    return static_cast<uint64_t>((addr & 0x3ffff) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) |
           (uint64_t{1} << 62);
}

// Makes this thread's generic-proxy writes of shared memory (cp.async's among them) visible to the tensor
// cores' reads; before the barrier that hands the tile to the warpgroup.
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// Orders this thread's register and shared-memory accesses before the warpgroup's next wgmma.
__device__ __forceinline__ void wgmma_fence() {
#ifdef MARKBASE_HAS_WGMMA
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#else
    __trap();
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#ifdef MARKBASE_HAS_WGMMA
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
// Until at most N of the warpgroup's committed groups are in flight.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#ifdef MARKBASE_HAS_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
#endif
}
// Keeps the compiler from moving accesses of an accumulator across the asynchronous MMAs that own it.
template <int R>
__device__ __forceinline__ void wgmma_pin(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

template <int N>
__device__ void wgmma_bf16(float (&d)[N / 2], uint64_t a, uint64_t b);

// One m64nNk16 instruction: its N / 2 accumulators, then the two descriptors (operands N / 2 and N / 2 + 1)
// and the scale of D (operand N / 2 + 2, 1: D += A B).
#ifdef MARKBASE_HAS_WGMMA
#define MARKBASE_WGMMA(N, REGS, DA, DB, SC, ...)                                                   \
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %" SC ", 0; wgmma.mma_async.sync.aligned.m64n" #N \
                 "k16.f32.bf16.bf16 {" REGS "}, %" DA ", %" DB ", p, 1, 1, 0, 0; }"                \
                 : __VA_ARGS__                                                                     \
                 : "l"(a), "l"(b), "r"(1))
#else
#define MARKBASE_WGMMA(N, REGS, DA, DB, SC, ...) __trap()
#endif
#define MB_R0 "%0, %1, %2, %3, %4, %5, %6, %7"
#define MB_R8 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define MB_R16 ", %16, %17, %18, %19, %20, %21, %22, %23"
#define MB_R24 ", %24, %25, %26, %27, %28, %29, %30, %31"
#define MB_R32 ", %32, %33, %34, %35, %36, %37, %38, %39"
#define MB_R40 ", %40, %41, %42, %43, %44, %45, %46, %47"
#define MB_R48 ", %48, %49, %50, %51, %52, %53, %54, %55"
#define MB_R56 ", %56, %57, %58, %59, %60, %61, %62, %63"
#define MB_F8(i)                                                                                \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
        "+f"(d[i + 6]), "+f"(d[i + 7])

template <>
__device__ __forceinline__ void wgmma_bf16<16>(float (&d)[8], uint64_t a, uint64_t b) {
    MARKBASE_WGMMA(16, MB_R0, "8", "9", "10", MB_F8(0));
}
template <>
__device__ __forceinline__ void wgmma_bf16<32>(float (&d)[16], uint64_t a, uint64_t b) {
    MARKBASE_WGMMA(32, MB_R0 MB_R8, "16", "17", "18", MB_F8(0), MB_F8(8));
}
template <>
__device__ __forceinline__ void wgmma_bf16<48>(float (&d)[24], uint64_t a, uint64_t b) {
    MARKBASE_WGMMA(48, MB_R0 MB_R8 MB_R16, "24", "25", "26", MB_F8(0), MB_F8(8), MB_F8(16));
}
template <>
__device__ __forceinline__ void wgmma_bf16<64>(float (&d)[32], uint64_t a, uint64_t b) {
    MARKBASE_WGMMA(64, MB_R0 MB_R8 MB_R16 MB_R24, "32", "33", "34", MB_F8(0), MB_F8(8), MB_F8(16), MB_F8(24));
}
template <>
__device__ __forceinline__ void wgmma_bf16<80>(float (&d)[40], uint64_t a, uint64_t b) {
    MARKBASE_WGMMA(80, MB_R0 MB_R8 MB_R16 MB_R24 MB_R32, "40", "41", "42", MB_F8(0), MB_F8(8), MB_F8(16),
                   MB_F8(24), MB_F8(32));
}
template <>
__device__ __forceinline__ void wgmma_bf16<96>(float (&d)[48], uint64_t a, uint64_t b) {
    MARKBASE_WGMMA(96, MB_R0 MB_R8 MB_R16 MB_R24 MB_R32 MB_R40, "48", "49", "50", MB_F8(0), MB_F8(8),
                   MB_F8(16), MB_F8(24), MB_F8(32), MB_F8(40));
}
template <>
__device__ __forceinline__ void wgmma_bf16<112>(float (&d)[56], uint64_t a, uint64_t b) {
    MARKBASE_WGMMA(112, MB_R0 MB_R8 MB_R16 MB_R24 MB_R32 MB_R40 MB_R48, "56", "57", "58", MB_F8(0), MB_F8(8),
                   MB_F8(16), MB_F8(24), MB_F8(32), MB_F8(40), MB_F8(48));
}
template <>
__device__ __forceinline__ void wgmma_bf16<128>(float (&d)[64], uint64_t a, uint64_t b) {
    MARKBASE_WGMMA(128, MB_R0 MB_R8 MB_R16 MB_R24 MB_R32 MB_R40 MB_R48 MB_R56, "64", "65", "66", MB_F8(0),
                   MB_F8(8), MB_F8(16), MB_F8(24), MB_F8(32), MB_F8(40), MB_F8(48), MB_F8(56));
}
#undef MARKBASE_WGMMA
#undef MB_R0
#undef MB_R8
#undef MB_R16
#undef MB_R24
#undef MB_R32
#undef MB_R40
#undef MB_R48
#undef MB_R56
#undef MB_F8

}  // namespace markbase::cuda
