// One attention head's RMSNorm (times its weights) and RoPE (GEMMA4.md 2.5.2), by a block of kHeadThreads
// threads, each holding elements j = threadIdx.x + i * kHeadThreads (i < kHeadPer) of the head. Shared by
// qkv_post (norm_rope.cu), which writes q in place and k / v into the cache, and the decode attention pieces
// with the post fused (attention.cu, MARKBASE_CUDA_ATTN_POST): the same operations in the same order, so both
// give the same bits.
#pragma once

#include "cuda/device_common.cuh"

namespace markbase::cuda {

constexpr int kHeadThreads = 128;
constexpr int kHeadPer = 4;  // head dim <= 512

// This thread's norm weights (1 without weights: v's norm has none) and RoPE frequencies (0: the pair does
// not rotate; no frequencies at all: v, which is not rotated).
__device__ __forceinline__ void head_consts(const uint16_t* w, const float* inv_freq, int d,
                                            float (&wv)[kHeadPer], float (&fv)[kHeadPer / 2]) {
#pragma unroll
    for (int i = 0; i < kHeadPer; ++i) {
        const int j = threadIdx.x + i * kHeadThreads;
        wv[i] = w && j < d ? bf16_at(w, j) : 1.0f;
    }
#pragma unroll
    for (int i = 0; i < kHeadPer / 2; ++i) {
        const int j = threadIdx.x + i * kHeadThreads;
        fv[i] = inv_freq && j < d / 2 ? inv_freq[j] : 0.0f;
    }
}

// The rotation of this thread's pairs at position pos.
struct HeadRope {
    float c[kHeadPer / 2], s[kHeadPer / 2];
};
__device__ __forceinline__ HeadRope head_rope(const float (&fv)[kHeadPer / 2], int64_t pos) {
    HeadRope r;
    const float fpos = static_cast<float>(pos);
#pragma unroll
    for (int i = 0; i < kHeadPer / 2; ++i) {
        const float ang = fpos * fv[i];
        r.c[i] = cosf(ang);
        r.s[i] = sinf(ang);
    }
    return r;
}

// The two halves of a head's post, a barrier between them (the rotation pairs element j with j + d / 2, which
// another thread may have scaled). head_scale: buf (shared, d floats) holds the raw head and ss its sum of
// squares over the block; it leaves buf normalised times wv.
__device__ __forceinline__ void head_scale(float* buf, int d, float ss, float eps, const float (&wv)[kHeadPer]) {
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
#pragma unroll
    for (int i = 0; i < kHeadPer; ++i) {
        const int j = threadIdx.x + i * kHeadThreads;
        if (j < d) buf[j] = buf[j] * inv * wv[i];  // wv = 1 without a weight (v): exact
    }
}
// head_rotate: with rotate, rotates buf in place by rope; writes the result to out (global) too when out is
// not null.
__device__ __forceinline__ void head_rotate(float* buf, int d, bool rotate, const HeadRope& rope, float* out) {
    const int half = d / 2;
    if (rotate) {
#pragma unroll
        for (int i = 0; i < kHeadPer / 2; ++i) {
            const int j = threadIdx.x + i * kHeadThreads;
            if (j < half) {
                const float c = rope.c[i], sn = rope.s[i];
                const float a = buf[j], bb = buf[j + half];
                const float r0 = a * c - bb * sn, r1 = bb * c + a * sn;
                buf[j] = r0;  // (this thread alone reads and writes the pair j, j + half)
                buf[j + half] = r1;
                if (out) {
                    out[j] = r0;
                    out[j + half] = r1;
                }
            }
        }
    } else if (out) {
#pragma unroll
        for (int i = 0; i < kHeadPer; ++i) {
            const int j = threadIdx.x + i * kHeadThreads;
            if (j < d) out[j] = buf[j];
        }
    }
}

}  // namespace markbase::cuda
