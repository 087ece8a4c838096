// Prefill attention as cuBLAS GEMMs, over an fp32 cache in fp32, over a bf16 cache with bf16 operands (Q
// rounded, P rounded after the softmax) and fp32 products. The pieces kernels (attention.cu,
// attention_warp.cu) run on CUDA cores, a block per (piece of keys, KV group, tile of tokens) walking its
// keys one at a time: at a 512-token chunk that was 48 of the 31B's 139 ms of prefill for ~0.6 TFLOP of
// products. Here each query head's scores are one GEMM over the chunk's tokens and the layer's key slots, S =
// Q K^T, then a softmax over each row in place with the causal / sliding-window mask computed from the slot's
// position, then O = P V straight into the attention output; all heads in one batched call each (pointer
// arrays: the G heads of a KV group read the same K and V). Products accumulate in fp32 (CUBLAS_COMPUTE_32F).
// Against the pieces: 512-token prefill E2B 26.8k -> 36.2k tok/s, E4B 18.4k -> 23.5k, 31B 3.6k -> 4.4k; 4096
// tokens E2B 15.5k -> 24.4k, 31B 1.8k -> 3.4k. TF32 products, bf16 tensor cores over hi/lo halves (bf16x3)
// and causal row blocks were measured and lost or did not pay; they live in the attention lab
// (bench/kernels/attn_gemm_variants.cuh).
//
// Key slots, not positions: the cache is a ring of `cap` slots (sliding layers: window + chunk), and after it
// wraps the chunk's key range is two runs of slots. Every slot in [0, Ls), Ls = min(cap, pos0 + n), holds the
// latest position of its residue class, which the mask recomputes; a slot outside a query's range scores 0
// after the softmax. The full chunk x Ls rectangle is computed (the masked half of the chunk's own block
// too). A paged layer's slot (kv_cache.h) is first gathered into one contiguous run of rows [0, pos0 + n).
// An e4m3 cache's rows (every layer's) are gathered widened to bf16, exactly, and go the bf16 cache's way.
#include <algorithm>
#include <cfloat>

#include "cuda/check.h"
#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"
#include "cuda/kernels/kv_elems.cuh"
#include "cuda/kernels/launch.h"

namespace markbase::cuda {

namespace {

constexpr int kSoftmaxThreads = 256;
constexpr int kSoftmaxPer = 8;  // a row of <= 2048 keys stays in registers
constexpr int kMinRows = 16;    // the scratch holds at least this many query rows of a head

// The six pointer arrays of one batch of heads [h0, h0 + hb) and query rows [q0, q0 + nq):
// [0] K_g, [1] Q_h, [2] S_i for the scores; [3] V_g, [4] P_i (= S_i), [5] O_h for the output.
// The scores' rows are Ls long. A bf16 cache (KvT uint16_t): the queries are q16's, P_i is bf16 in place.
template <class KvT>
__global__ void attn_gemm_ptrs_kernel(const AttnArgs a, const uint16_t* q16, int q0, int nq, int h0, int hb,
                                      int64_t Ls, float* sc, void** p) {
    pdl_begin();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= hb) return;
    const int h = h0 + i, g = h / (a.nH / a.nKV);
    const int64_t qrow = int64_t{a.nH} * a.d, head = int64_t{h} * a.d;
    const int64_t kv = int64_t{g} * a.d;
    float* s = sc + int64_t{i} * nq * Ls;
    p[i] = const_cast<KvT*>(static_cast<const KvT*>(a.k_cache) + kv);
    if constexpr (sizeof(KvT) == 2)
        p[hb + i] = const_cast<uint16_t*>(q16 + q0 * qrow + head);
    else
        p[hb + i] = const_cast<float*>(a.q + q0 * qrow + head);
    p[2 * hb + i] = s;
    p[3 * hb + i] = const_cast<KvT*>(static_cast<const KvT*>(a.v_cache) + kv);
    p[4 * hb + i] = s;
    p[5 * hb + i] = a.out + q0 * qrow + head;
}

// A bf16 cache: the chunk's queries rounded to bf16, the scores GEMM's other operand.
__global__ void round_queries_kernel(const float* q, int64_t count, uint16_t* q16) {
    pdl_begin();
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
         i += int64_t{gridDim.x} * blockDim.x)
        q16[i] = float_to_bf16_bits(q[i]);
}

// The position held by key slot j (the ring's latest write of j's residue class once it has wrapped), and
// whether the query at position p sees it.
__device__ __forceinline__ bool slot_visible(int64_t j, int64_t p, int64_t top, int64_t cap, bool wrapped,
                                             int window) {
    const int64_t kp = wrapped ? top - (top - j) % cap : j;
    return kp <= p && (window == 0 || kp > p - window);
}

// grid hb * nq rows (head i = row / nq, token q0 + row % nq), kSoftmaxThreads threads; in place:
// S row -> softmax over the visible slots, 0 elsewhere. Cached: the row in registers (Ls <= 2048).
// P16 (a bf16 cache): P as bf16 over the first half of the row's bytes (P's row stride stays the row's
// bytes, 2 Ls bf16), every read of the row before any store that could overlap it.
template <bool Cached, bool P16>
__global__ void __launch_bounds__(kSoftmaxThreads)
    attn_gemm_softmax_kernel(float* sc, int64_t Ls, int nq, int q0, int64_t pos0, int n, int64_t cap,
                             int window) {
    pdl_begin();
    __shared__ float red[kSoftmaxThreads / 32];
    const int64_t row = blockIdx.x;
    float* x = sc + row * Ls;
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
            v[k] = j < Ls && slot_visible(j, p, top, cap, wrapped, window) ? x[j] : -FLT_MAX;
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
            if (j >= Ls) continue;
            if constexpr (P16)
                reinterpret_cast<uint16_t*>(x)[j] = float_to_bf16_bits(v[k] * inv);
            else
                x[j] = v[k] * inv;
        }
    } else {
        float m = -FLT_MAX;
        for (int64_t j = tid; j < Ls; j += kSoftmaxThreads)
            if (slot_visible(j, p, top, cap, wrapped, window)) m = fmaxf(m, x[j]);
        m = block_reduce(m, true);
        float l = 0.0f;
        for (int64_t j = tid; j < Ls; j += kSoftmaxThreads) {
            const float e = slot_visible(j, p, top, cap, wrapped, window) ? expf(x[j] - m) : 0.0f;
            x[j] = e;
            l += e;
        }
        const float inv = 1.0f / block_reduce(l, false);
        if constexpr (P16) {
            // round r's stores cover floats [r 128, r 128 + 128): all read in rounds <= r, before its barrier
            for (int64_t j0 = 0; j0 < Ls; j0 += kSoftmaxThreads) {
                const int64_t j = j0 + tid;
                const float pj = j < Ls ? x[j] * inv : 0.0f;
                __syncthreads();
                if (j < Ls) reinterpret_cast<uint16_t*>(x)[j] = float_to_bf16_bits(pj);
            }
        } else {
            for (int64_t j = tid; j < Ls; j += kSoftmaxThreads) x[j] = x[j] * inv;
        }
    }
}

// A paged layer's rows [0, rows) of its slot (the table pointer is the slot's row), K then V, into `out`:
// 16 bytes per thread.
__global__ void gather_rows_kernel(const AttnArgs a, int64_t rows, int64_t row_bytes, char* out) {
    pdl_begin();
    const int64_t per_row = row_bytes / 16, total = 2 * rows * per_row;
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
         i += int64_t{gridDim.x} * blockDim.x) {
        const int64_t which = i / (rows * per_row), j = i % (rows * per_row), r = j / per_row,
                      c = j % per_row;
        const char* base = static_cast<const char*>(which ? a.v_cache : a.k_cache);
        reinterpret_cast<uint4*>(out)[i] =
            reinterpret_cast<const uint4*>(base + kv_row(a, 0, r) * row_bytes)[c];
    }
}

// An e4m3 cache's rows [0, rows) of its slot (kv_row: a paged layer's table pointer is the slot's row, a
// ring's base its slot's), K then V, widened to bf16 into `out`: 8 values per thread.
__global__ void widen_rows_kernel(const AttnArgs a, int64_t rows, int64_t row_elems, uint4* out) {
    pdl_begin();
    const int64_t per_row = row_elems / 8, total = 2 * rows * per_row;
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
         i += int64_t{gridDim.x} * blockDim.x) {
        const int64_t which = i / (rows * per_row), j = i % (rows * per_row), r = j / per_row,
                      c = j % per_row;
        const uint8_t* base = static_cast<const uint8_t*>(which ? a.v_cache : a.k_cache);
        const uint2 w = __ldg(reinterpret_cast<const uint2*>(base + kv_row(a, 0, r) * row_elems) + c);
        uint32_t o[4];
        const uint32_t words[2] = {w.x, w.y};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const float2 f = fp8x2_to_float2(k & 1 ? words[k >> 1] >> 16 : words[k >> 1] & 0xffffu);
            o[k] = (__float_as_uint(f.x) >> 16) | (__float_as_uint(f.y) & 0xffff0000u);  // exact: e4m3 < bf16
        }
        out[i] = make_uint4(o[0], o[1], o[2], o[3]);
    }
}

// An e4m3 layer as a bf16 cache of its rows [0, rows) (a ring keeps its cap: rows <= cap, slot r at row r).
AttnArgs widen_fp8(const AttnArgs& a, int64_t rows, const AttnGemm& g, cudaStream_t s) {
    const int64_t row_elems = int64_t{a.nKV} * a.d;
    if (!g.gather || row_elems % 8)
        throw Error("internal: prefill attention over an fp8 cache cannot widen it");
    const int64_t vecs = 2 * rows * row_elems / 8;
    launch_kernel(widen_rows_kernel, dim3(static_cast<unsigned>(std::min<int64_t>((vecs + 255) / 256, 4096))),
                  dim3(256), 0, s, a, rows, row_elems, static_cast<uint4*>(g.gather));
    CUDA_CHECK_LAUNCH();
    AttnArgs c = a;
    c.kv = KvElem::kBf16;
    c.k_cache = g.gather;
    c.v_cache = static_cast<uint16_t*>(g.gather) + rows * row_elems;
    if (a.block_table) c.cap = rows;
    c.block_table = nullptr;
    return c;
}

// The paged layer as a one-sequence cache of exactly its rows [0, rows): a gathered into g.gather.
AttnArgs gather_paged(const AttnArgs& a, int64_t rows, const AttnGemm& g, cudaStream_t s) {
    const int64_t row_bytes = int64_t{a.nKV} * a.d * (a.kv == KvElem::kBf16 ? 2 : 4);
    if (!g.gather || row_bytes % 16)
        throw Error("internal: prefill attention over a paged cache cannot gather");
    const int64_t vecs = 2 * rows * row_bytes / 16;
    launch_kernel(gather_rows_kernel,
                  dim3(static_cast<unsigned>(std::min<int64_t>((vecs + 255) / 256, 4096))), dim3(256), 0, s,
                  a, rows, row_bytes, static_cast<char*>(g.gather));
    CUDA_CHECK_LAUNCH();
    AttnArgs c = a;
    c.k_cache = g.gather;
    c.v_cache = static_cast<char*>(g.gather) + rows * row_bytes;
    c.cap = rows;
    c.block_table = nullptr;
    return c;
}

}  // namespace

void attention_gemm(const AttnArgs& args, int n, int64_t pos0, const AttnGemm& g, cudaStream_t s) {
    if (args.tok_pos || args.nKV <= 0 || args.nH % args.nKV)
        throw Error("internal: prefill attention takes one sequence's cache and whole KV groups");
    if (args.kv != KvElem::kF32 && !g.q16)
        throw Error("internal: prefill attention over a bf16 or fp8 cache without its q16");
    if (args.block_table && args.window > 0) throw Error("internal: a paged sliding layer");
    // an fp8 layer: its rows up to the chunk's last (or the ring's), widened; a paged layer (full attention,
    // never a ring): its rows up to the chunk's last, gathered
    const AttnArgs a = args.kv == KvElem::kFp8 ? widen_fp8(args, std::min<int64_t>(args.cap, pos0 + n), g, s)
                       : args.block_table      ? gather_paged(args, pos0 + n, g, s)
                                               : args;
    const int64_t Ls = std::min<int64_t>(a.cap, pos0 + n);
    const int64_t rows_fit = g.s_floats / Ls;  // query rows of one head the scratch holds
    if (rows_fit < std::min(n, kMinRows))
        throw Error("internal: the prefill attention scratch holds " + std::to_string(rows_fit) +
                    " rows of " + std::to_string(Ls) + " keys");
    const int nq = static_cast<int>(std::min<int64_t>(n, rows_fit));
    const int hb = static_cast<int>(std::clamp<int64_t>(g.s_floats / (int64_t{nq} * Ls), 1, a.nH));
    const bool b16 = a.kv == KvElem::kBf16;
    if (b16) {
        const int64_t count = int64_t{n} * a.nH * a.d;
        launch_kernel(round_queries_kernel,
                      dim3(static_cast<unsigned>(std::min<int64_t>((count + 255) / 256, 4096))), dim3(256), 0,
                      s, a.q, count, g.q16);
        CUDA_CHECK_LAUNCH();
    }
    // fp32 cache: fp32 operands throughout; bf16: bf16 K, Q, V and P, fp32 S and O (products in fp32)
    const cudaDataType kv_t = b16 ? CUDA_R_16BF : CUDA_R_32F;
    const float one = 1.0f, zero = 0.0f;
    const int ldq = a.nH * a.d, ldk = a.nKV * a.d, ldv = a.nKV * a.d, ldo = a.nH * a.d;
    const int ls = static_cast<int>(Ls), ldp = b16 ? 2 * ls : ls;
    void** p = g.ptrs;
    for (int q0 = 0; q0 < n; q0 += nq) {
        const int rows = std::min(nq, n - q0);
        for (int h0 = 0; h0 < a.nH; h0 += hb) {
            const int heads = std::min(hb, a.nH - h0);
            const dim3 ptr_grid((heads + 63) / 64);
            if (b16)
                launch_kernel(attn_gemm_ptrs_kernel<uint16_t>, ptr_grid, dim3(64), 0, s, a, g.q16, q0, rows,
                              h0, heads, Ls, g.s, p);
            else
                launch_kernel(attn_gemm_ptrs_kernel<float>, ptr_grid, dim3(64), 0, s, a, g.q16, q0, rows, h0,
                              heads, Ls, g.s, p);
            CUDA_CHECK_LAUNCH();
            // row-major S[t][j] = sum_c Q[t][c] K[j][c]: column-major S^T (Ls x rows) = K^T(op T) Q^T
            CUBLAS_CHECK(cublasGemmBatchedEx(g.blas, CUBLAS_OP_T, CUBLAS_OP_N, ls, rows, a.d, &one, p, kv_t,
                                             ldk, p + heads, kv_t, ldq, &zero, p + 2 * heads, CUDA_R_32F, ls,
                                             heads, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            const dim3 grid(static_cast<unsigned>(int64_t{heads} * rows));
            const bool cached = Ls <= int64_t{kSoftmaxThreads} * kSoftmaxPer;
            auto softmax = [&](auto kernel) {
                launch_kernel(kernel, grid, dim3(kSoftmaxThreads), 0, s, g.s, Ls, rows, q0, pos0, n, a.cap,
                              a.window);
            };
            if (b16)
                cached ? softmax(attn_gemm_softmax_kernel<true, true>)
                       : softmax(attn_gemm_softmax_kernel<false, true>);
            else
                cached ? softmax(attn_gemm_softmax_kernel<true, false>)
                       : softmax(attn_gemm_softmax_kernel<false, false>);
            CUDA_CHECK_LAUNCH();
            // row-major O[t][c] = sum_j P[t][j] V[j][c]: column-major O^T (d x rows) = V^T P^T
            CUBLAS_CHECK(cublasGemmBatchedEx(g.blas, CUBLAS_OP_N, CUBLAS_OP_N, a.d, rows, ls, &one,
                                             p + 3 * heads, kv_t, ldv, p + 4 * heads, kv_t, ldp, &zero,
                                             p + 5 * heads, CUDA_R_32F, ldo, heads, CUBLAS_COMPUTE_32F,
                                             CUBLAS_GEMM_DEFAULT));
        }
    }
}

}  // namespace markbase::cuda
