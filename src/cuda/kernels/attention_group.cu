// Batched decode's attention pieces (fixed pieces of split_len keys, merged by attention_combine), with the
// G = nH / nKV query heads that share a KV head in one block: each key and value row is read once for the G
// heads instead of once per head. attn_partial_kernel (attention.cu) reads the whole key range again for
// every head of a group. The same operations in the same order per head as attn_partial_kernel (scores over
// c = lane, lane + 32, ... in fmaf order, the tile's max, expf against the running max, values accumulated
// key by key), so the partials are bit-identical to it.
#include <cfloat>

#include "cuda/check.h"
#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"
#include "cuda/kernels/launch.h"

namespace markbase::cuda {

namespace {

constexpr int kThreads = 128;  // == kTile
constexpr int kTile = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxDimsPerThread = 4;  // head dim <= 512

// The online softmax over one scored tile: each row's new running max (warp w takes rows w, w + 4, ...; a
// masked score, -inf, never wins), the rescale of its sums (corr), and its scores exponentiated in place.
template <int R>
__device__ __forceinline__ void group_tile_softmax(float (&sc)[R][kTile], float (&tm)[R], int cnt, int tid,
                                                   int lane, int warp, float (&m)[R], float (&corr)[R]) {
#pragma unroll
    for (int hh = 0; hh < R; ++hh) {
        if (hh % kWarps != warp) continue;
        float v = -FLT_MAX;
        for (int j = lane; j < cnt; j += 32) v = fmaxf(v, sc[hh][j]);
        v = warp_max(v);
        if (lane == 0) tm[hh] = fmaxf(m[hh], v);
    }
    __syncthreads();
#pragma unroll
    for (int hh = 0; hh < R; ++hh) {
        corr[hh] = __expf(m[hh] - tm[hh]);
        m[hh] = tm[hh];
    }
    for (int i = tid; i < R * kTile; i += kThreads) {
        const int hh = i / kTile, j = i - hh * kTile;
        if (j < cnt) sc[hh][j] = expf(sc[hh][j] - tm[hh]);
    }
}

// The tile's values into the R rows' accumulators (thread tid owns dims tid + i kThreads), each value row
// read once for the R heads; lsum: the rows' sums of the tile's weights.
template <int R>
__device__ __forceinline__ void group_tile_values(const AttnArgs& a, const float* v_cache, int g, int64_t ts,
                                                  int cnt, const float (&sc)[R][kTile], int tid, int d,
                                                  const float (&corr)[R], float (&lsum)[R],
                                                  float (&acc)[R][kMaxDimsPerThread]) {
#pragma unroll
    for (int hh = 0; hh < R; ++hh) {
        lsum[hh] = 0.0f;
#pragma unroll
        for (int i = 0; i < kMaxDimsPerThread; ++i) acc[hh][i] *= corr[hh];
    }
#pragma unroll 2
    for (int j = 0; j < cnt; ++j) {
        const float* vp = v_cache + (((ts + j) % a.cap) * a.nKV + g) * d;
        float v[kMaxDimsPerThread];
#pragma unroll
        for (int i = 0; i < kMaxDimsPerThread; ++i) {
            const int dim = tid + i * kThreads;
            v[i] = dim < d ? __ldg(vp + dim) : 0.0f;
        }
#pragma unroll
        for (int hh = 0; hh < R; ++hh) {
            const float p = sc[hh][j];
            lsum[hh] += p;
#pragma unroll
            for (int i = 0; i < kMaxDimsPerThread; ++i) acc[hh][i] = fmaf(p, v[i], acc[hh][i]);
        }
    }
}

// The R rows' partial outputs (row hh: token t + hh / G (= t), head h0 + hh % G (= h0 + hh)).
template <int G>
__device__ __forceinline__ void group_store_o(const AttnArgs& a, const float (&acc)[G][kMaxDimsPerThread],
                                              int n, int t, int h0, int sp, int tid, int d) {
    constexpr int R = G;
#pragma unroll
    for (int hh = 0; hh < R; ++hh) {
        if (t + hh / G >= n) continue;
        float* po = a.part_o + ((static_cast<int64_t>(t + hh / G) * a.nH + h0 + hh % G) * a.nsplit + sp) * d;
#pragma unroll
        for (int i = 0; i < kMaxDimsPerThread; ++i) {
            const int dim = tid + i * kThreads;
            if (dim < d) po[dim] = acc[hh][i];
        }
    }
}

// The R rows' (m, l) (l = 0: an empty piece), by thread 0.
template <int G>
__device__ __forceinline__ void group_store_ml(const AttnArgs& a, const float (&m)[G], const float (&l)[G],
                                               int n, int t, int h0, int sp) {
    constexpr int R = G;
#pragma unroll
    for (int hh = 0; hh < R; ++hh) {
        if (t + hh / G >= n) continue;
        const int64_t idx = (static_cast<int64_t>(t + hh / G) * a.nH + h0 + hh % G) * a.nsplit + sp;
        a.part_ml[2 * idx] = m[hh];
        a.part_ml[2 * idx + 1] = l[hh];
    }
}

// grid (nsplit, nKV, n); dynamic shared memory G d floats (the queries). Row r < G: token blockIdx.z, head
// h0 + r, at the token's own position (tok_pos) in its own sequence slot's cache (tok_slot).
template <int G>
__global__ void __launch_bounds__(kThreads, G <= 2 ? 5 : 4) attn_group_kernel(const AttnArgs a, int n) {
    constexpr int R = G;
    extern __shared__ float4 smem4[];
    float* qs = reinterpret_cast<float*>(smem4);  // [R][d]
    __shared__ float sc[R][kTile];
    __shared__ float tm[R];  // the tile's running max per row
    pdl_begin();
    const int sp = blockIdx.x, g = blockIdx.y, t = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int d = a.d, d4 = d / 4, h0 = g * G;
    const int64_t pos = static_cast<int64_t>(a.tok_pos[t]);
    const int64_t lo = a.window > 0 ? max(static_cast<int64_t>(0), pos - a.window + 1) : 0;
    const int64_t start = lo + static_cast<int64_t>(sp) * a.split_len;
    const int64_t end = min(pos + 1, start + a.split_len);
    const int64_t slot_off = static_cast<int64_t>(a.tok_slot[t]) * a.slot_stride;
    const float *k_cache = a.k_cache + slot_off, *v_cache = a.v_cache + slot_off;
    float m[R], l[R], acc[R][kMaxDimsPerThread];
#pragma unroll
    for (int hh = 0; hh < R; ++hh) {
        m[hh] = -FLT_MAX;
        l[hh] = 0.0f;
#pragma unroll
        for (int i = 0; i < kMaxDimsPerThread; ++i) acc[hh][i] = 0.0f;
    }
    if (start < end) {
        for (int j = tid; j < R * d; j += kThreads) {  // a token's G heads are contiguous
            const int r = j / d, tr = t + r / G;
            qs[j] = tr < n ? a.q[(static_cast<int64_t>(tr) * a.nH + h0 + r % G) * d + (j - r * d)] : 0.0f;
        }
        __syncthreads();
        for (int64_t ts = start; ts < end; ts += kTile) {
            const int cnt = static_cast<int>(min(static_cast<int64_t>(kTile), end - ts));
            // scores: each warp takes 4 consecutive keys at a time, each key row read once for the G heads
            for (int j0 = warp * 4; j0 < cnt; j0 += kWarps * 4) {
                const float4* kp[4];
                float s[R][4];
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const int j = min(j0 + u, cnt - 1);
                    kp[u] = reinterpret_cast<const float4*>(k_cache + (((ts + j) % a.cap) * a.nKV + g) * d);
#pragma unroll
                    for (int hh = 0; hh < R; ++hh) s[hh][u] = 0.0f;
                }
                for (int c = lane; c < d4; c += 32) {
                    float4 kv[4];
#pragma unroll
                    for (int u = 0; u < 4; ++u) kv[u] = __ldg(kp[u] + c);
#pragma unroll
                    for (int hh = 0; hh < R; ++hh) {
                        const float4 qv = smem4[hh * d4 + c];
#pragma unroll
                        for (int u = 0; u < 4; ++u) {
                            s[hh][u] = fmaf(kv[u].x, qv.x, s[hh][u]);
                            s[hh][u] = fmaf(kv[u].y, qv.y, s[hh][u]);
                            s[hh][u] = fmaf(kv[u].z, qv.z, s[hh][u]);
                            s[hh][u] = fmaf(kv[u].w, qv.w, s[hh][u]);
                        }
                    }
                }
#pragma unroll
                for (int hh = 0; hh < R; ++hh)
#pragma unroll
                    for (int u = 0; u < 4; ++u) {
                        const float v = warp_sum(s[hh][u]);
                        if (lane == 0 && j0 + u < cnt) sc[hh][j0 + u] = v;
                    }
            }
            __syncthreads();
            float corr[R], lsum[R];
            group_tile_softmax<R>(sc, tm, cnt, tid, lane, warp, m, corr);
            __syncthreads();
            group_tile_values<R>(a, v_cache, g, ts, cnt, sc, tid, d, corr, lsum, acc);
#pragma unroll
            for (int hh = 0; hh < R; ++hh) l[hh] = l[hh] * corr[hh] + lsum[hh];
            __syncthreads();
        }
        group_store_o<G>(a, acc, n, t, h0, sp, tid, d);
    }
    if (tid == 0) group_store_ml<G>(a, m, l, n, t, h0, sp);
}

template <int G>
void launch_group(const AttnArgs& a, int n, cudaStream_t s) {
    const size_t smem = static_cast<size_t>(G) * a.d * sizeof(float);
    launch_kernel(attn_group_kernel<G>, dim3(a.nsplit, a.nKV, n), dim3(kThreads), smem, s, a, n);
    CUDA_CHECK_LAUNCH();
}

}  // namespace

bool attention_group_pieces(const AttnArgs& a, int n, cudaStream_t s) {
    if (!a.tok_pos || a.split_len <= 0 || a.merge_counters || a.nKV <= 0 || a.nH % a.nKV || a.d % 4 ||
        a.d > kThreads * kMaxDimsPerThread)
        return false;
    // G times fewer blocks: only where they still fill the GPU twice over. A batched decode step has one
    // query per sequence (the H200: the 31B's 16 sequences, 256 and 64 blocks per layer grouped, read 28.30
    // -> 29.33 ms per step; the 26B-A4B's 64, 512 and 128, 25.24 -> 23.12).
    static const int sms = [] {
        int dev = 0, v = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
        return v;
    }();
    if (int64_t{a.nsplit} * a.nKV * n < 2 * int64_t{sms}) return false;
    switch (a.nH / a.nKV) {
        case 2:
            launch_group<2>(a, n, s);
            return true;
        case 4:
            launch_group<4>(a, n, s);
            return true;
        case 8:
            launch_group<8>(a, n, s);
            return true;
        default:
            return false;
    }
}

}  // namespace markbase::cuda
