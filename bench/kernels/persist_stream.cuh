// Variant S of the persistent-step lab (included by persist_lab.cu, inside its anonymous namespace, after
// Layer, Bufs, wait_for and now_ns): the weights streamed through a ring of shared-memory stages by one
// producer thread that never waits for the activations, only for a free stage.
//
// Why: the H200 runs measured a floor of ~2.3 us per dependent phase (a PDL launch, or a grid barrier, plus
// the first loads after it), 9-11 phases per E2B layer, against ~25 us of weight bytes per layer. Variant C
// loaded only a warp's first batch of the next phase before the barrier, in registers. Here the DRAM stream
// runs ahead across phase boundaries by up to the ring's size (Stages x StageBytes per SM, 150-200 KB, ~5 us
// of one SM's share of the bandwidth), because a weight's address never depends on the activations. The
// consumers (8 warps) still wait at every grid barrier, but while they do the ring fills.
//
// Work split: phase p of layer l is one matrix (or the gate/up pair) of rows x K; block b owns rows
// [b * rows / G, (b + 1) * rows / G), which are contiguous in memory, so its share is one byte range (two for
// the pair) copied in StageBytes pieces by cp.async.bulk, completing on the stage's mbarrier. A unit is 256
// columns of one row (512 bytes; every K here is a multiple of 256): one warp's dot, whose sum is kept per
// unit in shared memory and added per row in order after the phase, so the result does not depend on timing.
// The residual updates are folded into the next phase's staging as in D (6 grid barriers per layer).
//
// Template: Stages x StageBytes (the ring), CW consumer warps, Way: how the warps share a stage's units.
//   0 (S, run 1)  units warp, warp + CW, ...: one warp sum per unit
//   1 (S2)        a contiguous run of units per warp; a row's units summed in the lanes, one warp sum per row
//                 met in the run
//   2 (S3)        warp w owns the rows r = w (mod CW) of the block's share and sums each over the stages it
//                 spans: one warp sum per row, no partials to add after the phase; also the next fold's norm
//                 weights are copied (cp.async) into shared memory before the grid barrier instead of read
//                 after it (they never depend on it; run 3 held them in registers, which put their DRAM
//                 latency in front of the barrier's arrival, since a warp stalls at the first use)
//   3 (S4)        2, with lane l's 8 columns of a unit at 4l and 128 + 4l (two 8-byte weight reads, x read
//                 as contiguous float4s) instead of at 8l: no shared-memory bank conflicts on x
//                 With b.stamps, block 0 records per phase the end of its
// staging, of its consumption, of its epilogue and of the grid barrier; with b.stats, every block counts the
// stage waits that found the stage not ready (producer: no free stage; consumers: no full stage).
namespace stream {

constexpr int kUnit = 256;  // columns per unit
constexpr int kMaxPartials =
    1280;  // units of a block's share of one phase (gate/up at I = 12288: 94 x 6 x 2)
constexpr int kPhases = 6;
constexpr int kSubStamps = 4;  // per phase: staged, consumed, epilogue done, barrier passed

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
// Non-blocking: whether the phase of this parity has completed.
__device__ __forceinline__ bool mbar_test(uint64_t* bar, unsigned parity) {
    uint32_t ok;
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, "
        "p;\n}\n"
        : "=r"(ok)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
    return ok != 0;
}
// Potentially blocking for a while (a hardware time limit) before it answers false.
__device__ __forceinline__ bool mbar_try(uint64_t* bar, unsigned parity) {
    uint32_t ok;
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, "
        "p;\n}\n"
        : "=r"(ok)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
    return ok != 0;
}
// Bounded like wait_for: a bug reports (timed_out) instead of hanging the machine. Returns whether the
// phase was incomplete when the wait began (the wait blocked).
__device__ __forceinline__ bool mbar_wait(uint64_t* bar, unsigned parity, int* timed_out) {
    if (mbar_test(bar, parity)) return false;
    const uint64_t t0 = now_ns();
    for (int i = 0; !mbar_try(bar, parity); ++i) {
        if ((i & 1023) == 1023 && (now_ns() - t0 > 2000000000ull || *static_cast<volatile int*>(timed_out))) {
            *timed_out = 1;
            break;
        }
    }
    return true;
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            smem_u32(dst)),
        "l"(src), "r"(bytes), "r"(smem_u32(bar))
        : "memory");
}
// A barrier of the CW consumer warps only (the producer warp never joins one).
template <int CW>
__device__ __forceinline__ void cbar() {
    asm volatile("bar.sync 1, %0;" ::"n"(CW * 32) : "memory");
}
template <int CW>
__device__ __forceinline__ float csum(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) red[warp] = v;
    cbar<CW>();
    float t = lane < CW ? red[lane] : 0.0f;
    t = warp_sum(t);
    cbar<CW>();
    return t;
}
template <int CW>
__device__ __forceinline__ void cgrid_sync(unsigned int* counter, unsigned int n, int* timed_out) {
    cbar<CW>();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(counter, 1u);
        wait_for(counter, n * gridDim.x, timed_out);
    }
    cbar<CW>();
}

struct Phase {
    const bf16* w;
    const bf16* w2;  // the up rows of the gate/up pair, else null
    int rows, K;
};
__device__ __forceinline__ Phase phase_of(const Layer& L, int p) {
    switch (p) {
        case 0:
            return {L.qkv, nullptr, kQKV, kH};
        case 1:
            return {L.o, nullptr, kH, kQ};
        case 2:
            return {L.g, L.u, L.I, kH};
        case 3:
            return {L.d, nullptr, kH, L.I};
        case 4:
            return {L.pg, nullptr, kP, kH};
        default:
            return {L.pp, nullptr, kH, kP};
    }
}
__device__ __forceinline__ void rows_of(int rows, int& r0, int& r1) {
    r0 = static_cast<int>(int64_t{rows} * blockIdx.x / gridDim.x);
    r1 = static_cast<int>(int64_t{rows} * (blockIdx.x + 1) / gridDim.x);
}

// The producer (one thread): every phase's share, in the consumers' order, stage after stage.
template <int Stages, int StageBytes>
__device__ void produce(const Layer* layers, int n_layers, unsigned char* ring, uint64_t* full,
                        uint64_t* empty, int* timed_out, unsigned long long* stats) {
    unsigned it = 0, blocked = 0;
    for (int l = 0; l < n_layers; ++l) {
        for (int p = 0; p < kPhases; ++p) {
            const Phase ph = phase_of(layers[l], p);
            int r0, r1;
            rows_of(ph.rows, r0, r1);
            const int64_t bytes = int64_t{r1 - r0} * ph.K * 2;
            for (int part = 0; part < (ph.w2 ? 2 : 1); ++part) {
                const unsigned char* src =
                    reinterpret_cast<const unsigned char*>((part ? ph.w2 : ph.w) + int64_t{r0} * ph.K);
                for (int64_t off = 0; off < bytes; off += StageBytes, ++it) {
                    const unsigned s = it % Stages, round = it / Stages;
                    if (round > 0) blocked += mbar_wait(&empty[s], (round - 1) & 1, timed_out);
                    const unsigned n = static_cast<unsigned>(min(int64_t{StageBytes}, bytes - off));
                    mbar_expect_tx(&full[s], n);
                    bulk_load(ring + s * StageBytes, src + off, n, &full[s]);
                }
            }
        }
    }
    if (stats) {
        atomicAdd(stats + 0, static_cast<unsigned long long>(blocked));
        atomicAdd(stats + 1, static_cast<unsigned long long>(it));
    }
}

// A warp's dots over units of one stage. Seg: the contiguous units [warp * kSeg, (warp + 1) * kSeg), a row's
// units summed in the lanes, one warp sum per row met (stored at the row's first unit here, zeros at the
// others); else units warp, warp + CW, ..., one warp sum each.
template <int StageBytes, int CW, int Way>
__device__ __forceinline__ void stage_dots(const unsigned char* st, int u0, int n, int upr, const float4* x4,
                                           float* part, uint64_t* empty_bar) {
    constexpr int kUps = StageBytes / (kUnit * 2);
    constexpr int kPer = (kUps + CW - 1) / CW;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float d[kPer];
#pragma unroll
    for (int q = 0; q < kPer; ++q) {
        const int j = Way == 1 ? warp * kPer + q : warp + q * CW;
        d[q] = 0.0f;
        if (j < n) {
            const uint4 w = *reinterpret_cast<const uint4*>(st + j * (kUnit * 2) + lane * 16);
            const int c4 = (((u0 + j) % upr) * kUnit + lane * 8) >> 2;
            d[q] = dot8(w, x4[c4], x4[c4 + 1]);
        }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(empty_bar);  // this warp is done reading the stage
    if constexpr (Way == 1) {
        const int j0 = warp * kPer;
        float acc = 0.0f;
        int first = -1, row = -1;
#pragma unroll
        for (int q = 0; q < kPer; ++q) {
            if (j0 + q < n) {
                const int u = u0 + j0 + q, r = u / upr;
                if (r != row) {
                    if (first >= 0) {
                        acc = warp_sum(acc);
                        if (lane == 0) part[first] = acc;
                    }
                    row = r;
                    first = u;
                    acc = 0.0f;
                } else if (lane == 0) {
                    part[u] = 0.0f;
                }
                acc += d[q];
            }
        }
        if (first >= 0) {
            acc = warp_sum(acc);
            if (lane == 0) part[first] = acc;
        }
    } else {
#pragma unroll
        for (int q = 0; q < kPer; ++q) d[q] = warp_sum(d[q]);
        if (lane == 0) {
#pragma unroll
            for (int q = 0; q < kPer; ++q)
                if (warp + q * CW < n) part[u0 + warp + q * CW] = d[q];
        }
    }
}

// The consumers' product over this block's rows: y[r] = (rows . xs) * inv, then the mode's epilogue.
// Way 2's part of a stage: this warp's rows among the stage's units [u0, u1), a row's running sum in acc
// (carried into the next stage when the row goes on), its warp sum stored at part[row] when it ends.
__device__ __forceinline__ float dot4(const uint2 w, const float4 a) {
    float s = bf16_lo(w.x) * a.x;
    s = fmaf(bf16_hi(w.x), a.y, s);
    s = fmaf(bf16_lo(w.y), a.z, s);
    return fmaf(bf16_hi(w.y), a.w, s);
}
// Way 3's dot of one unit: columns 4l..4l+3 and 128+4l..128+4l+3 of the unit at w (the unit's first
// weight) against x4 (the unit's first float4 of x).
__device__ __forceinline__ float unit_dot_split(const unsigned char* w, const float4* x4, int lane) {
    const uint2 lo = *reinterpret_cast<const uint2*>(w + lane * 8);
    const uint2 hi = *reinterpret_cast<const uint2*>(w + kUnit + lane * 8);
    return dot4(lo, x4[lane]) + dot4(hi, x4[kUnit / 8 + lane]);
}

template <int CW, bool Split>
__device__ __forceinline__ void stage_rows(const unsigned char* st, int u0, int u1, int upr, const float4* x4,
                                           float* part, float& acc) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int rf = u0 / upr;
    for (int r = rf + (warp - rf % CW + CW) % CW; r * upr < u1; r += CW) {
        const int ua = max(u0, r * upr), ub = min(u1, (r + 1) * upr);
        if constexpr (Split) {
            const unsigned char* w = st + (ua - u0) * (kUnit * 2);
            const float4* xr = x4 + (ua - r * upr) * (kUnit / 4);
            float a0 = 0.0f, a1 = 0.0f;
            int u = ua;
            for (; u + 1 < ub; u += 2, w += 2 * kUnit * 2, xr += 2 * kUnit / 4) {
                a0 += unit_dot_split(w, xr, lane);
                a1 += unit_dot_split(w + kUnit * 2, xr + kUnit / 4, lane);
            }
            if (u < ub) a0 += unit_dot_split(w, xr, lane);
            acc += a0 + a1;
            if (ub == (r + 1) * upr) {
                acc = warp_sum(acc);
                if (lane == 0) part[r] = acc;
                acc = 0.0f;
            }
            continue;
        }
        const unsigned char* w = st + (ua - u0) * (kUnit * 2) + lane * 16;
        const float4* xr = x4 + (((ua - r * upr) * kUnit + lane * 8) >> 2);
        float a0 = 0.0f, a1 = 0.0f;
        int u = ua;
        for (; u + 1 < ub; u += 2, w += 2 * kUnit * 2, xr += 2 * kUnit / 4) {
            const uint4 w0 = *reinterpret_cast<const uint4*>(w);
            const uint4 w1 = *reinterpret_cast<const uint4*>(w + kUnit * 2);
            a0 += dot8(w0, xr[0], xr[1]);
            a1 += dot8(w1, xr[kUnit / 4], xr[kUnit / 4 + 1]);
        }
        if (u < ub) a0 += dot8(*reinterpret_cast<const uint4*>(w), xr[0], xr[1]);
        acc += a0 + a1;
        if (ub == (r + 1) * upr) {
            acc = warp_sum(acc);
            if (lane == 0) part[r] = acc;
            acc = 0.0f;
        }
    }
}

template <int Stages, int StageBytes, int CW, int Way>
__device__ void consume(const Phase& ph, int mode, const float* xs, float inv, float* y, const float* aux,
                        const unsigned char* ring, uint64_t* full, uint64_t* empty, unsigned& it,
                        float* partials, int* timed_out, unsigned& blocked, unsigned long long* stamp_at) {
    constexpr int kUps = StageBytes / (kUnit * 2);  // units per full stage
    int r0, r1;
    rows_of(ph.rows, r0, r1);
    const int upr = ph.K / kUnit, nu = (r1 - r0) * upr;
    const float4* x4 = reinterpret_cast<const float4*>(xs);
    const int nr = r1 - r0;
    for (int part = 0; part < (ph.w2 ? 2 : 1); ++part) {
        float acc = 0.0f;  // (Way 2) the open row's running sum in this lane
        for (int u0 = 0; u0 < nu; u0 += kUps, ++it) {
            const unsigned s = it % Stages, round = it / Stages;
            blocked += mbar_wait(&full[s], round & 1, timed_out);
            if constexpr (Way >= 2) {
                stage_rows<CW, Way == 3>(ring + s * StageBytes, u0, min(nu, u0 + kUps), upr, x4,
                                         partials + part * nr, acc);
                __syncwarp();
                if ((threadIdx.x & 31) == 0) mbar_arrive(&empty[s]);
            } else {
                stage_dots<StageBytes, CW, Way>(ring + s * StageBytes, u0, min(kUps, nu - u0), upr, x4,
                                                partials + part * nu, &empty[s]);
            }
        }
    }
    cbar<CW>();
    if (stamp_at) stamp_at[0] = now_ns();
    if constexpr (Way >= 2) {  // one sum per row already
        for (int r = threadIdx.x; r < nr; r += CW * 32) {
            const float a = partials[r] * inv;
            if (mode == kStore)
                y[r0 + r] = a;
            else if (mode == kGeglu)
                y[r0 + r] = gelu_tanh(a) * (partials[nr + r] * inv);
            else
                y[r0 + r] = gelu_tanh(a) * aux[r0 + r];
        }
    } else {
        for (int r = threadIdx.x; r < nr; r += CW * 32) {
            float a = 0.0f;
            for (int k = 0; k < upr; ++k) a += partials[r * upr + k];
            a *= inv;
            if (mode == kStore) {
                y[r0 + r] = a;
            } else if (mode == kGeglu) {
                float b = 0.0f;
                for (int k = 0; k < upr; ++k) b += partials[nu + r * upr + k];
                y[r0 + r] = gelu_tanh(a) * (b * inv);
            } else {
                y[r0 + r] = gelu_tanh(a) * aux[r0 + r];
            }
        }
    }
}

// xs = src (times nw when given), every load issued before the first store; returns src's RMSNorm scale
// when norm, else 1. src was written by other blocks in this kernel: read from L2, never a stale L1 line.
template <int CW>
__device__ float cstage(float* xs, const float* src, int K, bool norm, const bf16* nw, float* red) {
    constexpr int kMaxPer = (kMaxK + CW * 32 * 4 - 1) / (CW * 32 * 4);
    float4 v[kMaxPer];
#pragma unroll
    for (int j = 0; j < kMaxPer; ++j) {
        const int k = (threadIdx.x + j * CW * 32) * 4;
        if (k < K) v[j] = __ldcg(reinterpret_cast<const float4*>(src + k));
    }
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxPer; ++j) {
        const int k = (threadIdx.x + j * CW * 32) * 4;
        if (k < K) {
            float4 a = v[j];
            ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
            if (nw) {
                a.x *= bf16_at(nw, k);
                a.y *= bf16_at(nw, k + 1);
                a.z *= bf16_at(nw, k + 2);
                a.w *= bf16_at(nw, k + 3);
            }
            *reinterpret_cast<float4*>(xs + k) = a;
        }
    }
    if (!norm) {
        cbar<CW>();
        return 1.0f;
    }
    ss = csum<CW>(ss, red);  // its barriers also publish xs
    return 1.0f / sqrtf(ss / static_cast<float>(K) + kEps);
}

// D's stage_fold on the consumer warps: xn = (x + RMSNorm(y) * rw) * rscale, kept in xs (times nw when
// given) and stored by block 0 to x_out; returns xn's RMSNorm scale when norm, else 1.
// The next fold's two norm weights (rw, and nw when given) copied into shared memory nws[2][kH] by cp.async
// before the grid barrier (Way >= 2); cfold waits for the copies. 16 bytes per thread, kH / 8 per weight.
template <int CW>
__device__ __forceinline__ void fold_prefetch(bf16* nws, const bf16* rw, const bf16* nw) {
    constexpr int kChunks = kH / 8;
    for (int c = threadIdx.x; c < 2 * kChunks; c += CW * 32) {
        const bf16* src = c < kChunks ? rw + c * 8 : nw ? nw + (c - kChunks) * 8 : nullptr;
        if (!src) continue;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(nws + c * 8)), "l"(src)
                     : "memory");
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int CW>
__device__ float cfold(float* xs, const float* x, const float* y, const bf16* rw, float rscale, float* x_out,
                       bool norm, const bf16* nw, float* red, const bf16* nws = nullptr) {
    constexpr int kPer = (kH + CW * 32 - 1) / (CW * 32);
    float yv[kPer], xv[kPer];
    // nws: rw and nw already copied there by fold_prefetch (this thread's copies done here, everyone's by the
    // first block sum's barriers, before they are read)
    if (nws) asm volatile("cp.async.wait_all;" ::: "memory");
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        const int k = threadIdx.x + j * CW * 32;
        yv[j] = k < kH ? __ldcg(y + k) : 0.0f;
        xv[j] = k < kH ? __ldcg(x + k) : 0.0f;
        ss = fmaf(yv[j], yv[j], ss);
    }
    ss = csum<CW>(ss, red);
    const float inv_y = 1.0f / sqrtf(ss / static_cast<float>(kH) + kEps);
    float sx = 0.0f;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        const int k = threadIdx.x + j * CW * 32;
        if (k < kH) {
            const float xn = (xv[j] + yv[j] * inv_y * bf16_at(nws ? nws : rw, k)) * rscale;
            sx = fmaf(xn, xn, sx);
            if (blockIdx.x == 0) x_out[k] = xn;
            xs[k] = nw ? xn * bf16_at(nws ? nws + kH : nw, k) : xn;
        }
    }
    if (!norm) {
        cbar<CW>();
        return 1.0f;
    }
    sx = csum<CW>(sx, red);
    return 1.0f / sqrtf(sx / static_cast<float>(kH) + kEps);
}

template <int Stages, int StageBytes>
constexpr size_t smem_bytes() {
    return size_t{Stages} * StageBytes + (size_t{kMaxK} + kMaxPartials) * sizeof(float) +
           2 * kH * sizeof(bf16);
}

// One block per SM (cooperative launch), CW + 1 warps: warps 0..CW-1 consume, warp CW's lane 0 produces.
template <int Stages, int StageBytes, int CW, int Way>
__global__ void __launch_bounds__((CW + 1) * 32, 1)
    streamed_kernel(const Layer* __restrict__ layers, int n_layers, Bufs b) {
    static_assert(StageBytes % (kUnit * 2) == 0, "a stage holds whole units");
    static_assert(Way != 1 || (StageBytes / (kUnit * 2)) % CW == 0, "Way 1: equal runs of units per warp");
    extern __shared__ float4 smem4[];
    unsigned char* ring = reinterpret_cast<unsigned char*>(smem4);
    float* xs = reinterpret_cast<float*>(ring + size_t{Stages} * StageBytes);
    float* partials = xs + kMaxK;
    bf16* nws = reinterpret_cast<bf16*>(partials + kMaxPartials);  // [2][kH]: the next fold's norm weights
    __shared__ uint64_t full[Stages], empty[Stages];
    __shared__ float red[32];
    if (threadIdx.x == 0) {
        for (int s = 0; s < Stages; ++s) {
            mbar_init(&full[s], 1);    // the producer's expect_tx arrival (and the bytes)
            mbar_init(&empty[s], CW);  // one arrival per consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x >= CW * 32) {  // the producer warp; it never waits on the consumers' barriers
        if (threadIdx.x == CW * 32)
            produce<Stages, StageBytes>(layers, n_layers, ring, full, empty, b.timed_out, b.stats);
        return;
    }
    float* const x0 = b.x[0];  // (b.x[cur] would index the parameter at run time: a local copy of b)
    float* const x1 = b.x[1];
    unsigned it = 0, nb = 0, blocked = 0;
    unsigned long long* const stamps = b.stamps && blockIdx.x == 0 && threadIdx.x == 0 ? b.stamps : nullptr;
    if (stamps) stamps[0] = now_ns();
    int g = 0;  // phases done
    auto staged = [&] {
        if (stamps) stamps[1 + kSubStamps * g] = now_ns();
    };
    bf16* const pre = Way >= 2 ? nws : nullptr;
    // rw, nw: the norm weights of the fold that follows this phase's barrier (Way >= 2 copies them before it)
    auto run = [&](const Layer& L, int p, int mode, float inv, float* y, const float* aux, const bf16* rw,
                   const bf16* nw) {
        consume<Stages, StageBytes, CW, Way>(phase_of(L, p), mode, xs, inv, y, aux, ring, full, empty, it,
                                             partials, b.timed_out, blocked,
                                             stamps ? stamps + 2 + kSubStamps * g : nullptr);
        if (Way >= 2 && rw) fold_prefetch<CW>(nws, rw, nw);
        if (stamps) stamps[3 + kSubStamps * g] = now_ns();
        cgrid_sync<CW>(b.counter, ++nb, b.timed_out);
        if (stamps) stamps[4 + kSubStamps * g] = now_ns();
        ++g;
    };
    int cur = 0;
    auto xc = [&] { return cur ? x1 : x0; };
    auto xo = [&] { return cur ? x0 : x1; };
    for (int l = 0; l < n_layers; ++l) {
        const Layer& L = layers[l];
        const bool more = l + 1 < n_layers;
        float inv;
        if (l > 0) {
            const Layer& P = layers[l - 1];
            inv = cfold<CW>(xs, xc(), b.o2, P.n_pp, P.scalar, xo(), true, L.n_in, red, pre);
            cur ^= 1;
        } else {
            inv = cstage<CW>(xs, xc(), kH, true, L.n_in, red);
        }
        staged();
        run(L, 0, kStore, inv, b.qkv, nullptr, nullptr, nullptr);
        cstage<CW>(xs, b.qkv, kQ, false, nullptr, red);
        staged();
        run(L, 1, kStore, 1.0f, b.o, nullptr, L.n_pa, L.n_pf);
        inv = cfold<CW>(xs, xc(), b.o, L.n_pa, 1.0f, xo(), true, L.n_pf, red, pre);
        cur ^= 1;
        staged();
        run(L, 2, kGeglu, inv, b.g, nullptr, nullptr, nullptr);
        cstage<CW>(xs, b.g, L.I, false, nullptr, red);
        staged();
        run(L, 3, kStore, 1.0f, b.m, nullptr, L.n_ffn, nullptr);
        inv = cfold<CW>(xs, xc(), b.m, L.n_ffn, 1.0f, xo(), false, nullptr, red, pre);
        cur ^= 1;
        staged();
        run(L, 4, kGeluMul, inv, b.p, L.ple, nullptr, nullptr);
        cstage<CW>(xs, b.p, kP, false, nullptr, red);
        staged();
        run(L, 5, kStore, 1.0f, b.o2, nullptr, more ? L.n_pp : nullptr, more ? layers[l + 1].n_in : nullptr);
    }
    if (blockIdx.x == 0) {  // the last layer's update, and the stream back in x[0]
        const Layer& P = layers[n_layers - 1];
        cfold<CW>(xs, xc(), b.o2, P.n_pp, P.scalar, x0, false, nullptr, red);
    }
    if (b.stats && (threadIdx.x & 31) == 0) atomicAdd(b.stats + 2, static_cast<unsigned long long>(blocked));
}

}  // namespace stream
