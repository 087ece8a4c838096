// Device side of the tensor-parallel peer sums (peer_sum.cu's kernel): the inbox layout, the flag exchange
// and the sum in rank order. See peer_sum.cu for the protocol and why two slots suffice.
#pragma once

#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"

namespace markbase::cuda {

constexpr unsigned long long kPeerTimeoutNs = 2000000000ull;  // a peer that never arrives: report, not hang

__device__ __forceinline__ void store_release_sys(unsigned long long* p, unsigned long long v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ unsigned long long load_acquire_sys(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// This rank's row for call `call` in rank q's inbox.
__device__ __forceinline__ float* peer_row(const PeerSum& ps, int q, unsigned long long call) {
    return ps.inbox[q] + (static_cast<int64_t>(call & 1ull) * ps.world + ps.rank) * ps.max_n;
}

// Block-wide: publish `call` in every peer's flags and wait until every peer has published it; ends with a
// barrier, after which the peers' rows of this call are readable. The block's stores into the inboxes must
// already be fenced at system scope.
__device__ __forceinline__ void peer_exchange(const PeerSum& ps, unsigned long long call) {
    if (threadIdx.x == 0)
        for (int q = 0; q < ps.world; ++q)
            if (q != ps.rank) store_release_sys(ps.flags[q] + ps.rank, call);
    if (static_cast<int>(threadIdx.x) < ps.world && static_cast<int>(threadIdx.x) != ps.rank) {
        const unsigned long long* f = ps.flags[ps.rank] + threadIdx.x;
        const unsigned long long t0 = global_ns();
        // once a wait has timed out, later calls do not wait again: a broken link fails in seconds, not hours
        while (!*reinterpret_cast<volatile int*>(ps.timed_out) && load_acquire_sys(f) < call)
            if (global_ns() - t0 > kPeerTimeoutNs) {
                *ps.timed_out = 1;
                break;
            }
    }
    __syncthreads();
}

// Element i of the sum over the ranks for call `call`, added in rank order (every rank gets the same bits);
// read from L2: the peers' stores arrived there, never in this SM's L1.
__device__ __forceinline__ float peer_total(const PeerSum& ps, unsigned long long call, int i) {
    const float* in = ps.inbox[ps.rank] + static_cast<int64_t>(call & 1ull) * ps.world * ps.max_n;
    float v = 0.0f;
    for (int q = 0; q < ps.world; ++q) v += __ldcg(in + static_cast<int64_t>(q) * ps.max_n + i);
    return v;
}

}  // namespace markbase::cuda
