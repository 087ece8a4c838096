// Kernel lab for the hot decode op: y = W @ x with W bf16 [N, K] (row-major, HF [out, in]) and x fp32.
// Numbered GPU variants, a correctness gate (poisoned output, every element checked against an fp64 GPU
// reference that is itself spot-checked against a CPU fp64 reference) and a GB/s sweep over every GEMV shape
// that Gemma 4 decodes with (E2B, E4B, 26B-A4B incl. the 8 selected experts, 31B), rotating over enough
// weight copies that the 60 MB L2 cannot serve the reads. cuBLAS (bf16 x bf16 -> fp32 GEMV through GemmEx) is
// the baseline. Two timings per (shape, variant): "solo" (CUDA events around one launch, median of 20) and
// "graph" (>= 20 launches on rotating copies, >= 256 MB of distinct weights, captured as one CUDA graph;
// per-launch time, median of 5 replays: what a decode graph sees, launch gaps included). The per-shape winner
// table and the per-model totals use "graph". The decode step runs v11's layout
// (src/cuda/kernels/gemv_rows.cu, the p rows); src/cuda/kernels/gemv.cu keeps v2 for lm_head. v6..v10 were
// product variants once (their names in the legend printed first); they lost to v11 and live here only.
//   markbase_gemv_lab [--quick] [--only SUBSTRING]
// Weights and x are drawn on the GPU from a counter hash (uniform [-1, 1)), so a full sweep takes seconds.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"
#include "lab_common.cuh"

namespace {

// The device helpers the production kernels use (dot8, warp sums), so lab and backend agree.
using markbase::cuda::dot8;
using markbase::cuda::warp_sum;
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

// v0: one thread per row, scalar loads (the obviously-correct GPU baseline).
__global__ void v0_kernel(const uint16_t* W, const float* x, float* y, int N, int K) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= N) return;
    float s = 0;
    for (int k = 0; k < K; ++k)
        s += __uint_as_float(static_cast<uint32_t>(W[static_cast<int64_t>(row) * K + k]) << 16) * x[k];
    y[row] = s;
}

// v1: one warp per row, 16-byte __ldg loads, x read from global (L1).
__global__ void v1_kernel(const uint16_t* W, const float* x, float* y, int N, int K) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= N) return;
    const uint4* w = reinterpret_cast<const uint4*>(W + static_cast<int64_t>(row) * K);
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float s = 0;
    for (int c = lane; c < K / 8; c += 32) s += dot8(__ldg(w + c), __ldg(x4 + 2 * c), __ldg(x4 + 2 * c + 1));
    s = warp_sum(s);
    if (lane == 0) y[row] = s;
}

// v11: one warp per row, no shared memory, 8 independent 16-byte streaming loads in flight per lane before
// the first use; x through L1 (__ldg). Few registers, no staging: many small blocks (N / 8), several waves.
__global__ void __launch_bounds__(256) v11_kernel(const uint16_t* W, const float* x, float* y, int N, int K) {
    const int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const int nchunk = K / 8;
    const uint4* w = reinterpret_cast<const uint4*>(W + static_cast<int64_t>(row) * K);
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float s = 0;
    for (int base = 0; base < nchunk; base += 32 * 8) {
        uint4 v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const int c = base + u * 32 + lane;
            v[u] = c < nchunk ? ld_stream(w + c) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const int c = base + u * 32 + lane;
            if (c < nchunk) s += dot8(v[u], __ldg(x4 + 2 * c), __ldg(x4 + 2 * c + 1));
        }
    }
    s = warp_sum(s);
    if (lane == 0) y[row] = s;
}

// v2..v10, v12..v15: x staged in shared memory, NW warps per block, R rows per warp, U chunks per row in
// flight, streaming loads, grid-stride over units. A unit is a group of NW*R rows times one of S slices of
// the K range (S = 1: whole rows; S > 1: split-K, y zeroed first and the partial sums added with atomicAdd).
// EARLY: the block's first batch of weights is loaded into registers before x is staged, so the staging
// latency (x load, barrier) overlaps the first weight loads. The production layout of
// src/cuda/kernels/gemv.cu is <2, 4, 8, false> with S = 1 and the legacy grid (v2).
template <int R, int U, int NW, bool EARLY>
__global__ void __launch_bounds__(NW * 32)
    staged_kernel(const uint16_t* W, const float* x, float* y, int N, int K, int S) {
    extern __shared__ float4 xs4[];
    float* xs = reinterpret_cast<float*>(xs4);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nchunk = K / 8;
    const int groups = (N + NW * R - 1) / (NW * R);
    const int slice = (nchunk + S - 1) / S;
    const int units = groups * S;
    uint4 pre[R][U];
    if constexpr (EARLY) {
        const int unit = blockIdx.x;
        const int g = unit / S, c_lo = (unit - g * S) * slice, c_hi = min(nchunk, c_lo + slice);
        const int row0 = (g * NW + warp) * R;
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const int c = c_lo + u * 32 + lane;
                const bool ok = unit < units && row0 + r < N && c < c_hi;
                pre[r][u] =
                    ok ? ld_stream(reinterpret_cast<const uint4*>(W + static_cast<int64_t>(row0 + r) * K) + c)
                       : make_uint4(0, 0, 0, 0);
            }
    }
    for (int k = threadIdx.x; k < K; k += blockDim.x) xs[k] = x[k];
    __syncthreads();
    bool first = true;
    for (int unit = blockIdx.x; unit < units; unit += gridDim.x) {
        const int g = unit / S, c_lo = (unit - g * S) * slice, c_hi = min(nchunk, c_lo + slice);
        const int row0 = (g * NW + warp) * R;
        const uint4* w[R];
        bool ok[R];
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            ok[r] = row0 + r < N;
            w[r] = reinterpret_cast<const uint4*>(W + static_cast<int64_t>(ok[r] ? row0 + r : 0) * K);
            acc[r] = 0;
        }
        for (int base = c_lo; base < c_hi; base += 32 * U) {
            uint4 v[R][U];
            if (EARLY && first) {
#pragma unroll
                for (int u = 0; u < U; ++u)
#pragma unroll
                    for (int r = 0; r < R; ++r) v[r][u] = pre[r][u];
                first = false;
            } else {
#pragma unroll
                for (int u = 0; u < U; ++u)
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        const int c = base + u * 32 + lane;
                        v[r][u] = ok[r] && c < c_hi ? ld_stream(w[r] + c) : make_uint4(0, 0, 0, 0);
                    }
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int c = base + u * 32 + lane;
                if (c < c_hi) {
                    const float4 a = xs4[2 * c], b = xs4[2 * c + 1];
#pragma unroll
                    for (int r = 0; r < R; ++r) acc[r] += dot8(v[r][u], a, b);
                }
            }
        }
        first = false;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            acc[r] = warp_sum(acc[r]);
            if (lane == 0 && ok[r]) {
                if (S == 1)
                    y[row0 + r] = acc[r];
                else
                    atomicAdd(y + row0 + r, acc[r]);
            }
        }
    }
}

// fp64 reference on the GPU: one warp per row, plain loads, double accumulation.
__global__ void ref_kernel(const uint16_t* W, const float* x, double* y, int N, int K) {
    const int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    double s = 0;
    for (int k = lane; k < K; k += 32)
        s += static_cast<double>(
                 __uint_as_float(static_cast<uint32_t>(W[static_cast<int64_t>(row) * K + k]) << 16)) *
             static_cast<double>(x[k]);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) y[row] = s;
}

// W[i] = bf16(uniform[-1, 1)) from a counter hash (round to nearest even).
__global__ void fill_kernel(uint16_t* W, int64_t n, uint64_t seed) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const float f = lab::uniform_pm1(seed, i);
        uint32_t b = __float_as_uint(f);
        b += 0x7fffu + ((b >> 16) & 1u);
        W[i] = static_cast<uint16_t>(b >> 16);
    }
}

int g_sms = 132;

// Blocks resident at once per SM (occupancy), cached per instantiation and smem size.
int resident(const void* fn, int threads, size_t smem) {
    struct Key {
        const void* fn;
        size_t smem;
    };
    static std::vector<std::pair<Key, int>> cache;
    for (auto& [k, v] : cache)
        if (k.fn == fn && k.smem == smem) return v;
    int nb = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, fn, threads, smem));
    nb = std::max(nb, 1);
    cache.push_back({{fn, smem}, nb});
    return nb;
}

// K slices per row group for a balanced split-K (v9, v10, v13; once src/cuda/kernels/gemv.cu's rule): the
// fewest slices whose units (groups x slices) spread over `blocks` with little tail, each slice still a few
// full batches of U chunks per lane.
int choose_ksplit(int groups, int blocks, int nchunk, int U) {
    int best = 1;
    double best_score = -1.0;
    for (int S = 1; S <= 8; ++S) {
        if (S > 1 && (nchunk + S - 1) / S < 2 * 32 * U) break;
        const int units = groups * S;
        const int rounds = (units + blocks - 1) / blocks;
        const double eff = static_cast<double>(units) / (static_cast<double>(rounds) * blocks);
        const double score = eff - 0.02 * (S - 1);  // atomics and re-staging are not free
        if (score > best_score + 1e-9) {
            best_score = score;
            best = S;
        }
    }
    return best;
}

enum Grid { kLegacy, kResident, kResidentSplitK, kWaves4 };  // kWaves4: 4 x the resident blocks

template <int R, int U, int NW, bool EARLY, Grid G>
void launch_staged(const uint16_t* W, const float* x, float* y, int N, int K, cudaStream_t s) {
    static bool prepared = false;
    if (!prepared) {
        CK(cudaFuncSetAttribute(staged_kernel<R, U, NW, EARLY>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                96 << 10));
        prepared = true;
    }
    const size_t smem = static_cast<size_t>(K) * 4;
    const int groups = (N + NW * R - 1) / (NW * R);
    int blocks, S = 1;
    if (G == kLegacy) {
        const int per_sm = std::max(1, std::min(8, static_cast<int>((200 * 1024) / (smem + 2048))));
        blocks = std::min(groups, g_sms * per_sm);
    } else {
        blocks =
            g_sms * resident(reinterpret_cast<const void*>(staged_kernel<R, U, NW, EARLY>), NW * 32, smem);
        if (G == kResidentSplitK) S = choose_ksplit(groups, blocks, K / 8, U);
        if (G == kWaves4) blocks *= 4;  // the block scheduler balances the tail, one group per block
        blocks = std::min(blocks, groups * S);
    }
    if (S > 1) CK(cudaMemsetAsync(y, 0, static_cast<size_t>(N) * 4, s));
    staged_kernel<R, U, NW, EARLY><<<blocks, NW * 32, smem, s>>>(W, x, y, N, K, S);
}

// The production warp-per-row GEMV itself (src/cuda/kernels/gemv_rows.cu through markbase::cuda::gemv, PDL as
// the model launches it), with the one-GPU settings (min_waves 3, 4 chunks per lane up to K = 2048) or a
// forced number of warps per row W, with or without the input RMSNorm folded into every warp (Norm: the norm
// weights are ones, so y = rsqrt(mean(x^2) + eps) * W x; the gate checks it against the reference times that
// factor; without it the launch runs the lean kernel, more blocks per SM at 4 chunks per lane). What a
// model's launch pays for its norm, and which W suits each shape.
const uint16_t* g_ones = nullptr;  // bf16 1.0 x the widest K
constexpr float kLabEps = 1e-6f;
template <bool Norm, int W>
void launch_prod(const uint16_t* Wt, const float* x, float* y, int N, int K, cudaStream_t s) {
    markbase::cuda::GemvInput in;
    in.kernel = markbase::cuda::GemvKernel::kRows;
    in.min_waves = 3;
    in.geglu_split = true;
    in.force_warps = W;
    in.x = x;
    in.K = K;
    in.norm = Norm;
    in.norm_w = Norm ? g_ones : nullptr;
    in.eps = kLabEps;
    markbase::cuda::GemvSeg seg{Wt, y, N, 0};
    markbase::cuda::gemv(in, &seg, 1, 1, s);
}

struct Variant {
    const char* name;
    const char* prod;  // its name as a product GEMV variant (v2: gemv.cu's tiles today), else ""
    void (*launch)(const uint16_t*, const float*, float*, int, int, cudaStream_t);
    bool norm = false;  // y carries the input norm's factor (launch_prod<true, W>)
};

const Variant kVariants[] = {
    {"v0 thread/row scalar", "",
     [](const uint16_t* W, const float* x, float* y, int N, int K, cudaStream_t s) {
         v0_kernel<<<(N + 255) / 256, 256, 0, s>>>(W, x, y, N, K);
     }},
    {"v1 warp/row ldg16", "",
     [](const uint16_t* W, const float* x, float* y, int N, int K, cudaStream_t s) {
         v1_kernel<<<(N + 7) / 8, 256, 0, s>>>(W, x, y, N, K);
     }},
    {"v2 smem R2 U4 (prod)", "legacy", launch_staged<2, 4, 8, false, kLegacy>},
    {"v3 smem R4 U2", "", launch_staged<4, 2, 8, false, kLegacy>},
    {"v4 smem R1 U8", "", launch_staged<1, 8, 8, false, kLegacy>},
    {"v5 smem R2 U8", "", launch_staged<2, 8, 8, false, kLegacy>},
    {"v6 R2 U4 resident", "r2u4", launch_staged<2, 4, 8, false, kResident>},
    {"v7 R1 U8 resident", "r1u8", launch_staged<1, 8, 8, false, kResident>},
    {"v8 R4 U2 resident", "r4u2", launch_staged<4, 2, 8, false, kResident>},
    {"v9 R1 U8 res splitK", "r1u8k", launch_staged<1, 8, 8, false, kResidentSplitK>},
    {"v10 R2 U4 res splitK", "r2u4k", launch_staged<2, 4, 8, false, kResidentSplitK>},
    {"v11 warp/row U8 nosmem", "",
     [](const uint16_t* W, const float* x, float* y, int N, int K, cudaStream_t s) {
         v11_kernel<<<(N + 7) / 8, 256, 0, s>>>(W, x, y, N, K);
     }},
    {"v12 R1 U8 res early", "", launch_staged<1, 8, 8, true, kResident>},
    {"v13 R1 U8 res early spK", "", launch_staged<1, 8, 8, true, kResidentSplitK>},
    {"v14 4w R2 U4 resident", "", launch_staged<2, 4, 4, false, kResident>},
    {"v15 16w R1 U4 resident", "", launch_staged<1, 4, 16, false, kResident>},
    {"v16 R1 U8 4 waves", "", launch_staged<1, 8, 8, false, kWaves4>},
    {"v17 R2 U4 4 waves", "", launch_staged<2, 4, 8, false, kWaves4>},
    {"p0 prod plain", "", launch_prod<false, 0>},
    {"p1 prod norm", "", launch_prod<true, 0>, true},
    {"p2 prod norm W1", "", launch_prod<true, 1>, true},
    {"p3 prod norm W2", "", launch_prod<true, 2>, true},
    {"p4 prod norm W4", "", launch_prod<true, 4>, true},
    {"p5 prod norm W8", "", launch_prod<true, 8>, true},
    {"p6 prod plain W1", "", launch_prod<false, 1>},
    {"p7 prod plain W2", "", launch_prod<false, 2>},
    {"p8 prod plain W4", "", launch_prod<false, 4>},
};
constexpr int kNumVariants = static_cast<int>(sizeof(kVariants) / sizeof(kVariants[0]));

float from_bf16(uint16_t v) {
    uint32_t b = static_cast<uint32_t>(v) << 16;
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}

// Every GEMV a decoded token runs, by model: N x K and how many per token. Fused pairs are one matrix of the
// same bytes here (qkv = q, k, v rows stacked; mlp gate_up = gate and up rows; the 8 selected experts = 8
// experts' rows stacked, each expert's own x in reality).
struct Shape {
    const char* model;
    const char* what;
    int N, K;
    int count;  // per token
};
const Shape kShapes[] = {
    {"e2b", "qkv sliding own", 2560, 1536, 12},
    {"e2b", "qkv full own", 5120, 1536, 3},
    {"e2b", "q sliding shared", 2048, 1536, 16},
    {"e2b", "q full shared", 4096, 1536, 4},
    {"e2b", "o_proj sliding", 1536, 2048, 28},
    {"e2b", "o_proj full", 1536, 4096, 7},
    {"e2b", "gate_up", 12288, 1536, 15},
    {"e2b", "gate_up double", 24576, 1536, 20},
    {"e2b", "down", 1536, 6144, 15},
    {"e2b", "down double", 1536, 12288, 20},
    {"e2b", "ple_gate", 256, 1536, 35},
    {"e2b", "ple_proj", 1536, 256, 35},
    {"e2b", "ple_model_proj", 8960, 1536, 1},
    {"e2b", "lm_head", 262144, 1536, 1},
    {"e4b", "qkv sliding own", 3072, 2560, 20},
    {"e4b", "qkv full own", 6144, 2560, 4},
    {"e4b", "q sliding shared", 2048, 2560, 15},
    {"e4b", "q full shared", 4096, 2560, 3},
    {"e4b", "o_proj sliding", 2560, 2048, 35},
    {"e4b", "o_proj full", 2560, 4096, 7},
    {"e4b", "gate_up", 20480, 2560, 42},
    {"e4b", "down", 2560, 10240, 42},
    {"e4b", "ple_gate", 256, 2560, 42},
    {"e4b", "ple_proj", 2560, 256, 42},
    {"e4b", "ple_model_proj", 10752, 2560, 1},
    {"e4b", "lm_head", 262144, 2560, 1},
    {"26b", "qkv sliding", 8192, 2816, 25},
    {"26b", "qkv full", 9216, 2816, 5},
    {"26b", "o_proj sliding", 2816, 4096, 25},
    {"26b", "o_proj full", 2816, 8192, 5},
    {"26b", "gate_up", 4224, 2816, 30},
    {"26b", "down", 2816, 2112, 30},
    {"26b", "router", 128, 2816, 30},
    {"26b", "experts gate_up x8", 11264, 2816, 30},
    {"26b", "experts down x8", 22528, 704, 30},
    {"26b", "lm_head", 262144, 2816, 1},
    {"31b", "qkv sliding", 16384, 5376, 50},
    {"31b", "qkv full", 18432, 5376, 10},
    {"31b", "o_proj sliding", 5376, 8192, 50},
    {"31b", "o_proj full", 5376, 16384, 10},
    {"31b", "gate_up", 43008, 5376, 60},
    {"31b", "down", 5376, 21504, 60},
    {"31b", "lm_head", 262144, 5376, 1},
};
constexpr int kNumShapes = static_cast<int>(sizeof(kShapes) / sizeof(kShapes[0]));

}  // namespace

int main(int argc, char** argv) {
    // line-buffered: a failed launch aborts, and the lines measured before it must reach a piped log
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    bool quick = false;
    std::string only, variants;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--quick") {
            quick = true;
        } else if (a == "--only" && i + 1 < argc) {
            only = argv[++i];
        } else if (a == "--variants" && i + 1 < argc) {
            variants = argv[++i];
        } else {
            std::fprintf(stderr,
                         "usage: markbase_gemv_lab [--quick] [--only SUBSTRING] [--variants v11,p*,...]\n");
            return 2;
        }
    }
    // --variants: the variants whose first word is listed, or starts with a listed "prefix*"
    std::vector<std::string> picks;
    for (size_t at = 0; at < variants.size();) {
        const size_t comma = std::min(variants.find(',', at), variants.size());
        if (comma > at) picks.push_back(variants.substr(at, comma - at));
        at = comma + 1;
    }
    auto selected = [&](const char* name) {
        if (picks.empty()) return true;
        const std::string_view word = std::string_view(name).substr(0, std::string_view(name).find(' '));
        for (const std::string& p : picks) {
            const std::string_view pv(p);
            if (pv == word ||
                (pv.back() == '*' && word.substr(0, pv.size() - 1) == pv.substr(0, pv.size() - 1)))
                return true;
        }
        return false;
    };
    constexpr double kRoofGBs = 4160.0;  // PERFORMANCE.md: HBM read, one H200
    cudaDeviceProp prop{};
    CK(cudaGetDeviceProperties(&prop, 0));
    g_sms = prop.multiProcessorCount;
    std::printf("device %s, %d SMs, L2 %d MB; roofline %.0f GB/s\n", prop.name, prop.multiProcessorCount,
                prop.l2CacheSize >> 20, kRoofGBs);
    std::printf("variants (prod = its name as a product GEMV variant once; v2 is gemv.cu's tiles):\n");
    for (int v = 0; v < kNumVariants; ++v)
        std::printf("  %-24s %s\n", kVariants[v].name, *kVariants[v].prod ? kVariants[v].prod : "-");
    cublasHandle_t blas;
    CB(cublasCreate(&blas));
    cudaStream_t stream;
    CK(cudaStreamCreate(&stream));
    CB(cublasSetStream(blas, stream));
    void* blas_ws = nullptr;  // a workspace of our own: cuBLAS must not allocate while a graph is captured
    CK(cudaMalloc(&blas_ws, size_t{32} << 20));
    CB(cublasSetWorkspace(blas, blas_ws, size_t{32} << 20));

    {  // the copy ceiling today (PERFORMANCE.md measured 4.24 TB/s read + write): 2 GiB device to device
        const size_t bytes = size_t{2} << 30;
        void *a = nullptr, *b = nullptr;
        CK(cudaMalloc(&a, bytes));
        CK(cudaMalloc(&b, bytes));
        CK(cudaMemset(a, 1, bytes));
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        std::vector<float> t;
        for (int i = 0; i < 6; ++i) {
            CK(cudaEventRecord(e0, stream));
            CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream));
            CK(cudaEventRecord(e1, stream));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (i) t.push_back(ms);
        }
        std::sort(t.begin(), t.end());
        std::printf("device copy 2 GiB: %.3f ms, %.1f GB/s (read + write)\n", t[t.size() / 2],
                    2.0 * bytes / (t[t.size() / 2] * 1e-3) / 1e9);
        CK(cudaEventDestroy(e0));
        CK(cudaEventDestroy(e1));
        CK(cudaFree(a));
        CK(cudaFree(b));
    }

    {  // the production variants' norm weights: ones
        int max_k = 0;
        for (const Shape& sh : kShapes) max_k = std::max(max_k, sh.K);
        std::vector<uint16_t> ones(static_cast<size_t>(max_k), 0x3f80);
        uint16_t* d = nullptr;
        CK(cudaMalloc(&d, ones.size() * 2));
        CK(cudaMemcpy(d, ones.data(), ones.size() * 2, cudaMemcpyHostToDevice));
        g_ones = d;
    }

    std::vector<int> shapes;
    for (int i = 0; i < kNumShapes; ++i) {
        const Shape& sh = kShapes[i];
        const std::string tag = std::string(sh.model) + " " + sh.what;
        if (!only.empty() && tag.find(only) == std::string::npos) continue;
        if (quick && !(tag == "e2b gate_up" || tag == "31b down" || tag == "e2b lm_head" ||
                       tag == "26b experts down x8" || tag == "31b o_proj sliding"))
            continue;
        shapes.push_back(i);
    }

    std::vector<float> hx;
    uint64_t rng_state = 0x9e3779b97f4a7c15ull;
    auto uni = [&]() {  // xorshift64*: uniform in [-1, 1)
        rng_state ^= rng_state >> 12;
        rng_state ^= rng_state << 25;
        rng_state ^= rng_state >> 27;
        return static_cast<float>((rng_state * 2685821657736338717ull) >> 40) * (2.0f / 16777216.0f) - 1.0f;
    };
    // graph_us[shape][variant] (per launch, 20 launches in one graph), NaN = not run; cuBLAS is variant
    // kNumVariants
    const int nv = kNumVariants + 1;
    std::vector<std::vector<double>> graph_us(kNumShapes, std::vector<double>(nv, NAN));
    std::printf("\n%-4s %-20s %7s %6s | %-24s %9s %9s %9s %6s %8s\n", "mdl", "shape", "N", "K", "variant",
                "solo us", "graph us", "GB/s", "%roof", "err");
    bool all_ok = true;
    for (const int si : shapes) {
        const Shape& sh = kShapes[si];
        const int64_t N = sh.N, K = sh.K;
        const size_t wbytes = static_cast<size_t>(N * K * 2);
        const int copies = static_cast<int>(std::max<size_t>(1, (size_t{1} << 30) / wbytes + 1));
        uint16_t* dw = nullptr;
        float *dx = nullptr, *dy = nullptr;
        double* dref = nullptr;
        uint16_t* dxb = nullptr;
        CK(cudaMalloc(&dw, wbytes * copies));
        fill_kernel<<<4 * g_sms, 256, 0, stream>>>(dw, N * K, 1234 + si);
        CK(cudaGetLastError());
        for (int c = 1; c < copies; ++c)
            CK(cudaMemcpyAsync(dw + c * N * K, dw, wbytes, cudaMemcpyDeviceToDevice, stream));
        hx.resize(K);
        for (auto& v : hx) v = uni();
        CK(cudaMalloc(&dx, K * 4));
        CK(cudaMalloc(&dy, N * 4));
        CK(cudaMalloc(&dref, N * 8));
        CK(cudaMalloc(&dxb, K * 2));
        CK(cudaMemcpy(dx, hx.data(), K * 4, cudaMemcpyHostToDevice));
        std::vector<uint16_t> hxb(K);
        for (int64_t k = 0; k < K; ++k) {
            uint32_t b;
            std::memcpy(&b, &hx[k], 4);
            b += 0x7fffu + ((b >> 16) & 1u);
            hxb[k] = static_cast<uint16_t>(b >> 16);
        }
        CK(cudaMemcpy(dxb, hxb.data(), K * 2, cudaMemcpyHostToDevice));
        ref_kernel<<<static_cast<int>((N + 7) / 8), 256, 0, stream>>>(dw, dx, dref, static_cast<int>(N),
                                                                      static_cast<int>(K));
        CK(cudaGetLastError());
        CK(cudaStreamSynchronize(stream));
        std::vector<double> ref(N);
        CK(cudaMemcpy(ref.data(), dref, N * 8, cudaMemcpyDeviceToHost));
        {  // the GPU reference against the CPU in fp64 on a few rows
            std::vector<uint16_t> row(K);
            double worst = 0;
            for (int t = 0; t < 16; ++t) {
                const int64_t n = (t * 7919) % N;
                CK(cudaMemcpy(row.data(), dw + n * K, K * 2, cudaMemcpyDeviceToHost));
                double s = 0;
                for (int64_t k = 0; k < K; ++k) s += static_cast<double>(from_bf16(row[k])) * hx[k];
                worst = std::max(worst, std::fabs(s - ref[n]) / (std::sqrt(static_cast<double>(K)) * 0.34));
            }
            if (!(worst < 1e-9)) {
                std::printf("%-4s %-20s: GPU fp64 reference disagrees with the CPU (%.1e)  FAIL\n", sh.model,
                            sh.what, worst);
                all_ok = false;
            }
        }

        auto solo = [&](auto&& fn) {
            for (int i = 0; i < 3; ++i) fn(i % copies);
            CK(cudaStreamSynchronize(stream));
            cudaEvent_t a, b;
            CK(cudaEventCreate(&a));
            CK(cudaEventCreate(&b));
            std::vector<float> t;
            for (int i = 0; i < 20; ++i) {
                CK(cudaEventRecord(a, stream));
                fn(i % copies);
                CK(cudaEventRecord(b, stream));
                CK(cudaEventSynchronize(b));
                float ms;
                CK(cudaEventElapsedTime(&ms, a, b));
                t.push_back(ms);
            }
            CK(cudaEventDestroy(a));
            CK(cudaEventDestroy(b));
            std::sort(t.begin(), t.end());
            return static_cast<double>(t[t.size() / 2]);
        };
        // one graph streams >= 256 MB of distinct copies, so that a replay never finds the weights in the 60
        // MB L2 (20 launches at least)
        const int kChain = static_cast<int>(
            std::min<size_t>(copies, std::max<size_t>(20, ((size_t{256} << 20) + wbytes - 1) / wbytes)));
        auto graph = [&](auto&& fn) {  // per-launch ms of kChain launches on rotating copies in one graph
            cudaGraph_t g = nullptr;
            cudaGraphExec_t ge = nullptr;
            CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
            for (int i = 0; i < kChain; ++i) fn(i % copies);
            CK(cudaStreamEndCapture(stream, &g));
            CK(cudaGraphInstantiate(&ge, g, 0));
            CK(cudaGraphLaunch(ge, stream));
            CK(cudaStreamSynchronize(stream));
            cudaEvent_t a, b;
            CK(cudaEventCreate(&a));
            CK(cudaEventCreate(&b));
            std::vector<float> t;
            for (int i = 0; i < 5; ++i) {
                CK(cudaEventRecord(a, stream));
                CK(cudaGraphLaunch(ge, stream));
                CK(cudaEventRecord(b, stream));
                CK(cudaEventSynchronize(b));
                float ms;
                CK(cudaEventElapsedTime(&ms, a, b));
                t.push_back(ms / kChain);
            }
            CK(cudaEventDestroy(a));
            CK(cudaEventDestroy(b));
            CK(cudaGraphExecDestroy(ge));
            CK(cudaGraphDestroy(g));
            std::sort(t.begin(), t.end());
            return static_cast<double>(t[t.size() / 2]);
        };
        double ssx = 0;  // the norm variants' factor rsqrt(mean(x^2) + eps)
        for (const float v : hx) ssx += static_cast<double>(v) * v;
        const double norm_factor = 1.0 / std::sqrt(ssx / static_cast<double>(K) + kLabEps);
        auto check = [&](double factor) {
            std::vector<float> hy(N);
            CK(cudaMemcpy(hy.data(), dy, N * 4, cudaMemcpyDeviceToHost));
            double worst = 0;
            const double scale = std::sqrt(static_cast<double>(K)) * 0.34;  // ~|row|*|x|
            for (int64_t n = 0; n < N; ++n) {
                const double e = std::isfinite(hy[n]) ? std::fabs(hy[n] / factor - ref[n]) / scale : INFINITY;
                worst = std::max(worst, e);
            }
            return worst;
        };
        auto report = [&](const char* name, double solo_ms, double graph_ms, double err, bool ok) {
            std::printf("%-4s %-20s %7lld %6lld | %-24s %9.1f %9.1f %9.1f %5.1f%% %8.1e%s\n", sh.model,
                        sh.what, static_cast<long long>(N), static_cast<long long>(K), name, solo_ms * 1e3,
                        graph_ms * 1e3, wbytes / (graph_ms * 1e-3) / 1e9,
                        100.0 * wbytes / (graph_ms * 1e-3) / 1e9 / kRoofGBs, err, ok ? "" : "  FAIL");
        };

        for (int vi = 0; vi < kNumVariants; ++vi) {
            const Variant& v = kVariants[vi];
            if (vi == 0 && N * K > (int64_t{1} << 24)) continue;  // v0 is far too slow there
            if (!selected(v.name)) continue;
            CK(cudaMemsetAsync(dy, 0xff, N * 4, stream));  // NaN poison: every row must be written
            v.launch(dw, dx, dy, static_cast<int>(N), static_cast<int>(K), stream);
            CK(cudaGetLastError());
            CK(cudaStreamSynchronize(stream));
            const double err = check(v.norm ? norm_factor : 1.0);
            const bool ok = err < 1e-4;
            if (!ok) all_ok = false;
            const double ms = solo([&](int c) {
                v.launch(dw + c * N * K, dx, dy, static_cast<int>(N), static_cast<int>(K), stream);
            });
            const double gms = graph([&](int c) {
                v.launch(dw + c * N * K, dx, dy, static_cast<int>(N), static_cast<int>(K), stream);
            });
            if (ok) graph_us[si][vi] = gms * 1e3;
            report(v.name, ms, gms, err, ok);
        }
        if (selected("cuBLAS")) {  // the baseline (x rounded to bf16, so its error gate is looser: reported,
                                   // not gated)
            const float one = 1, zero = 0;
            auto run = [&](int c) {
                CB(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), 1, static_cast<int>(K),
                                &one, dw + c * N * K, CUDA_R_16BF, static_cast<int>(K), dxb, CUDA_R_16BF,
                                static_cast<int>(K), &zero, dy, CUDA_R_32F, static_cast<int>(N),
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            };
            CK(cudaMemsetAsync(dy, 0xff, N * 4, stream));
            run(0);
            CK(cudaStreamSynchronize(stream));
            const double err = check(1.0);
            const double ms = solo(run);
            const double gms = graph(run);
            graph_us[si][kNumVariants] = gms * 1e3;
            report("cuBLAS GemmEx bf16", ms, gms, err, err < 1e-2);
        }
        CK(cudaFree(dw));
        CK(cudaFree(dx));
        CK(cudaFree(dy));
        CK(cudaFree(dref));
        CK(cudaFree(dxb));
    }

    // Per-shape winners (graph timing, correct variants only; cuBLAS listed beside, never a winner: its x is
    // bf16).
    auto vname = [&](int v) { return v == kNumVariants ? "cuBLAS" : kVariants[v].name; };
    std::printf(
        "\nwinners (graph timing per launch; prod = src/cuda/kernels/gemv.cu's default v2; best sel = best "
        "of the "
        "variants that were product variants):\n");
    std::printf("%-4s %-20s %7s %6s | %8s %6s | %-24s %8s %6s | %-8s %8s | %8s\n", "mdl", "shape", "N", "K",
                "v2 us", "%roof", "winner", "us", "%roof", "best sel", "us", "cuBLAS");
    for (const int si : shapes) {
        const Shape& sh = kShapes[si];
        const double bytes = 2.0 * sh.N * static_cast<double>(sh.K);
        auto pct = [&](double us) { return 100.0 * bytes / (us * 1e-6) / 1e9 / kRoofGBs; };
        int win = -1, sel = -1;
        for (int v = 0; v < kNumVariants; ++v) {
            const double t = graph_us[si][v];
            if (std::isnan(t)) continue;
            if (win < 0 || t < graph_us[si][win]) win = v;
            if (*kVariants[v].prod && (sel < 0 || t < graph_us[si][sel])) sel = v;
        }
        if (win < 0) continue;
        const double t2 = graph_us[si][2];
        std::printf("%-4s %-20s %7d %6d | %8.1f %5.1f%% | %-24s %8.1f %5.1f%% | %-8s %8.1f | %8.1f\n",
                    sh.model, sh.what, sh.N, sh.K, t2, pct(t2), vname(win), graph_us[si][win],
                    pct(graph_us[si][win]), sel >= 0 ? kVariants[sel].prod : "-",
                    sel >= 0 ? graph_us[si][sel] : NAN, graph_us[si][kNumVariants]);
    }

    // Per model: the GEMV time of one token (sum over its shapes of count x graph time) for each variant used
    // everywhere, and for the per-shape best; the roofline time of the same bytes beside.
    std::printf(
        "\nper model, GEMVs of one decoded token (sum of count x graph us; plain GEMVs, no norm prologue "
        "or epilogue):\n");
    for (const char* m : {"e2b", "e4b", "26b", "31b"}) {
        double bytes = 0;
        bool complete = true, any = false;
        for (int si = 0; si < kNumShapes; ++si) {
            if (std::strcmp(kShapes[si].model, m) != 0) continue;
            const bool ran = std::find(shapes.begin(), shapes.end(), si) != shapes.end();
            complete = complete && ran;
            any = any || ran;
            if (ran) bytes += 2.0 * kShapes[si].N * static_cast<double>(kShapes[si].K) * kShapes[si].count;
        }
        if (!any) continue;
        std::printf("  %s%s: roofline %.0f us for %.2f GB |", m, complete ? "" : " (shapes run only)",
                    bytes / (kRoofGBs * 1e9) * 1e6, bytes / 1e9);
        for (int v = 1; v <= kNumVariants; ++v) {
            double tot = 0;
            bool have = true;
            for (int si = 0; si < kNumShapes; ++si) {
                if (std::strcmp(kShapes[si].model, m) != 0) continue;
                if (std::find(shapes.begin(), shapes.end(), si) == shapes.end()) continue;
                if (std::isnan(graph_us[si][v])) have = false;
                tot += graph_us[si][v] * kShapes[si].count;
            }
            if (have)
                std::printf(" %s %.0f",
                            v == kNumVariants ? "cuBLAS" : std::string(vname(v)).substr(0, 3).c_str(), tot);
        }
        double best = 0;
        for (int si = 0; si < kNumShapes; ++si) {
            if (std::strcmp(kShapes[si].model, m) != 0) continue;
            if (std::find(shapes.begin(), shapes.end(), si) == shapes.end()) continue;
            double b = INFINITY;
            for (int v = 1; v < kNumVariants; ++v)
                if (!std::isnan(graph_us[si][v])) b = std::min(b, graph_us[si][v]);
            best += b * kShapes[si].count;
        }
        std::printf(" | best-per-shape %.0f us\n", best);
    }
    std::printf("correctness gate: %s\n", all_ok ? "all variants pass" : "FAILURES (see FAIL rows)");
    CB(cublasDestroy(blas));
    CK(cudaFree(blas_ws));
    CK(cudaStreamDestroy(stream));
    return all_ok ? 0 : 1;
}
