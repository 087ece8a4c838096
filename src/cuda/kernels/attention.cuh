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

// Batched decode's piece sp of token t (fixed pieces of split_len keys from the window's start): keys
// [start, end) of the token's own slot (start >= end: an empty piece).
struct BatchPiece {
    int64_t start, end;
    int slot;
};
__device__ __forceinline__ BatchPiece batch_piece(const AttnArgs& a, int t, int sp) {
    const int64_t pos = static_cast<int64_t>(a.tok_pos[t]);
    const int64_t lo = a.window > 0 ? max(static_cast<int64_t>(0), pos - a.window + 1) : 0;
    const int64_t start = lo + static_cast<int64_t>(sp) * a.split_len;
    return {start, min(pos + 1, start + a.split_len), a.tok_slot[t]};
}

// A lane's share of a cache row: kMaxDimsPerThread float4 columns (4 values each). An fp32 row gives lane its
// columns lane + 32 i, one 16-byte load each; a bf16 row gives it columns 2 (lane + 32 j) and the one after,
// both from one 16-byte load of 8 values, so the lane issues half the loads for half the bytes (with 8-byte
// loads of 4 bf16 values the one-sequence decode measured 2-6% slower than fp32: docs/performance.md); an
// e4m3 row the same columns from one 8-byte load.
template <class KvT>
__device__ __forceinline__ int lane_col(int lane, int i) {
    if constexpr (sizeof(KvT) < 4)
        return 2 * (lane + 32 * (i >> 1)) + (i & 1);
    else
        return lane + 32 * i;
}
// The lane's columns of row (zero past d4 = d / 4; a bf16 or e4m3 row needs d % 8 == 0), read-only or (CG)
// from L2.
template <class KvT, bool CG = false>
__device__ __forceinline__ void load_lane_row(const KvT* row, int lane, int d4,
                                              float4 (&out)[kMaxDimsPerThread]) {
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if constexpr (sizeof(KvT) == 1) {
#pragma unroll
        for (int j = 0; j < kMaxDimsPerThread / 2; ++j) {
            const int unit = lane + 32 * j;
            if (2 * unit < d4) {
                const uint2* p = reinterpret_cast<const uint2*>(row) + unit;
                const uint2 w = CG ? __ldcg(p) : __ldg(p);
                out[2 * j] = widen4_fp8(w.x);
                out[2 * j + 1] = widen4_fp8(w.y);
            } else {
                out[2 * j] = zero;
                out[2 * j + 1] = zero;
            }
        }
    } else if constexpr (sizeof(KvT) == 2) {
#pragma unroll
        for (int j = 0; j < kMaxDimsPerThread / 2; ++j) {
            const int unit = lane + 32 * j;
            if (2 * unit < d4) {
                const uint4* p = reinterpret_cast<const uint4*>(row) + unit;
                const uint4 w = CG ? __ldcg(p) : __ldg(p);
                out[2 * j] = widen4(make_uint2(w.x, w.y));
                out[2 * j + 1] = widen4(make_uint2(w.z, w.w));
            } else {
                out[2 * j] = zero;
                out[2 * j + 1] = zero;
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < kMaxDimsPerThread; ++i) {
            const int c = lane + 32 * i;
            const float4* p = reinterpret_cast<const float4*>(row) + c;
            out[i] = c < d4 ? (CG ? __ldcg(p) : __ldg(p)) : zero;
        }
    }
}

// sum over the lane's columns of k . q (q staged as float4 columns)
template <class KvT>
__device__ __forceinline__ float lane_dot(const float4 (&k)[kMaxDimsPerThread], const float4* q4, int lane,
                                          int d4) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxDimsPerThread; ++i) {
        const int c = lane_col<KvT>(lane, i);
        if (c < d4) {
            const float4 qv = q4[c];
            s = fmaf(k[i].x, qv.x, s);
            s = fmaf(k[i].y, qv.y, s);
            s = fmaf(k[i].z, qv.z, s);
            s = fmaf(k[i].w, qv.w, s);
        }
    }
    return s;
}

}  // namespace markbase::cuda::attn_kernels
