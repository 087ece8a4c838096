// Attention over the fp32 KV cache for decode (n = 1) and prefill (n tokens), flash-decoding style: the key
// range a query sees is cut into nsplit pieces; one block per (piece, head, token) computes an unnormalised
// partial softmax-weighted sum with its running max and sum (online softmax over tiles of 128 keys), and a
// combine kernel merges the pieces. Positions come from device memory, so a captured graph stays valid as the
// sequence grows: pieces past the current range just report an empty result. Ring slots: position p lives at
// p % cap, as in the CPU cache. Scale 1.0, no softcap (GEMMA4.md 2.5.3); GQA maps head h to KV head h / (nH/nKV).
#include <algorithm>
#include <cfloat>

#include "cuda/check.h"
#include "cuda/device_common.cuh"
#include "cuda/kernels.h"
#include "cuda/launch.h"

namespace markbase::cuda {

namespace {

constexpr int kThreads = 128;  // == kTile: one thread per key when exponentiating a tile
constexpr int kTile = 128;
constexpr int kMaxDimsPerThread = 4;  // head dim <= 512

__global__ void __launch_bounds__(kThreads) attn_partial_kernel(const AttnArgs a) {
    extern __shared__ float4 smem4[];
    float* qs = reinterpret_cast<float*>(smem4);  // [d]
    __shared__ float sc[kTile];
    pdl_begin();
    const int sp = blockIdx.x, h = blockIdx.y, t = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int d = a.d;
    const int64_t pos = static_cast<int64_t>(a.pos_base[0]) + t;
    const int64_t lo = a.window > 0 ? max(static_cast<int64_t>(0), pos - a.window + 1) : 0;
    // split_len 0 (decode graphs): spread the current range evenly over the pieces, at least 64 keys each
    const int64_t split_len =
        a.split_len > 0 ? a.split_len : max(static_cast<int64_t>(64), (pos - lo + a.nsplit) / a.nsplit);
    const int64_t start = lo + static_cast<int64_t>(sp) * split_len;
    const int64_t end = min(pos + 1, start + split_len);
    const int64_t idx = (static_cast<int64_t>(t) * a.nH + h) * a.nsplit + sp;
    if (start >= end) {
        if (tid == 0) {
            a.part_ml[2 * idx] = -FLT_MAX;
            a.part_ml[2 * idx + 1] = 0.0f;
        }
        return;
    }
    const int g = h / (a.nH / a.nKV);
    const float* q = a.q + (static_cast<int64_t>(t) * a.nH + h) * d;
    for (int j = tid; j < d; j += kThreads) qs[j] = q[j];
    __syncthreads();

    const int d4 = d / 4;
    float m = -FLT_MAX, l = 0.0f;
    float acc[kMaxDimsPerThread];
#pragma unroll
    for (int i = 0; i < kMaxDimsPerThread; ++i) acc[i] = 0.0f;

    for (int64_t ts = start; ts < end; ts += kTile) {
        const int cnt = static_cast<int>(min(static_cast<int64_t>(kTile), end - ts));
        for (int j = warp; j < cnt; j += kThreads / 32) {
            const float4* kp =
                reinterpret_cast<const float4*>(a.k_cache + (((ts + j) % a.cap) * a.nKV + g) * d);
            float s = 0.0f;
            for (int c = lane; c < d4; c += 32) {
                const float4 kv = __ldg(kp + c), qv = smem4[c];
                s = fmaf(kv.x, qv.x, s);
                s = fmaf(kv.y, qv.y, s);
                s = fmaf(kv.z, qv.z, s);
                s = fmaf(kv.w, qv.w, s);
            }
            s = warp_sum(s);
            if (lane == 0) sc[j] = s;
        }
        __syncthreads();
        float tmax = -FLT_MAX;
        for (int j = 0; j < cnt; ++j) tmax = fmaxf(tmax, sc[j]);
        const float new_m = fmaxf(m, tmax);
        const float corr = __expf(m - new_m);
        __syncthreads();
        if (tid < cnt) sc[tid] = expf(sc[tid] - new_m);
        __syncthreads();
        float lsum = 0.0f;
#pragma unroll
        for (int i = 0; i < kMaxDimsPerThread; ++i) acc[i] *= corr;
        for (int j = 0; j < cnt; ++j) {
            const float p = sc[j];
            lsum += p;
            const float* vp = a.v_cache + (((ts + j) % a.cap) * a.nKV + g) * d;
#pragma unroll
            for (int i = 0; i < kMaxDimsPerThread; ++i) {
                const int dim = tid + i * kThreads;
                if (dim < d) acc[i] = fmaf(p, __ldg(vp + dim), acc[i]);
            }
        }
        l = l * corr + lsum;
        m = new_m;
        __syncthreads();
    }
    float* po = a.part_o + idx * d;
#pragma unroll
    for (int i = 0; i < kMaxDimsPerThread; ++i) {
        const int dim = tid + i * kThreads;
        if (dim < d) po[dim] = acc[i];
    }
    if (tid == 0) {
        a.part_ml[2 * idx] = m;
        a.part_ml[2 * idx + 1] = l;
    }
}

__global__ void __launch_bounds__(kThreads) attn_combine_kernel(const AttnArgs a) {
    pdl_begin();
    const int h = blockIdx.x, t = blockIdx.y, d = a.d;
    const int64_t base = (static_cast<int64_t>(t) * a.nH + h) * a.nsplit;
    float M = -FLT_MAX;
    for (int s = 0; s < a.nsplit; ++s)
        if (a.part_ml[2 * (base + s) + 1] > 0.0f) M = fmaxf(M, a.part_ml[2 * (base + s)]);
    float L = 0.0f;
    float acc[kMaxDimsPerThread];
#pragma unroll
    for (int i = 0; i < kMaxDimsPerThread; ++i) acc[i] = 0.0f;
    for (int s = 0; s < a.nsplit; ++s) {
        const float ls = a.part_ml[2 * (base + s) + 1];
        if (!(ls > 0.0f)) continue;  // empty piece: its partial output was never written
        const float f = __expf(a.part_ml[2 * (base + s)] - M);
        L += ls * f;
        const float* po = a.part_o + (base + s) * d;
#pragma unroll
        for (int i = 0; i < kMaxDimsPerThread; ++i) {
            const int dim = threadIdx.x + i * kThreads;
            if (dim < d) acc[i] = fmaf(po[dim], f, acc[i]);
        }
    }
    const float inv = 1.0f / L;
    float* out = a.out + (static_cast<int64_t>(t) * a.nH + h) * d;
#pragma unroll
    for (int i = 0; i < kMaxDimsPerThread; ++i) {
        const int dim = threadIdx.x + i * kThreads;
        if (dim < d) out[dim] = acc[i] * inv;
    }
}

}  // namespace

void attention_pieces(const AttnArgs& a, int n, cudaStream_t s) {
    if (a.d % 4 != 0 || a.d > kThreads * kMaxDimsPerThread)
        throw Error("internal: attention head dim " + std::to_string(a.d) + " unsupported (multiple of 4, <= 512)");
    if (a.nKV <= 0 || a.nH % a.nKV != 0) throw Error("internal: attention heads do not group evenly");
    launch_kernel(attn_partial_kernel, dim3(a.nsplit, a.nH, n), dim3(kThreads), static_cast<size_t>(a.d) * sizeof(float),
                  s, a);
    CUDA_CHECK_LAUNCH();
}

void attention_combine(const AttnArgs& a, int n, cudaStream_t s) {
    launch_kernel(attn_combine_kernel, dim3(a.nH, n), dim3(kThreads), 0, s, a);
    CUDA_CHECK_LAUNCH();
}

void attention(const AttnArgs& a, int n, cudaStream_t s) {
    attention_pieces(a, n, s);
    attention_combine(a, n, s);
}

}  // namespace markbase::cuda
