// What moe.cu (routing, the decode experts) and moe_prefill.cu (the prefill experts) share: the block shape
// of the expert kernels and which experts this rank holds.
#pragma once

#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"

namespace markbase::cuda::moe_kernels {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kEntries = 4;  // entries (token inputs) per pass over a weight row
constexpr int kUnroll = 2;

// Expert e's index among the ones this rank holds, or -1 (another rank's: its entries get zeros).
__device__ __forceinline__ int held_index(int e, ExpertRange held) {
    if (held.count < 0) return e;
    return e >= held.begin && e < held.begin + held.count ? e - held.begin : -1;
}

}  // namespace markbase::cuda::moe_kernels
