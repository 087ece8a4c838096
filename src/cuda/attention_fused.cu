// One-token decode attention with the q/k/v post-processing folded in (MARKBASE_CUDA_ATTN_FUSED=1): the q
// and k RMS norms, RoPE, the v norm and the cache write (qkv_post in norm_rope.cu) and the attention pieces
// with their merge (attention.cu's v2) as one launch that reads the raw q/k/v projections.
//
// Why (bench/NOTES.md, session 5): in the E2B graph step the attention launch costs 10.4 us and qk_norm_rope
// 2.2 us per layer (MARKBASE_CUDA_SKIP), against ~6 KB of keys per head at a 200-token context: the time is a
// chain of dependent loads after the PDL wait (q, the keys, the values, the partials), one block per q head,
// each reading its group's keys again. Here:
// - one block per (piece, KV head) serves all G = nH / nKV query heads of the group, so each key and value
//   row is read once per piece, not G times;
// - the piece's first tile of keys and values (positions before the current one, written by earlier steps
//   or, on KV-shared layers, by an earlier layer of this step) is copied into shared memory with cp.async
//   BEFORE the PDL wait, while the q/k/v GEMV is still finishing; the next tile is in flight while one is
//   computed;
// - the current position's key and value come from the raw projections through the norms in shared memory;
//   the block whose piece holds the current position also writes them to the cache (ring slot pos % cap);
// - a single active piece writes the output directly; otherwise the last piece to finish merges (a ticket
//   per KV head).
// Same math as qkv_post + attention (GEMMA4.md 2.5): q = rope(rmsnorm(q) * q_norm), k = rope(rmsnorm(k) *
// k_norm), v = rmsnorm(v) (no scale), scores q.k (scale 1), softmax over the window, no softcap.
#include <cfloat>

#include "cuda/check.h"
#include "cuda/device_common.cuh"
#include "cuda/kernels.h"
#include "cuda/launch.h"

namespace markbase::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxG = 8;           // query heads per KV head (Gemma 4: 2, 4 or 8)
constexpr int kMaxD = 512;         // head dim
constexpr int kTileFloats = 4096;  // keys per tile x head dim (16 KB of keys, 16 KB of values per stage)
constexpr int kMaxTile = 32;       // keys per tile (one per lane in the softmax)
constexpr int kDimsPerThread = kMaxD / kThreads;

__host__ __device__ constexpr int tile_keys(int d) {
    return kTileFloats / d < kMaxTile ? kTileFloats / d : kMaxTile;
}

// Shared memory, in floats: q [G][d], K and V stages [2][T][d] each, the new key and value [d] each, scores
// [G][T], per head (m, l, corr) [G][3], merge factors [G][nsplit].
struct SmemLayout {
    int q, k, v, knew, vnew, sc, ml, fs, total;
};
__host__ __device__ inline SmemLayout smem_layout(int G, int d, int nsplit) {
    const int T = tile_keys(d);
    SmemLayout s;
    s.q = 0;
    s.k = s.q + G * d;
    s.v = s.k + 2 * T * d;
    s.knew = s.v + 2 * T * d;
    s.vnew = s.knew + d;
    s.sc = s.vnew + d;
    s.ml = s.sc + G * T;
    s.fs = s.ml + 3 * G;
    s.total = s.fs + G * nsplit;
    return s;
}

__device__ __forceinline__ void cp_async16(float* smem, const float* gmem) {
    const unsigned int s = static_cast<unsigned int>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Copies keys and values [ts, ts + cnt) of KV head g into stage buffers (skipping the current position
// `skip`, whose row in the cache is not written yet), one 16-byte chunk per thread per step.
__device__ __forceinline__ void load_tile(const AttnArgs& a, int g, int64_t ts, int cnt, int64_t skip,
                                          float* ks, float* vs) {
    const int d4 = a.d / 4, chunks = cnt * d4;
    for (int c = threadIdx.x; c < chunks; c += kThreads) {
        const int j = c / d4, col = (c - j * d4) * 4;
        const int64_t key = ts + j;
        if (key == skip) continue;
        const int64_t row = ((key % a.cap) * a.nKV + g) * a.d + col;
        cp_async16(ks + j * a.d + col, a.k_cache + row);
        cp_async16(vs + j * a.d + col, a.v_cache + row);
    }
    cp_async_commit();
}

// RMS-normalises src[0, d) (times w when given) into dst in shared memory, then rotates the pairs (j, j +
// d/2) by pos * inv_freq[j] when inv_freq is given. One warp; dst is complete when it returns (__syncwarp).
__device__ void norm_rope_warp(const float* src, const bf16* w, const float* inv_freq, float fpos, float eps,
                               int d, float* dst) {
    const int lane = threadIdx.x & 31;
    float ss = 0.0f;
    for (int j = lane; j < d; j += 32) {
        const float v = src[j];
        dst[j] = v;
        ss = fmaf(v, v, ss);
    }
    ss = warp_sum(ss);
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
    __syncwarp();
    for (int j = lane; j < d; j += 32) dst[j] = w ? dst[j] * inv * bf16_at(w, j) : dst[j] * inv;
    __syncwarp();
    if (!inv_freq) return;
    const int half = d / 2;
    for (int j = lane; j < half; j += 32) {
        const float ang = fpos * inv_freq[j];
        const float c = cosf(ang), s = sinf(ang);
        const float x0 = dst[j], x1 = dst[j + half];
        dst[j] = x0 * c - x1 * s;
        dst[j + half] = x1 * c + x0 * s;
    }
    __syncwarp();
}

__global__ void __launch_bounds__(kThreads) attn_fused_kernel(const AttnArgs a, const QkvPost p) {
    extern __shared__ float4 smem4[];
    float* sm = reinterpret_cast<float*>(smem4);
    __shared__ bool last_piece;
    const int sp = blockIdx.x, g = blockIdx.y, d = a.d, G = a.nH / a.nKV;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const SmemLayout L = smem_layout(G, d, a.nsplit);
    const int T = tile_keys(d);

    // Before the wait: the position (advanced by the previous step), this piece's range, its first tile.
    const int64_t pos = static_cast<int64_t>(a.pos_base[0]);
    const int64_t lo = a.window > 0 ? max(static_cast<int64_t>(0), pos - a.window + 1) : 0;
    const int64_t split_len = max(static_cast<int64_t>(a.min_split), (pos - lo + a.nsplit) / a.nsplit);
    const int active =
        static_cast<int>(min(static_cast<int64_t>(a.nsplit), (pos - lo + split_len) / split_len));
    if (sp >= active) return;  // holds no keys (exiting counts as the PDL trigger)
    const int64_t start = lo + static_cast<int64_t>(sp) * split_len;
    const int64_t end = min(pos + 1, start + split_len);
    const bool own = p.kraw != nullptr;            // this layer writes position pos itself
    const bool holds_new = own && end == pos + 1;  // ... and this piece holds it
    const int64_t skip = holds_new ? pos : -1;
    load_tile(a, g, start, static_cast<int>(min(static_cast<int64_t>(T), end - start)), skip, sm + L.k,
              sm + L.v);

    pdl_wait();  // the q/k/v projections are complete
    pdl_launch_dependents();

    // q of the group's heads (warp h: head g G + h), and the new key and value
    const float fpos = static_cast<float>(pos);
    for (int h = warp; h < G; h += kWarps)
        norm_rope_warp(p.q + static_cast<int64_t>(g * G + h) * d, p.q_norm, p.inv_freq, fpos, p.eps, d,
                       sm + L.q + h * d);
    if (holds_new) {
        const int wk = G % kWarps, wv = (G + 1) % kWarps;  // warps with the fewest heads
        if (warp == wk)
            norm_rope_warp(p.kraw + static_cast<int64_t>(g) * d, p.k_norm, p.inv_freq, fpos, p.eps, d,
                           sm + L.knew);
        if (warp == wv)
            norm_rope_warp(p.vraw + static_cast<int64_t>(g) * d, nullptr, nullptr, fpos, p.eps, d,
                           sm + L.vnew);
    }
    if (tid < G) {
        sm[L.ml + 3 * tid] = -FLT_MAX;  // m
        sm[L.ml + 3 * tid + 1] = 0.0f;  // l
    }
    __syncthreads();
    if (holds_new) {  // the cache row of position pos, for the later steps and the KV-sharing layers
        const int64_t row = ((pos % p.cap) * p.nKV + g) * d;
        for (int j = tid; j < d; j += kThreads) {
            p.k_cache[row + j] = sm[L.knew + j];
            p.v_cache[row + j] = sm[L.vnew + j];
        }
    }

    float acc[kMaxG][kDimsPerThread];
#pragma unroll
    for (int h = 0; h < kMaxG; ++h)
#pragma unroll
        for (int i = 0; i < kDimsPerThread; ++i) acc[h][i] = 0.0f;

    const int d4 = d / 4;
    int stage = 0;
    for (int64_t ts = start; ts < end; ts += T, stage ^= 1) {
        const int cnt = static_cast<int>(min(static_cast<int64_t>(T), end - ts));
        if (ts + T < end) {  // the next tile into the other stage, in flight while this one is computed
            load_tile(a, g, ts + T, static_cast<int>(min(static_cast<int64_t>(T), end - ts - T)), skip,
                      sm + L.k + (stage ^ 1) * T * d, sm + L.v + (stage ^ 1) * T * d);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const float* ks = sm + L.k + stage * T * d;
        const float* vs = sm + L.v + stage * T * d;
        // scores: warp takes keys j = warp, warp + 8, ...; its lanes hold float4 columns of the key
        for (int j = warp; j < cnt; j += kWarps) {
            const float4* k4 = reinterpret_cast<const float4*>(ts + j == skip ? sm + L.knew : ks + j * d);
            float4 kv[kMaxD / 128];
#pragma unroll
            for (int i = 0; i < kMaxD / 128; ++i) {
                const int c = lane + 32 * i;
                kv[i] = c < d4 ? k4[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
            for (int h = 0; h < G; ++h) {
                const float4* q4 = reinterpret_cast<const float4*>(sm + L.q + h * d);
                float s = 0.0f;
#pragma unroll
                for (int i = 0; i < kMaxD / 128; ++i) {
                    const int c = lane + 32 * i;
                    if (c < d4) {
                        const float4 qv = q4[c];
                        s = fmaf(kv[i].x, qv.x, s);
                        s = fmaf(kv[i].y, qv.y, s);
                        s = fmaf(kv[i].z, qv.z, s);
                        s = fmaf(kv[i].w, qv.w, s);
                    }
                }
                s = warp_sum(s);
                if (lane == 0) sm[L.sc + h * T + j] = s;
            }
        }
        __syncthreads();
        // online softmax per head: warp h, one key per lane
        for (int h = warp; h < G; h += kWarps) {
            float* ml = sm + L.ml + 3 * h;
            const float s = lane < cnt ? sm[L.sc + h * T + lane] : -FLT_MAX;
            const float m_old = ml[0], m_new = fmaxf(m_old, warp_max(s));
            const float e = lane < cnt ? expf(s - m_new) : 0.0f;
            const float esum = warp_sum(e);
            if (lane < cnt) sm[L.sc + h * T + lane] = e;
            if (lane == 0) {
                const float corr = __expf(m_old - m_new);
                ml[0] = m_new;
                ml[1] = ml[1] * corr + esum;
                ml[2] = corr;
            }
        }
        __syncthreads();
        // P V: thread owns dims tid + 256 i of every head of the group
#pragma unroll
        for (int h = 0; h < kMaxG; ++h) {
            if (h < G) {
                const float corr = sm[L.ml + 3 * h + 2];
#pragma unroll
                for (int i = 0; i < kDimsPerThread; ++i) acc[h][i] *= corr;
            }
        }
        for (int j = 0; j < cnt; ++j) {
            const float* vrow = ts + j == skip ? sm + L.vnew : vs + j * d;
            float v[kDimsPerThread];
#pragma unroll
            for (int i = 0; i < kDimsPerThread; ++i) {
                const int dim = tid + kThreads * i;
                v[i] = dim < d ? vrow[dim] : 0.0f;
            }
#pragma unroll
            for (int h = 0; h < kMaxG; ++h) {
                if (h < G) {
                    const float pr = sm[L.sc + h * T + j];
#pragma unroll
                    for (int i = 0; i < kDimsPerThread; ++i) acc[h][i] = fmaf(pr, v[i], acc[h][i]);
                }
            }
        }
        __syncthreads();  // the stage and the scores are reused by the tile after next
    }

    // One piece: the output. Otherwise this piece's (o, m, l) per head, and the last piece merges.
    if (active == 1) {
#pragma unroll
        for (int h = 0; h < kMaxG; ++h) {
            if (h < G) {
                const float inv = 1.0f / sm[L.ml + 3 * h + 1];
                float* out = a.out + static_cast<int64_t>(g * G + h) * d;
#pragma unroll
                for (int i = 0; i < kDimsPerThread; ++i) {
                    const int dim = tid + kThreads * i;
                    if (dim < d) out[dim] = acc[h][i] * inv;
                }
            }
        }
        return;
    }
#pragma unroll
    for (int h = 0; h < kMaxG; ++h) {
        if (h < G) {
            const int64_t idx = static_cast<int64_t>(g * G + h) * a.nsplit + sp;
            float* po = a.part_o + idx * d;
#pragma unroll
            for (int i = 0; i < kDimsPerThread; ++i) {
                const int dim = tid + kThreads * i;
                if (dim < d) po[dim] = acc[h][i];
            }
            if (tid == 0) {
                a.part_ml[2 * idx] = sm[L.ml + 3 * h];
                a.part_ml[2 * idx + 1] = sm[L.ml + 3 * h + 1];
            }
        }
    }
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        const unsigned int ticket = atomicAdd(a.merge_counters + g, 1u);
        last_piece = ticket == static_cast<unsigned int>(active) - 1;
    }
    __syncthreads();
    if (!last_piece) return;
    __threadfence();
    // merge: per head the largest m (warp h), each piece's factor exp(m_s - M) and L = sum l_s f_s
    for (int h = warp; h < G; h += kWarps) {
        const int64_t base = static_cast<int64_t>(g * G + h) * a.nsplit;
        float mx = -FLT_MAX;
        for (int s = lane; s < active; s += 32) mx = fmaxf(mx, __ldcg(a.part_ml + 2 * (base + s)));
        mx = warp_max(mx);
        float lsum = 0.0f;
        for (int s = lane; s < active; s += 32) {
            const float f = __expf(__ldcg(a.part_ml + 2 * (base + s)) - mx);
            sm[L.fs + h * a.nsplit + s] = f;
            lsum = fmaf(__ldcg(a.part_ml + 2 * (base + s) + 1), f, lsum);
        }
        lsum = warp_sum(lsum);
        if (lane == 0) sm[L.ml + 3 * h + 1] = lsum;
    }
    __syncthreads();
    for (int o = tid; o < G * d; o += kThreads) {
        const int h = o / d, dim = o - h * d;
        const int64_t base = static_cast<int64_t>(g * G + h) * a.nsplit;
        const float* po = a.part_o + base * d + dim;
        const float* fs = sm + L.fs + h * a.nsplit;
        float v = 0.0f;
#pragma unroll 4
        for (int s = 0; s < active; ++s) v = fmaf(__ldcg(po + static_cast<int64_t>(s) * d), fs[s], v);
        a.out[static_cast<int64_t>(g * G + h) * d + dim] = v / sm[L.ml + 3 * h + 1];
    }
    if (tid == 0) a.merge_counters[g] = 0u;
}

size_t fused_smem(const AttnArgs& a) {
    return static_cast<size_t>(smem_layout(a.nH / a.nKV, a.d, a.nsplit).total) * sizeof(float);
}

}  // namespace

bool attention_fused_supported(const AttnArgs& a, const QkvPost& p) {
    if (a.nKV <= 0 || a.nH % a.nKV != 0 || a.nH / a.nKV > kMaxG) return false;
    if (a.d % 4 != 0 || a.d > kMaxD) return false;
    if (a.tok_pos || a.split_len != 0 || !a.merge_counters || !a.active_only) return false;
    if (p.d != a.d || p.nKV != a.nKV || p.nH != a.nH) return false;
    return fused_smem(a) <= kAttnFusedMaxSmem;
}

void attention_fused_prepare() {
    CUDA_CHECK(cudaFuncSetAttribute(attn_fused_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(kAttnFusedMaxSmem)));
}

void attention_fused(const AttnArgs& a, const QkvPost& p, cudaStream_t s) {
    if (!attention_fused_supported(a, p))
        throw Error("internal: fused decode attention does not take this layer (head dim " +
                    std::to_string(a.d) + ", " + std::to_string(a.nH) + " heads over " +
                    std::to_string(a.nKV) + " KV heads)");
    launch_kernel(attn_fused_kernel, dim3(a.nsplit, a.nKV), dim3(kThreads), fused_smem(a), s, a, p);
    CUDA_CHECK_LAUNCH();
}

}  // namespace markbase::cuda
