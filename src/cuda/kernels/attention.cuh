// What attention.cu (decode's pieces) and attention_batched.cu (batched decode's merge) share: the block
// shape and a piece's geometry over the current key range.
#pragma once

#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"
#include "cuda/kernels/kv_elems.cuh"

namespace markbase::cuda::attn_kernels {

constexpr int kThreads = 128;  // == kTile: one thread per key when exponentiating a tile
constexpr int kTile = 128;
constexpr int kMaxDimsPerThread = 4;  // head dim <= 512

// Decode (split_len 0): the pieces' length, and how many of them hold keys of the current range.
struct PieceGeometry {
    int64_t lo, pos, split_len;
    int active;
};
template <bool Batched = false>
__device__ __forceinline__ PieceGeometry piece_geometry(const AttnArgs& a, int t) {
    PieceGeometry g;
    g.pos = Batched ? static_cast<int64_t>(a.tok_pos[t]) : static_cast<int64_t>(a.pos_base[0]) + t;
    g.lo = a.window > 0 ? max(static_cast<int64_t>(0), g.pos - a.window + 1) : 0;
    const int64_t range = g.pos - g.lo + 1;
    g.split_len = a.split_len > 0
                      ? a.split_len
                      : max(static_cast<int64_t>(a.min_split), (g.pos - g.lo + a.nsplit) / a.nsplit);
    g.active = static_cast<int>(min(static_cast<int64_t>(a.nsplit), (range + g.split_len - 1) / g.split_len));
    if (a.split_len > 0) g.active = a.nsplit;
    return g;
}

// The dot products of 4 keys (cache rows of KvT) with the staged query, a lane's float4 columns c = lane,
// lane + 32, ...
template <class KvT>
__device__ __forceinline__ void dot4_keys(const KvT* (&kp)[4], const float4* q4, int lane, int d4,
                                          float (&s)[4]) {
    for (int c = lane; c < d4; c += 32) {
        const float4 qv = q4[c];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const float4 kv = kv_load4(kp[u], c);
            s[u] = fmaf(kv.x, qv.x, s[u]);
            s[u] = fmaf(kv.y, qv.y, s[u]);
            s[u] = fmaf(kv.z, qv.z, s[u]);
            s[u] = fmaf(kv.w, qv.w, s[u]);
        }
    }
}

}  // namespace markbase::cuda::attn_kernels
