// One head of the q/k norm + RoPE + cache write (GEMMA4.md 2.5.1-2.5.2), by one whole block: used by
// norm_rope.cu's qkv_post kernel (a block per head) and by the q/k/v GEMV's block that stores a head's last
// rows (gemv_rows.cu, MARKBASE_CUDA_QKV_POST=gemv). Inputs are read through L2 (__ldcg): in the second use
// other blocks of the running grid wrote them.
#pragma once

#include "cuda/device_common.cuh"
#include "cuda/kernels.h"

namespace markbase::cuda {

// Head b of token t: b < nH a query head (normalised, rotated, in place), then the nKV key heads (normalised,
// rotated, into the cache at the token's position) and the nKV value heads (normalised without a weight, into
// the cache). buf: d floats of shared memory, red: 32. Every thread of the block calls it.
template <bool Batched>
__device__ void qkv_post_head(const QkvPost& p, int b, int t, float* buf, float* red) {
    const int d = p.d, half = d / 2;
    const int64_t pos =
        Batched ? static_cast<int64_t>(p.tok_pos[t]) : static_cast<int64_t>(p.pos_base[0]) + t;
    const int64_t slot_off = Batched ? static_cast<int64_t>(p.tok_slot[t]) * p.slot_stride : 0;
    const float* in;
    float* out;
    const bf16* w;
    bool rope;
    if (b < p.nH) {
        in = p.q + (static_cast<int64_t>(t) * p.nH + b) * d;
        out = p.q + (static_cast<int64_t>(t) * p.nH + b) * d;
        w = p.q_norm;
        rope = true;
    } else if (b < p.nH + p.nKV) {
        const int g = b - p.nH;
        in = p.kraw + (static_cast<int64_t>(t) * p.nKV + g) * d;
        out = p.k_cache + slot_off + ((pos % p.cap) * p.nKV + g) * d;
        w = p.k_norm;
        rope = true;
    } else {
        const int g = b - p.nH - p.nKV;
        in = p.vraw + (static_cast<int64_t>(t) * p.nKV + g) * d;
        out = p.v_cache + slot_off + ((pos % p.cap) * p.nKV + g) * d;
        w = nullptr;
        rope = false;
    }
    float ss = 0.0f;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        const float v = __ldcg(in + j);
        buf[j] = v;
        ss = fmaf(v, v, ss);
    }
    ss = block_sum(ss, red);  // ends with a barrier: buf is complete
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(d) + p.eps);
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float v = buf[j] * inv;
        if (w) v *= bf16_at(w, j);
        buf[j] = v;
    }
    __syncthreads();
    if (rope) {
        const float fpos = static_cast<float>(pos);
        for (int j = threadIdx.x; j < half; j += blockDim.x) {
            const float ang = fpos * p.inv_freq[j];
            const float c = cosf(ang), s = sinf(ang);
            const float a = buf[j], bb = buf[j + half];
            out[j] = a * c - bb * s;
            out[j + half] = bb * c + a * s;
        }
    } else {
        for (int j = threadIdx.x; j < d; j += blockDim.x) out[j] = buf[j];
    }
    __syncthreads();  // buf may be reused by the caller
}

}  // namespace markbase::cuda
