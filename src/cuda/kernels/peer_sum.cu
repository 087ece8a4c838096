// The decode step's sums between tensor-parallel ranks over peer-to-peer NVLink (issue 7), in place of an
// NCCL all-reduce and the residual kernel after it. One block per rank: it stores its partial vector into row
// `rank` of every rank's inbox (a plain store through the peer's mapped pointer), publishes the call number
// in each peer's arrival flags, waits until every peer has published it too, then sums the inbox rows in rank
// order, so every rank computes the same bits (an all-reduce must leave the ranks' residual streams
// identical, or their routers and argmaxes could part). The call number is the rank's own count of finished
// sums, kept in device memory so that a captured graph replays correctly; the ranks run the same sequence of
// sums, so their counts agree. Two inbox slots, alternating by call: a rank can only be one call ahead of a
// peer (it waits for that peer's flag of the call before), so a slot is never rewritten while being read.
// With a residual, the block also applies the sandwich-norm update x = (x + RMSNorm(sum) * w) * scale.
#include "cuda/check.h"
#include "cuda/kernels/launch.h"
#include "cuda/kernels/peer_sum.cuh"

namespace markbase::cuda {

namespace {

constexpr int kThreads = 1024;
constexpr int kPer = 8;  // values per thread: n <= kThreads * kPer (8192, above every Gemma 4 H and 2H)

__global__ void __launch_bounds__(kThreads)
    peer_sum_kernel(const PeerSum ps, float* buf, int n, ResidualTail res) {
    __shared__ unsigned long long call_s;
    __shared__ float red[32];
    pdl_begin();
    if (threadIdx.x == 0) call_s = *ps.calls + 1;
    __syncthreads();
    const unsigned long long call = call_s;
    // 1. this rank's partial into row `rank` of every inbox (its own included)
    const bool vec = (n & 3) == 0;
    for (int q = 0; q < ps.world; ++q) {
        float* dst = peer_row(ps, q, call);
        if (vec) {
            for (int i = threadIdx.x; i < n / 4; i += blockDim.x)
                reinterpret_cast<float4*>(dst)[i] = reinterpret_cast<const float4*>(buf)[i];
        } else {
            for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = buf[i];
        }
    }
    __threadfence_system();
    __syncthreads();
    // 2. publish the call to every peer, 3. wait for theirs
    peer_exchange(ps, call);
    // 4. the sum in rank order, each thread's (at most kPer) elements loaded together: one round of L2
    // latency per peer row instead of one per element
    const float* in = ps.inbox[ps.rank] + static_cast<int64_t>(call & 1ull) * ps.world * ps.max_n;
    float v[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) v[j] = 0.0f;
    for (int q = 0; q < ps.world; ++q) {
        const float* row = in + static_cast<int64_t>(q) * ps.max_n;
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
            const int i = threadIdx.x + j * kThreads;
            if (i < n) v[j] += __ldcg(row + i);
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        const int i = threadIdx.x + j * kThreads;
        if (i < n) {
            buf[i] = v[j];
            ss = fmaf(v[j], v[j], ss);
        }
    }
    if (res.x) {  // 5. the residual update
        ss = block_sum(ss, red);
        const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + res.eps);
        float xv[kPer], wv[kPer];
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
            const int i = threadIdx.x + j * kThreads;
            if (i < n) {
                xv[j] = res.x[i];
                wv[j] = bf16_at(res.w, i);
            }
        }
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
            const int i = threadIdx.x + j * kThreads;
            if (i < n) res.x[i] = (xv[j] + v[j] * inv * wv[j]) * res.scale;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) *ps.calls = call;
}

}  // namespace

void peer_sum(const PeerSum& ps, float* buf, int n, const ResidualTail* res, cudaStream_t s) {
    if (ps.world < 2 || ps.world > kMaxPeers || n > ps.max_n || n > kThreads * kPer)
        throw Error("internal: peer_sum of " + std::to_string(n) + " values over " +
                    std::to_string(ps.world) + " ranks (inbox rows of " + std::to_string(ps.max_n) + ")");
    launch_kernel(peer_sum_kernel, dim3(1), dim3(kThreads), 0, s, ps, buf, n, res ? *res : ResidualTail{});
    CUDA_CHECK_LAUNCH();
}

}  // namespace markbase::cuda
