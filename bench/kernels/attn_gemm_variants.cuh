// The prefill attention's GEMM variants that measured worse than (or no better than) the product's fp32
// products, kept for the lab (attn_lab.cu): TF32 products (+2..+11% prefill, error ~1e-4 of the logits'
// range), bf16 tensor cores over hi/lo halves (bf16x3: +4.5..+9.9% at 512 tokens with fp32's error, but E2B
// -42% at 4096 tokens, not yet explained) and causal row blocks (R = 128: 31B +1.4%, E2B -11.5%). With none
// of them set this is the product's src/cuda/kernels/attention_gemm.cu. On bf16x3: q.k = qh.kh + ql.kh +
// qh.kl as one GEMM over three times the head dim ([qh | ql | qh] against [kh | kh | kl]), and p.v = ph.vh +
// ph.vl + pl.vh over three times the keys ([ph | ph | pl] against [vh; vl; vh]); the dropped lo.lo term is
// ~2^-16 of the product.
#pragma once

#include <algorithm>
#include <cfloat>

#include "cuda/check.h"
#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"
#include "cuda/kernels/launch.h"

namespace attn_lab {

using namespace markbase::cuda;

// The production AttnGemm's fields before the variants left it: tf32 (TF32 products), block_rows (causal
// row blocks of that many queries while the ring has not wrapped), bf16x3 (bf16 hi/lo copies for key ranges
// of at most keys3 slots: q3 [n][nH][3d], k3 [keys3][nKV][3d], v3 [3][keys3][nKV][d], p3 [3 s_floats]).
struct LabGemm {
    cublasHandle_t blas = nullptr;
    float* s = nullptr;
    int64_t s_floats = 0;
    void** ptrs = nullptr;
    bool tf32 = false;
    int block_rows = 0;
    bool bf16x3 = false;
    int64_t keys3 = 0;
    uint16_t *q3 = nullptr, *k3 = nullptr, *v3 = nullptr, *p3 = nullptr;
};

namespace detail {

constexpr int kSoftmaxThreads = 256;
constexpr int kSoftmaxPer = 8;  // a row of <= 2048 keys stays in registers
constexpr int kMinRows = 16;    // fewer query rows per call than this: declined

// The six pointer arrays of one batch of heads [h0, h0 + hb) and query rows [q0, q0 + nq):
// [0] K_g, [1] Q_h, [2] S_i for the scores; [3] V_g, [4] P_i (= S_i), [5] O_h for the output.
// Keys from slot k0: the scores' rows are Ls long.
static __global__ void attn_gemm_ptrs_kernel(const AttnArgs a, int q0, int nq, int h0, int hb, int64_t k0,
                                             int64_t Ls, float* sc, void** p) {
    pdl_begin();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= hb) return;
    const int h = h0 + i, g = h / (a.nH / a.nKV);
    const int64_t qrow = int64_t{a.nH} * a.d, head = int64_t{h} * a.d;
    const int64_t kv = k0 * a.nKV * a.d + int64_t{g} * a.d;
    float* s = sc + int64_t{i} * nq * Ls;
    p[i] = const_cast<float*>(static_cast<const float*>(a.k_cache) + kv);
    p[hb + i] = const_cast<float*>(a.q + q0 * qrow + head);
    p[2 * hb + i] = s;
    p[3 * hb + i] = const_cast<float*>(static_cast<const float*>(a.v_cache) + kv);
    p[4 * hb + i] = s;
    p[5 * hb + i] = a.out + q0 * qrow + head;
}

// bf16x3: q3 [n][nH][3d] = [qh | ql | qh] per head; k3 [Ls][nKV][3d] = [kh | kh | kl]; v3 [3][Ls][nKV][d]
// = vh, vl, vh. One thread per fp32 element.
static __global__ void attn_split3_kernel(const AttnArgs a, int n, int64_t Ls, uint16_t* q3, uint16_t* k3,
                                          uint16_t* v3) {
    pdl_begin();
    const int64_t d = a.d, nq = int64_t{n} * a.nH * d, nkv = Ls * a.nKV * d;
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < nq + nkv;
         i += int64_t{gridDim.x} * blockDim.x) {
        if (i < nq) {
            const int64_t head = i / d, c = i - head * d;
            uint16_t* o = q3 + head * 3 * d + c;
            split_store(a.q[i], o, o + d, 0);
            o[2 * d] = o[0];
        } else {
            const int64_t j = i - nq, row = j / d, c = j - row * d;  // row = slot * nKV + g
            uint16_t* o = k3 + row * 3 * d + c;
            split_store(static_cast<const float*>(a.k_cache)[j], o, o + 2 * d, 0);
            o[d] = o[0];
            uint16_t* w = v3 + j;
            split_store(static_cast<const float*>(a.v_cache)[j], w, w + nkv, 0);
            w[2 * nkv] = w[0];
        }
    }
}

// The six pointer arrays of the bf16x3 path (as attn_gemm_ptrs_kernel, over q3 / k3 / v3 and p3 [hb][nq][3
// Ls])
static __global__ void attn_gemm_ptrs3_kernel(const AttnArgs a, int q0, int nq, int h0, int hb, int64_t Ls,
                                              float* sc, const uint16_t* q3, const uint16_t* k3,
                                              const uint16_t* v3, uint16_t* p3, void** p) {
    pdl_begin();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= hb) return;
    const int h = h0 + i, g = h / (a.nH / a.nKV);
    const int64_t d = a.d;
    p[i] = const_cast<uint16_t*>(k3 + g * 3 * d);
    p[hb + i] = const_cast<uint16_t*>(q3 + (int64_t{q0} * a.nH + h) * 3 * d);
    p[2 * hb + i] = sc + int64_t{i} * nq * Ls;
    p[3 * hb + i] = const_cast<uint16_t*>(v3 + g * d);
    p[4 * hb + i] = p3 + int64_t{i} * nq * 3 * Ls;
    p[5 * hb + i] = a.out + (int64_t{q0} * a.nH + h) * d;
}

// The position held by key slot j (the ring's latest write of j's residue class once it has wrapped), and
// whether the query at position p sees it.
static __device__ __forceinline__ bool slot_visible(int64_t j, int64_t p, int64_t top, int64_t cap,
                                                    bool wrapped, int window) {
    const int64_t kp = wrapped ? top - (top - j) % cap : j;
    return kp <= p && (window == 0 || kp > p - window);
}

// grid hb * nq rows (head i = row / nq, token q0 + row % nq), kSoftmaxThreads threads; in place:
// S row -> softmax over the visible slots, 0 elsewhere. Cached: the row in registers (Ls <= 2048).
// With p3: the probabilities go to p3's row [ph | ph | pl] (3 Ls bf16) instead of back into the scores. The
// row's first key is slot k0.
template <bool Cached>
static __global__ void __launch_bounds__(kSoftmaxThreads)
    attn_gemm_softmax_kernel(float* sc, int64_t Ls, int nq, int q0, int64_t pos0, int n, int64_t cap,
                             int window, uint16_t* p3, int64_t k0) {
    pdl_begin();
    __shared__ float red[kSoftmaxThreads / 32];
    const int64_t row = blockIdx.x;
    float* x = sc + row * Ls;
    uint16_t* x3 = p3 ? p3 + row * 3 * Ls : nullptr;
    auto put = [&](int64_t j, float v) {
        if (!x3) {
            x[j] = v;
            return;
        }
        split_store(v, x3, x3 + 2 * Ls, j);
        x3[Ls + j] = x3[j];
    };
    const int64_t p = pos0 + q0 + row % nq, top = pos0 + n - 1;
    const bool wrapped = pos0 + n > cap;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    auto block_reduce = [&](float v, bool is_max) {
        for (int o = 16; o > 0; o >>= 1) {
            const float u = __shfl_xor_sync(0xffffffffu, v, o);
            v = is_max ? fmaxf(v, u) : v + u;
        }
        __syncthreads();  // red[] free from the previous reduction
        if (lane == 0) red[warp] = v;
        __syncthreads();
        v = red[0];
        for (int w = 1; w < kSoftmaxThreads / 32; ++w) v = is_max ? fmaxf(v, red[w]) : v + red[w];
        return v;
    };
    if constexpr (Cached) {
        float v[kSoftmaxPer];
        float m = -FLT_MAX;
#pragma unroll
        for (int k = 0; k < kSoftmaxPer; ++k) {
            const int64_t j = tid + int64_t{k} * kSoftmaxThreads;
            v[k] = j < Ls && slot_visible(k0 + j, p, top, cap, wrapped, window) ? x[j] : -FLT_MAX;
            m = fmaxf(m, v[k]);
        }
        m = block_reduce(m, true);
        float l = 0.0f;
#pragma unroll
        for (int k = 0; k < kSoftmaxPer; ++k) {
            v[k] = v[k] == -FLT_MAX ? 0.0f : expf(v[k] - m);
            l += v[k];
        }
        const float inv = 1.0f / block_reduce(l, false);
#pragma unroll
        for (int k = 0; k < kSoftmaxPer; ++k) {
            const int64_t j = tid + int64_t{k} * kSoftmaxThreads;
            if (j < Ls) put(j, v[k] * inv);
        }
    } else {
        float m = -FLT_MAX;
        for (int64_t j = tid; j < Ls; j += kSoftmaxThreads)
            if (slot_visible(k0 + j, p, top, cap, wrapped, window)) m = fmaxf(m, x[j]);
        m = block_reduce(m, true);
        float l = 0.0f;
        for (int64_t j = tid; j < Ls; j += kSoftmaxThreads) {
            const float e = slot_visible(k0 + j, p, top, cap, wrapped, window) ? expf(x[j] - m) : 0.0f;
            x[j] = e;
            l += e;
        }
        const float inv = 1.0f / block_reduce(l, false);
        for (int64_t j = tid; j < Ls; j += kSoftmaxThreads) put(j, x[j] * inv);
    }
}

}  // namespace detail

inline bool attention_gemm_variant(const AttnArgs& a, int n, int64_t pos0, const LabGemm& g, cudaStream_t s) {
    using namespace detail;
    if (a.tok_pos || a.nKV <= 0 || a.nH % a.nKV) return false;  // one sequence's cache only
    const int64_t Ls = std::min<int64_t>(a.cap, pos0 + n);
    const int64_t rows_fit = g.s_floats / Ls;  // query rows of one head the scratch holds
    if (rows_fit < std::min(n, kMinRows)) return false;
    const int nq = static_cast<int>(std::min<int64_t>(n, rows_fit));
    const int hb = static_cast<int>(std::clamp<int64_t>(g.s_floats / (int64_t{nq} * Ls), 1, a.nH));
    const float one = 1.0f, zero = 0.0f;
    // bf16x3 where its split copies fit (keys3: longer key ranges take the fp32 products)
    const bool x3 = g.bf16x3 && Ls <= g.keys3;
    const cublasComputeType_t compute = g.tf32 && !x3 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    const cudaDataType_t in = x3 ? CUDA_R_16BF : CUDA_R_32F;
    const int w = x3 ? 3 : 1;  // the products' contraction is w times as long
    const int ldq = a.nH * a.d * w, ldk = a.nKV * a.d * w, ldv = a.nKV * a.d, ldo = a.nH * a.d;
    if (x3) {
        const int64_t total = (int64_t{n} * a.nH + Ls * a.nKV) * a.d;
        launch_kernel(attn_split3_kernel,
                      dim3(static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 8192))), dim3(256), 0,
                      s, a, n, Ls, g.q3, g.k3, g.v3);
        CUDA_CHECK_LAUNCH();
    }
    // Causal row blocks (block_rows = R, fp32 / TF32 products, while the slots are the
    // positions): each block of R query rows takes only the keys its rows can see, [its first row's window
    // start, its last row's position], so the masked half of the chunk's own square is not computed.
    const bool blocks = g.block_rows > 0 && !x3 && pos0 + n <= a.cap;
    const int step = blocks ? std::min(nq, g.block_rows) : nq;
    void** p = g.ptrs;
    for (int q0 = 0; q0 < n; q0 += step) {
        const int rows = std::min(step, n - q0);
        int64_t k0 = 0, kl = Ls;  // the block's first key slot and its key count
        if (blocks) {
            const int64_t first = pos0 + q0;
            k0 = a.window > 0 ? std::max<int64_t>(0, first - a.window + 1) : 0;
            kl = first + rows - k0;
        }
        const int hbb =
            blocks ? static_cast<int>(std::clamp<int64_t>(g.s_floats / (int64_t{rows} * kl), 1, a.nH)) : hb;
        const int ls = static_cast<int>(kl);
        for (int h0 = 0; h0 < a.nH; h0 += hbb) {
            const int heads = std::min(hbb, a.nH - h0);
            if (x3)
                launch_kernel(attn_gemm_ptrs3_kernel, dim3((heads + 63) / 64), dim3(64), 0, s, a, q0, rows,
                              h0, heads, Ls, g.s, g.q3, g.k3, g.v3, g.p3, p);
            else
                launch_kernel(attn_gemm_ptrs_kernel, dim3((heads + 63) / 64), dim3(64), 0, s, a, q0, rows, h0,
                              heads, k0, kl, g.s, p);
            CUDA_CHECK_LAUNCH();
            // row-major S[t][j] = sum_c Q[t][c] K[j][c]: column-major S^T (Ls x rows) = K^T(op T) Q^T
            CUBLAS_CHECK(cublasGemmBatchedEx(g.blas, CUBLAS_OP_T, CUBLAS_OP_N, ls, rows, a.d * w, &one, p, in,
                                             ldk, p + heads, in, ldq, &zero, p + 2 * heads, CUDA_R_32F, ls,
                                             heads, compute, CUBLAS_GEMM_DEFAULT));
            const dim3 grid(static_cast<unsigned>(int64_t{heads} * rows));
            uint16_t* p3 = x3 ? g.p3 : nullptr;
            if (kl <= int64_t{kSoftmaxThreads} * kSoftmaxPer)
                launch_kernel(attn_gemm_softmax_kernel<true>, grid, dim3(kSoftmaxThreads), 0, s, g.s, kl,
                              rows, q0, pos0, n, a.cap, a.window, p3, k0);
            else
                launch_kernel(attn_gemm_softmax_kernel<false>, grid, dim3(kSoftmaxThreads), 0, s, g.s, kl,
                              rows, q0, pos0, n, a.cap, a.window, p3, k0);
            CUDA_CHECK_LAUNCH();
            // row-major O[t][c] = sum_j P[t][j] V[j][c]: column-major O^T (d x rows) = V^T P^T
            CUBLAS_CHECK(cublasGemmBatchedEx(g.blas, CUBLAS_OP_N, CUBLAS_OP_N, a.d, rows, ls * w, &one,
                                             p + 3 * heads, in, ldv, p + 4 * heads, in, ls * w, &zero,
                                             p + 5 * heads, CUDA_R_32F, ldo, heads, compute,
                                             CUBLAS_GEMM_DEFAULT));
        }
    }
    return true;
}

}  // namespace attn_lab
