// The end of a step on the device: the argmax (accumulated by the lm_head GEMV into one 64-bit key) becomes
// the next step's input token, the position advances, and the id is appended to the greedy-decoding output,
// so consecutive graph replays chain without the host. Also the softcap for full-logit prefill, and the
// device-side top-k that sampling uses (topk_select): only k (logit, id) pairs cross the bus per token.
#include <algorithm>
#include <string>

#include "cuda/check.h"
#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"
#include "cuda/kernels/launch.h"

namespace markbase::cuda {

namespace {

__global__ void finish_kernel(const unsigned long long* key, int* state, int advance, int* out_ids,
                              int out_cap) {
    pdl_begin();
    finish_token(*key, state, advance, out_ids, out_cap);
}

__global__ void softcap_kernel(float* x, int64_t n, float cap) {
    pdl_begin();
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        x[i] = cap * tanhf(x[i] / cap);
}

// ---- top-k over the logits row, in the sampler's total order (logit descending, then id ascending) ----
// Keys are argmax_key(logit, id): that order as one unsigned comparison; 0 = no candidate (-inf, padding).
constexpr int kSelThreads = 1024;

// Descending bitonic sort of n (a power of two) keys in shared memory by the whole block.
__device__ void bitonic_desc(unsigned long long* a, int n) {
    for (int k = 2; k <= n; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < n; i += blockDim.x) {
                const int ixj = i ^ j;
                if (ixj > i) {
                    const unsigned long long x = a[i], y = a[ixj];
                    if ((i & k) == 0 ? x < y : x > y) {
                        a[i] = y;
                        a[ixj] = x;
                    }
                }
            }
            __syncthreads();
        }
    }
}

// Stage 1: one block per slice of kTopKSlice logits: penalties (as Sampler's apply_penalties: repeat, then
// presence + frequency * count, one fma), keys, a sort, the slice's best kTopKMax out. info[0] += the finite
// candidates, info[1] |= 1 on NaN or +inf (the host then reports them from the full row).
__device__ __forceinline__ void topk_slice(const float* logits, int V, const int* pen, int n_pen, float rp,
                                           float pp, float fp, unsigned long long* out, int* info,
                                           unsigned slice, unsigned long long* keys, float* red) {
    const int base = slice * kTopKSlice;
    float finite = 0.0f;
    bool bad = false;
    for (int i = threadIdx.x; i < kTopKSlice; i += blockDim.x) {
        const int id = base + i;
        unsigned long long key = 0;
        if (id < V) {
            const float l = logits[id];
            bad |= !(l < INFINITY);
            if (l > -INFINITY && l < INFINITY) key = argmax_key(l, static_cast<uint32_t>(id));
        }
        keys[i] = key;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < n_pen; j += blockDim.x) {  // pen: ids [n_pen], then counts [n_pen]
        const int id = pen[j];
        if (id < base || id >= base + kTopKSlice || id >= V) continue;
        float l = logits[id];
        if (!(l > -INFINITY && l < INFINITY)) continue;  // masked stays masked; NaN/inf are reported above
        l = l > 0.0f ? l / rp : l * rp;
        l -= fmaf(fp, static_cast<float>(pen[n_pen + j]), pp);
        keys[id - base] = l > -INFINITY ? argmax_key(l, static_cast<uint32_t>(id)) : 0ull;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kTopKSlice; i += blockDim.x) finite += keys[i] ? 1.0f : 0.0f;
    finite = block_sum(finite, red);
    if (threadIdx.x == 0) atomicAdd(info, static_cast<int>(finite));
    if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(info + 1, 1);
    bitonic_desc(keys, kTopKSlice);
    for (int i = threadIdx.x; i < kTopKMax; i += blockDim.x) out[slice * kTopKMax + i] = keys[i];
}

// Stage 2: one block sorts the slices' winners (n_in <= kTopKSlice, padded to n2) and keeps the best k.
__device__ __forceinline__ void topk_merge(const unsigned long long* in, int n_in, int n2, int k,
                                           unsigned long long* out, unsigned long long* keys) {
    for (int i = threadIdx.x; i < n2; i += blockDim.x) keys[i] = i < n_in ? in[i] : 0ull;
    __syncthreads();
    bitonic_desc(keys, n2);
    for (int i = threadIdx.x; i < k; i += blockDim.x) out[i] = keys[i];
}

__global__ void __launch_bounds__(kSelThreads)
    topk_slices_kernel(const float* logits, int V, const int* pen, int n_pen, float rp, float pp, float fp,
                       unsigned long long* out, int* info) {
    __shared__ unsigned long long keys[kTopKSlice];
    __shared__ float red[32];
    pdl_begin();
    topk_slice(logits, V, pen, n_pen, rp, pp, fp, out, info, blockIdx.x, keys, red);
}

__global__ void __launch_bounds__(kSelThreads)
    topk_merge_kernel(const unsigned long long* in, int n_in, int n2, int k, unsigned long long* out) {
    __shared__ unsigned long long keys[kTopKSlice];
    pdl_begin();
    topk_merge(in, n_in, n2, k, out, keys);
}

// The same two stages for the rows of a batched step at once: a grid of slices x rows, then a block a row.
__global__ void __launch_bounds__(kSelThreads) topk_rows_slices_kernel(TopkRows a, int V) {
    __shared__ unsigned long long keys[kTopKSlice];
    __shared__ float red[32];
    pdl_begin();
    const int i = blockIdx.y, nb = gridDim.x;
    topk_slice(a.logits + a.row[i] * a.row_stride, V, a.pen + i * a.pen_stride, a.n_pen[i], a.rp[i], a.pp[i],
               a.fp[i], a.slices + int64_t{i} * nb * kTopKMax, a.info + 2 * i, blockIdx.x, keys, red);
}

__global__ void __launch_bounds__(kSelThreads) topk_rows_merge_kernel(TopkRows a, int nb, int n2) {
    __shared__ unsigned long long keys[kTopKSlice];
    pdl_begin();
    const int i = blockIdx.x;
    topk_merge(a.slices + int64_t{i} * nb * kTopKMax, nb * kTopKMax, n2, a.k[i], a.out + i * kTopKMax, keys);
}

// Slices of a vocabulary and the merge's padded count; throws where topk_select cannot take them.
int topk_slices(int V, int k, int& n2) {
    const int nb = (V + kTopKSlice - 1) / kTopKSlice;
    if (V <= 0 || nb * kTopKMax > kTopKSlice || k < 1 || k > kTopKMax)
        throw Error(
            "internal: topk_select supports vocab <= " + std::to_string(kTopKSlice / kTopKMax * kTopKSlice) +
            " and 1 <= k <= " + std::to_string(kTopKMax));
    n2 = 1;
    while (n2 < nb * kTopKMax) n2 <<= 1;
    return nb;
}

}  // namespace

void topk_select(const float* logits, int V, const int* pen, int n_pen, float repeat_penalty,
                 float presence_penalty, float frequency_penalty, int k, unsigned long long* slices,
                 unsigned long long* out, int* info, cudaStream_t s) {
    int n2 = 0;
    const int nb = topk_slices(V, k, n2);
    CUDA_CHECK(cudaMemsetAsync(info, 0, 2 * sizeof(int), s));
    launch_kernel(topk_slices_kernel, dim3(nb), dim3(kSelThreads), 0, s, logits, V, pen, n_pen,
                  repeat_penalty, presence_penalty, frequency_penalty, slices, info);
    CUDA_CHECK_LAUNCH();
    launch_kernel(topk_merge_kernel, dim3(1), dim3(kSelThreads), 0, s, slices, nb * kTopKMax, n2, k, out);
    CUDA_CHECK_LAUNCH();
}

void topk_select_rows(const TopkRows& a, int V, cudaStream_t s) {
    if (a.n < 1 || a.n > kTopKRowsMax)
        throw Error("internal: topk_select_rows of " + std::to_string(a.n) + " rows (1 to " +
                    std::to_string(kTopKRowsMax) + ")");
    int n2 = 0, nb = 0;
    for (int i = 0; i < a.n; ++i) nb = topk_slices(V, a.k[i], n2);
    CUDA_CHECK(cudaMemsetAsync(a.info, 0, 2 * sizeof(int) * a.n, s));
    launch_kernel(topk_rows_slices_kernel, dim3(nb, a.n), dim3(kSelThreads), 0, s, a, V);
    CUDA_CHECK_LAUNCH();
    launch_kernel(topk_rows_merge_kernel, dim3(a.n), dim3(kSelThreads), 0, s, a, nb, n2);
    CUDA_CHECK_LAUNCH();
}

void finish_step(const unsigned long long* argmax_key, int* state, int advance, int* out_ids, int out_cap,
                 cudaStream_t s) {
    launch_kernel(finish_kernel, dim3(1), dim3(1), 0, s, argmax_key, state, advance, out_ids, out_cap);
    CUDA_CHECK_LAUNCH();
}

namespace {

// One block per row: the largest argmax_key (value, then the lower id) over the row.
__global__ void argmax_rows_kernel(const float* logits, int64_t V, int* out) {
    __shared__ unsigned long long best_s[32];
    pdl_begin();
    const float* row = logits + static_cast<int64_t>(blockIdx.x) * V;
    unsigned long long best = 0;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
        const unsigned long long k = argmax_key(row[i], static_cast<uint32_t>(i));
        best = k > best ? k : best;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned long long other = __shfl_xor_sync(0xffffffffu, best, o);
        best = other > best ? other : best;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) best_s[warp] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w)
            best = best_s[w] > best ? best_s[w] : best;
        best = best_s[0] > best ? best_s[0] : best;
        out[blockIdx.x] =
            best ? static_cast<int>(0xffffffffu - static_cast<uint32_t>(best & 0xffffffffull)) : 0;
    }
}

}  // namespace

void argmax_rows(const float* logits, int rows, int64_t V, int* out, cudaStream_t s) {
    if (rows <= 0) return;
    launch_kernel(argmax_rows_kernel, dim3(rows), dim3(1024), 0, s, logits, V, out);
    CUDA_CHECK_LAUNCH();
}

void softcap_inplace(float* logits, int64_t n, float cap, cudaStream_t s) {
    const int64_t blocks = std::min<int64_t>((n + 255) / 256, 8192);
    launch_kernel(softcap_kernel, dim3(static_cast<unsigned>(blocks)), dim3(256), 0, s, logits, n, cap);
    CUDA_CHECK_LAUNCH();
}

}  // namespace markbase::cuda
