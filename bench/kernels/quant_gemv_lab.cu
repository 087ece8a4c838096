// Kernel lab for the quantised decode GEMVs: y = (W @ x) * scale with W float8 e4m3 [N, K] (one byte per
// weight, row-major) and one fp32 scale per row (model/fp8.h), x fp32; and y = W @ x with W int4 (two codes a
// byte, a scale per group of 128 along K; model/int4.h). The question it answers: how a quantised weight
// becomes part of a dot product fast enough that the GEMV streams at the memory's rate, with a half or a
// quarter of bf16's bytes to stream.
//   v1: CUDA cores, the hardware's conversion e4m3x2 -> f16x2 (cuda_fp8.h), then f16 -> f32 and an FMA
//   v2: CUDA cores, a bit trick (integer ops and one multiply per weight, then an FMA)
// each at 4 and 8 16-byte chunks in flight per lane. "p fp8" and "p int4" are the product kernels
// (gemv_quant.cu: the tensor cores, weights to f16 pairs and mma.sync with x as f16 halves; int4's codes are
// the first half of the FP8 bytes, its scales its own), "p bf16" the product's bf16 kernel (gemv_rows.cu) on
// the same shape, with twice FP8's bytes; "p fp8 long" the FP8 product with 4 super-steps a buffer (the
// dense models' decode: GemvInput::fp8_long_buffers). v3 (quant_gemv_variants.cuh): the persistent blocks on
// their way into the product, with the int4 conversion and the every-lane x load as switches. Run 1 (v1, v2
// and an FP8 warp-per-row product on the CUDA cores; H200): 1.2-1.9 TB/s of FP8, slower per token than bf16
// on every model (31B's listed products 16.0-17.4 ms against bf16's 13.3): instruction and L1 bound, hence
// the tensor cores. Correctness gate: every output against an fp64 GPU reference whose e4m3 table is
// model/fp8.h's decoding (unit-tested exhaustively on the host), int4's against its own fp64 reference; bound
// 1e-5 of sum |w x| (bf16: 4e-3, its copy rounds each weight; the tensor-core kernels: 1e-5, x's f16 halves
// keep ~22 bits). Timing: launches over rotating copies
// (>= 256 MB distinct, so the 60 MB L2 serves none), captured as one graph, per-launch time, median of 5.
//   markbase_quant_gemv_lab [--only SUBSTRING] [--gate-only: one launch of each variant, no timing]
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda/kernels/device_common.cuh"
#include "cuda/kernels/kernels.h"
#include "lab_common.cuh"
#include "model/fp8.h"
#include "quant_gemv_variants.cuh"

namespace {

using markbase::cuda::ld_stream;
using markbase::cuda::warp_sum;

__constant__ float c_fp8[256];

// v2's conversion: four e4m3 bytes (lowest first) as floats with integer ops and one multiply each: a byte's
// 7 magnitude bits at float bits 20..26 and its sign at bit 31 make a float worth exactly e4m3 * 2^-120 (an
// exponent field e is 2^(e - 127) against e4m3's 2^(e - 7); subnormals and zero map alike); 2^120 restores
// it.
__device__ __forceinline__ float4 fp8x4_to_float4(uint32_t w) {
    constexpr float k = 0x1p120f;
    float4 r;
    r.x = __uint_as_float(((w << 20) & 0x07f00000u) | ((w << 24) & 0x80000000u)) * k;
    r.y = __uint_as_float(((w << 12) & 0x07f00000u) | ((w << 16) & 0x80000000u)) * k;
    r.z = __uint_as_float(((w << 4) & 0x07f00000u) | ((w << 8) & 0x80000000u)) * k;
    r.w = __uint_as_float(((w >> 4) & 0x07f00000u) | (w & 0x80000000u)) * k;
    return r;
}

// v1's conversion: two bytes at a time through the hardware's e4m3x2 -> f16x2
__device__ __forceinline__ float4 fp8x4_hw(uint32_t w) {
    const __half2_raw lo =
        __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xffffu), __NV_E4M3);
    const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3);
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
    return make_float4(a.x, a.y, b.x, b.y);
}

template <bool Hw>
__device__ __forceinline__ float dot16(const uint4 w, const float4* x4, int c, float s) {
    const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float4 f = Hw ? fp8x4_hw(ws[i]) : fp8x4_to_float4(ws[i]);
        const float4 a = __ldg(x4 + 4 * c + i);
        s = fmaf(f.x, a.x, s);
        s = fmaf(f.y, a.y, s);
        s = fmaf(f.z, a.z, s);
        s = fmaf(f.w, a.w, s);
    }
    return s;
}

// one warp per row, U 16-byte chunks (16 weights each) in flight per lane, x through L1
template <bool Hw, int U>
__global__ void __launch_bounds__(256)
    warp_kernel(const uint8_t* W, const float* scale, const float* x, float* y, int N, int K) {
    const int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const uint4* w = reinterpret_cast<const uint4*>(W + static_cast<int64_t>(row) * K);
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const int nchunk = K / 16;
    float s = 0.0f;
    for (int base = 0; base < nchunk; base += 32 * U) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = base + u * 32 + lane;
            v[u] = c < nchunk ? ld_stream(w + c) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = base + u * 32 + lane;
            if (c < nchunk) s = dot16<Hw>(v[u], x4, c, s);
        }
    }
    s = warp_sum(s);
    if (lane == 0) y[row] = s * scale[row];
}

// fp64 references: a warp per row, y[row] = sum of weight(row, k) * x[k] and mag[row] = sum of |that|
template <class Weight>
__global__ void ref_kernel(Weight weight, const float* x, double* y, double* mag, int N, int K) {
    const int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    double s = 0, m = 0;
    for (int k = lane; k < K; k += 32) {
        const double t = weight(row, k) * x[k];
        s += t;
        m += fabs(t);
    }
    for (int o = 16; o > 0; o >>= 1) {
        s += __shfl_xor_sync(0xffffffffu, s, o);
        m += __shfl_xor_sync(0xffffffffu, m, o);
    }
    if (lane == 0) {
        y[row] = s;
        mag[row] = m;
    }
}
// FP8: the table of model/fp8.h times the row's scale
struct Fp8Weight {
    const uint8_t* W;
    const float* scale;
    int K;
    __device__ double operator()(int row, int k) const {
        return static_cast<double>(c_fp8[W[static_cast<int64_t>(row) * K + k]]) * scale[row];
    }
};
// int4: codes (low nibble first) minus 8, times the group's scale
struct Int4Weight {
    const uint8_t* q;
    const float* scale;
    int K;
    __device__ double operator()(int row, int k) const {
        const int code = (q[static_cast<int64_t>(row) * (K / 2) + k / 2] >> (4 * (k & 1))) & 15;
        return (code - 8) *
               static_cast<double>(scale[static_cast<int64_t>(row) * ((K + 127) / 128) + k / 128]);
    }
};

// int4 scales in [0.5, 1.5) / 8
__global__ void fill4_kernel(float* scale, int64_t n, uint64_t seed) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += stride)
        scale[i] = (1.0f + 0.5f * lab::uniform_pm1(seed + 3, i)) / 8.0f;
}

// random e4m3 codes (no NaN: 0x7f and 0xff redrawn as 0), scales in [0.5, 1.5) / 448, x in [-1, 1)
__global__ void fill_kernel(uint8_t* W, int64_t n, float* scale, int N, float* x, int K, uint64_t seed) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += stride) {
        const uint8_t b = static_cast<uint8_t>(lab::mix64(seed * 0x9e3779b97f4a7c15ull + i) >> 56);
        W[i] = (b & 0x7f) == 0x7f ? 0 : b;
        if (i < N) scale[i] = (1.0f + 0.5f * lab::uniform_pm1(seed + 1, i)) / 448.0f;
        if (i < K) x[i] = lab::uniform_pm1(seed + 2, i);
    }
}

__global__ void widen_kernel(const uint8_t* W, const float* scale, uint16_t* B, int64_t n, int K) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += stride) {
        const float f = c_fp8[W[i]] * scale[i / K];
        B[i] = markbase::cuda::float_to_bf16_bits(f);
    }
}

struct Shape {
    const char* model;
    const char* what;
    int N, K;
    int count;  // per token
};
// The products a decoded token runs in FP8 (gemv_lab.cu's list less lm_head, router and PLE, which stay
// bf16).
const Shape kShapes[] = {
    {"e2b", "qkv sliding own", 2560, 1536, 12},
    {"e2b", "q sliding shared", 2048, 1536, 16},
    {"e2b", "o_proj sliding", 1536, 2048, 28},
    {"e2b", "gate_up", 12288, 1536, 15},
    {"e2b", "gate_up double", 24576, 1536, 20},
    {"e2b", "down", 1536, 6144, 15},
    {"e2b", "down double", 1536, 12288, 20},
    {"e4b", "qkv sliding own", 3072, 2560, 20},
    {"e4b", "o_proj sliding", 2560, 2048, 35},
    {"e4b", "gate_up", 20480, 2560, 42},
    {"e4b", "down", 2560, 10240, 42},
    {"26b", "qkv sliding", 8192, 2816, 25},
    {"26b", "o_proj sliding", 2816, 4096, 25},
    {"26b", "gate_up", 4224, 2816, 30},
    {"26b", "down", 2816, 2112, 30},
    {"26b", "experts gate_up x8", 11264, 2816, 30},
    {"26b", "experts down x8", 22528, 704, 30},
    {"31b", "qkv sliding", 16384, 5376, 50},
    {"31b", "o_proj sliding", 5376, 8192, 50},
    {"31b", "gate_up", 43008, 5376, 60},
    {"31b", "down", 5376, 21504, 60},
};

// One shape's buffers, `copies` of each weight set (so the 60 MB L2 serves none): FP8 bytes W [n], their
// bf16 copy B [n], FP8 row scales sc [N]; int4 reads W's first n/2 bytes as codes with scales sc4 [N * G].
struct Buffers {
    uint8_t* W = nullptr;
    uint16_t* B = nullptr;
    float *sc = nullptr, *sc4 = nullptr;
    int64_t n = 0;
    int N = 0, K = 0, G = 0;
};

using LaunchFn = void (*)(const Buffers&, int copy, const float* x, float* y, cudaStream_t);

markbase::cuda::GemvInput input_of(const float* x, int K) {
    markbase::cuda::GemvInput in;
    in.x = x;
    in.K = K;
    in.kernel = markbase::cuda::GemvKernel::kRows;
    in.min_waves = 3;
    return in;
}

template <bool Hw, int U>
void launch_v(const Buffers& b, int c, const float* x, float* y, cudaStream_t s) {
    warp_kernel<Hw, U><<<(b.N + 7) / 8, 256, 0, s>>>(b.W + b.n * c, b.sc + int64_t{b.N} * c, x, y, b.N, b.K);
}
// Long: 4 super-steps a register buffer (GemvInput::fp8_long_buffers, the dense models' decode)
template <bool Long>
void launch_p8(const Buffers& b, int c, const float* x, float* y, cudaStream_t s) {
    markbase::cuda::GemvSeg seg;
    seg.q = {b.W + b.n * c, b.sc + int64_t{b.N} * c, nullptr};
    seg.format = markbase::WeightFormat::kFp8;
    seg.y = y;
    seg.rows = b.N;
    markbase::cuda::GemvInput in = input_of(x, b.K);
    in.fp8_long_buffers = Long;
    markbase::cuda::gemv(in, &seg, 1, 1, s);
}
void launch_p4(const Buffers& b, int c, const float* x, float* y, cudaStream_t s) {
    markbase::cuda::GemvSeg seg;
    seg.q = {b.W + b.n * c, b.sc4 + int64_t{b.N} * b.G * c, nullptr};
    seg.format = markbase::WeightFormat::kInt4;
    seg.y = y;
    seg.rows = b.N;
    markbase::cuda::gemv(input_of(x, b.K), &seg, 1, 1, s);
}
void launch_p16(const Buffers& b, int c, const float* x, float* y, cudaStream_t s) {
    markbase::cuda::GemvSeg seg{b.B + b.n * c, y, b.N, 0};
    markbase::cuda::gemv(input_of(x, b.K), &seg, 1, 1, s);
}

template <markbase::WeightFormat F, int KS, int U, bool Trick = false, bool XAll = false>
void launch_v3(const Buffers& b, int c, const float* x, float* y, cudaStream_t s) {
    markbase::cuda::quant::QuantParams p;
    p.x = x;
    p.K = b.K;
    p.nseg = 1;
    if (F == markbase::WeightFormat::kInt4)
        p.m[0] = {b.W + b.n * c, b.sc4 + int64_t{b.N} * b.G * c, nullptr};
    else
        p.m[0] = {b.W + b.n * c, b.sc + int64_t{b.N} * c, nullptr};
    p.y[0] = y;
    p.seg_end[0] = b.N;
    p.total_rows = b.N;
    qv::launch_persist<F, KS, U, Trick, XAll>(p, s);
}
constexpr auto kF8 = markbase::WeightFormat::kFp8;
constexpr auto kI4 = markbase::WeightFormat::kInt4;

struct Variant {
    const char* name;
    LaunchFn fn;
    double bytes_per_weight = 1.0;
    bool int4 = false;  // checked against int4's reference
};
const Variant kVariants[] = {
    {"v1 hwcvt U4", launch_v<true, 4>},
    {"v1 hwcvt U8", launch_v<true, 8>},
    {"v2 bits U4", launch_v<false, 4>},
    {"v2 bits U8", launch_v<false, 8>},
    {"p fp8", launch_p8<false>},
    {"p fp8 long", launch_p8<true>},
    {"p int4", launch_p4, 0.5, true},
    {"p bf16", launch_p16, 2.0},
    {"v3 fp8", launch_v3<kF8, 0, 4>},
    {"v3 fp8 xall", launch_v3<kF8, 0, 4, false, true>},
    {"v3 int4", launch_v3<kI4, 0, 4>, 0.5, true},
    {"v3 int4 trick", launch_v3<kI4, 0, 4, true>, 0.5, true},
    {"v3 int4 xall", launch_v3<kI4, 0, 4, false, true>, 0.5, true},
};

}  // namespace

int main(int argc, char** argv) {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    std::string only;
    bool time = true;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--only" && i + 1 < argc) {
            only = argv[++i];
        } else if (a == "--gate-only") {
            time = false;
        } else {
            std::fprintf(stderr, "usage: markbase_quant_gemv_lab [--only SUBSTRING] [--gate-only]\n");
            return 2;
        }
    }
    float table[256];
    for (int i = 0; i < 256; ++i) table[i] = markbase::fp8_e4m3_to_float(static_cast<uint8_t>(i));
    CK(cudaMemcpyToSymbol(c_fp8, table, sizeof table));
    constexpr double kRoofGBs = 4160.0;  // PERFORMANCE.md: HBM read, one H200
    cudaDeviceProp prop{};
    CK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device %s, %d SMs; roofline %.0f GB/s\n", prop.name, prop.multiProcessorCount, kRoofGBs);
    markbase::cuda::gemv_prepare(21504);
    cudaStream_t stream;
    CK(cudaStreamCreate(&stream));
    constexpr int kVar = static_cast<int>(sizeof(kVariants) / sizeof(kVariants[0]));
    std::vector<double> model_us(4 * kVar, 0.0);
    const char* models[4] = {"e2b", "e4b", "26b", "31b"};
    bool all_ok = true;
    std::printf("%-4s %-20s %6s %6s |", "", "shape", "N", "K");
    for (const Variant& v : kVariants) std::printf(" %17s", v.name);
    std::printf("   (us per launch / GB/s of its bytes)\n");
    for (const Shape& sh : kShapes) {
        const std::string label = std::string(sh.model) + " " + sh.what;
        if (!only.empty() && label.find(only) == std::string::npos) continue;
        const int64_t n = int64_t{sh.N} * sh.K;
        const int copies = static_cast<int>(std::max<int64_t>(2, (int64_t{256} << 20) / n + 1));
        Buffers b;
        b.n = n;
        b.N = sh.N;
        b.K = sh.K;
        b.G = (sh.K + 127) / 128;
        uint8_t*& W = b.W;
        uint16_t*& B = b.B;
        float*& sc = b.sc;
        float *x = nullptr, *y = nullptr;
        double *ref = nullptr, *mag = nullptr, *ref4 = nullptr, *mag4 = nullptr;
        CK(cudaMalloc(&W, n * copies));
        CK(cudaMalloc(&B, n * 2 * copies));
        CK(cudaMalloc(&sc, sizeof(float) * sh.N * copies));
        CK(cudaMalloc(&b.sc4, sizeof(float) * sh.N * b.G * copies));
        CK(cudaMalloc(&ref4, sizeof(double) * sh.N));
        CK(cudaMalloc(&mag4, sizeof(double) * sh.N));
        CK(cudaMalloc(&x, sizeof(float) * sh.K));
        CK(cudaMalloc(&y, sizeof(float) * sh.N));
        CK(cudaMalloc(&ref, sizeof(double) * sh.N));
        CK(cudaMalloc(&mag, sizeof(double) * sh.N));
        for (int c = 0; c < copies; ++c) {
            fill_kernel<<<1024, 256, 0, stream>>>(W + n * c, n, sc + int64_t{sh.N} * c, sh.N, x, sh.K, 7 + c);
            widen_kernel<<<1024, 256, 0, stream>>>(W + n * c, sc + int64_t{sh.N} * c, B + n * c, n, sh.K);
        }
        fill4_kernel<<<1024, 256, 0, stream>>>(b.sc4, int64_t{sh.N} * b.G * copies, 7);
        fill_kernel<<<1024, 256, 0, stream>>>(W, n, sc, sh.N, x, sh.K, 7);  // copy 0's x
        ref_kernel<<<(sh.N + 7) / 8, 256, 0, stream>>>(Fp8Weight{W, sc, sh.K}, x, ref, mag, sh.N, sh.K);
        ref_kernel<<<(sh.N + 7) / 8, 256, 0, stream>>>(Int4Weight{W, b.sc4, sh.K}, x, ref4, mag4, sh.N, sh.K);
        CK(cudaStreamSynchronize(stream));
        std::vector<double> href(sh.N), hmag(sh.N), href4(sh.N), hmag4(sh.N);
        CK(cudaMemcpy(href.data(), ref, sizeof(double) * sh.N, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hmag.data(), mag, sizeof(double) * sh.N, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(href4.data(), ref4, sizeof(double) * sh.N, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hmag4.data(), mag4, sizeof(double) * sh.N, cudaMemcpyDeviceToHost));
        std::printf("%-4s %-20s %6d %6d |", sh.model, sh.what, sh.N, sh.K);
        int mi = 0;
        while (std::string(models[mi]) != sh.model) ++mi;
        for (int v = 0; v < kVar; ++v) {
            const Variant& var = kVariants[v];
            CK(cudaMemset(y, 0xff, sizeof(float) * sh.N));  // NaN poison
            var.fn(b, 0, x, y, stream);
            CK(cudaStreamSynchronize(stream));
            const std::vector<double>& want = var.int4 ? href4 : href;
            const std::vector<double>& size = var.int4 ? hmag4 : hmag;
            std::vector<float> hy(sh.N);
            CK(cudaMemcpy(hy.data(), y, sizeof(float) * sh.N, cudaMemcpyDeviceToHost));
            double worst = 0;
            for (int r = 0; r < sh.N; ++r) {
                const double e = std::fabs(hy[r] - want[r]) / (size[r] + 1e-30);
                worst = std::isfinite(hy[r]) ? std::max(worst, e) : INFINITY;
            }
            // the bf16 copy rounds each dequantised weight once more (relative 2^-9)
            const bool ok = worst <= (var.bytes_per_weight == 2.0 ? 4e-3 : 1e-5);
            all_ok = all_ok && ok;
            if (!time) {  // one launch of each variant (for a profiler): the gate, no timing
                std::printf(" %7s %5s%s%s", "-", "-", ok ? " " : "!", "  ");
                continue;
            }
            cudaGraph_t graph;
            cudaGraphExec_t exec;
            CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
            const int launches = std::max(20, copies);
            for (int l = 0; l < launches; ++l) {
                const int c = l % copies;
                var.fn(b, c, x, y, stream);
            }
            CK(cudaStreamEndCapture(stream, &graph));
            CK(cudaGraphInstantiate(&exec, graph, 0));
            const float ms = lab::time_ms(5, stream, [&] { CK(cudaGraphLaunch(exec, stream)); });
            CK(cudaGraphExecDestroy(exec));
            CK(cudaGraphDestroy(graph));
            const double us = ms * 1e3 / launches;
            const double bytes =
                static_cast<double>(n) * var.bytes_per_weight + 4.0 * (var.int4 ? sh.N * b.G : sh.N);
            std::printf(" %7.2f %5.0f%s%s", us, bytes / (us * 1e-6) / 1e9, ok ? " " : "!", "  ");
            model_us[mi * kVar + v] += us * sh.count;
        }
        std::printf("\n");
        CK(cudaFree(W));
        CK(cudaFree(B));
        CK(cudaFree(sc));
        CK(cudaFree(x));
        CK(cudaFree(y));
        CK(cudaFree(ref));
        CK(cudaFree(mag));
        CK(cudaFree(b.sc4));
        CK(cudaFree(ref4));
        CK(cudaFree(mag4));
    }
    std::printf("\nper token, the listed products (us):\n");
    for (int m = 0; m < 4; ++m) {
        std::printf("  %-4s", models[m]);
        for (int v = 0; v < kVar; ++v) std::printf("  %s %.1f", kVariants[v].name, model_us[m * kVar + v]);
        std::printf("\n");
    }
    std::printf("correctness gate: %s\n", all_ok ? "PASS" : "FAIL (! marks the failing rows)");
    return all_ok ? 0 : 1;
}
