// Kernel lab for the hot decode op: y = W @ x with W bf16 [N, K] (row-major, HF [out, in]) and x fp32.
// A CPU reference in double, numbered GPU variants, a correctness gate (poisoned output, every element
// checked against the reference) and a GB/s sweep over the shapes Gemma 4 decodes with, rotating over enough
// weight copies that the 60 MB L2 cannot serve the reads. cuBLAS (bf16 x bf16 -> fp32 GEMV through GemmEx) is
// the baseline. The winner is promoted into src/cuda/gemv.cu (today: v2).
//   markbase_gemv_lab [--quick]
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CK(call)                                                                                      \
    do {                                                                                              \
        cudaError_t e_ = (call);                                                                      \
        if (e_ != cudaSuccess) {                                                                      \
            std::fprintf(stderr, "%s failed: %s at %s:%d\n", #call, cudaGetErrorString(e_), __FILE__, \
                         __LINE__);                                                                   \
            std::exit(1);                                                                             \
        }                                                                                             \
    } while (0)
#define CB(call)                                                                                    \
    do {                                                                                            \
        cublasStatus_t s_ = (call);                                                                 \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                          \
            std::fprintf(stderr, "%s failed: %d at %s:%d\n", #call, static_cast<int>(s_), __FILE__, \
                         __LINE__);                                                                 \
            std::exit(1);                                                                           \
        }                                                                                           \
    } while (0)

namespace {

__device__ __forceinline__ float lo16(uint32_t w) {
    return __uint_as_float(w << 16);
}
__device__ __forceinline__ float hi16(uint32_t w) {
    return __uint_as_float(w & 0xffff0000u);
}
__device__ __forceinline__ float dot8(uint4 w, float4 a, float4 b) {
    float s = lo16(w.x) * a.x;
    s = fmaf(hi16(w.x), a.y, s);
    s = fmaf(lo16(w.y), a.z, s);
    s = fmaf(hi16(w.y), a.w, s);
    s = fmaf(lo16(w.z), b.x, s);
    s = fmaf(hi16(w.z), b.y, s);
    s = fmaf(lo16(w.w), b.z, s);
    s = fmaf(hi16(w.w), b.w, s);
    return s;
}
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
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

// v2..: x staged in shared memory, R rows per warp, U chunks per row in flight, streaming loads, grid-stride
// over row groups (the production layout of src/cuda/gemv.cu is <2, 4>).
template <int R, int U>
__global__ void __launch_bounds__(256)
    staged_kernel(const uint16_t* W, const float* x, float* y, int N, int K) {
    extern __shared__ float4 xs4[];
    float* xs = reinterpret_cast<float*>(xs4);
    for (int k = threadIdx.x; k < K; k += blockDim.x) xs[k] = x[k];
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nchunk = K / 8;
    const int groups = (N + 8 * R - 1) / (8 * R);
    for (int g = blockIdx.x; g < groups; g += gridDim.x) {
        const int row0 = (g * 8 + warp) * R;
        const uint4* w[R];
        bool ok[R];
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            ok[r] = row0 + r < N;
            w[r] = reinterpret_cast<const uint4*>(W + static_cast<int64_t>(ok[r] ? row0 + r : 0) * K);
            acc[r] = 0;
        }
        for (int base = 0; base < nchunk; base += 32 * U) {
            uint4 v[R][U];
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const int c = base + u * 32 + lane;
                    v[r][u] = ok[r] && c < nchunk ? ld_stream(w[r] + c) : make_uint4(0, 0, 0, 0);
                }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int c = base + u * 32 + lane;
                if (c < nchunk) {
                    const float4 a = xs4[2 * c], b = xs4[2 * c + 1];
#pragma unroll
                    for (int r = 0; r < R; ++r) acc[r] += dot8(v[r][u], a, b);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            acc[r] = warp_sum(acc[r]);
            if (lane == 0 && ok[r]) y[row0 + r] = acc[r];
        }
    }
}

int g_sms = 132;

struct Variant {
    const char* name;
    void (*launch)(const uint16_t*, const float*, float*, int, int, cudaStream_t);
};

template <int R, int U>
void launch_staged(const uint16_t* W, const float* x, float* y, int N, int K, cudaStream_t s) {
    const size_t smem = static_cast<size_t>(K) * 4;
    const int groups = (N + 8 * R - 1) / (8 * R);
    const int per_sm = std::max(1, std::min(8, static_cast<int>((200 * 1024) / (smem + 2048))));
    staged_kernel<R, U><<<std::min(groups, g_sms * per_sm), 256, smem, s>>>(W, x, y, N, K);
}

const Variant kVariants[] = {
    {"v0 thread/row scalar",
     [](const uint16_t* W, const float* x, float* y, int N, int K, cudaStream_t s) {
         v0_kernel<<<(N + 255) / 256, 256, 0, s>>>(W, x, y, N, K);
     }},
    {"v1 warp/row ldg16", [](const uint16_t* W, const float* x, float* y, int N, int K,
                             cudaStream_t s) { v1_kernel<<<(N + 7) / 8, 256, 0, s>>>(W, x, y, N, K); }},
    {"v2 smem R2 U4 (prod)", launch_staged<2, 4>},
    {"v3 smem R4 U2", launch_staged<4, 2>},
    {"v4 smem R1 U8", launch_staged<1, 8>},
    {"v5 smem R2 U8", launch_staged<2, 8>},
};

uint16_t to_bf16(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    b += 0x7fffu + ((b >> 16) & 1u);
    return static_cast<uint16_t>(b >> 16);
}
float from_bf16(uint16_t v) {
    uint32_t b = static_cast<uint32_t>(v) << 16;
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}

}  // namespace

int main(int argc, char** argv) {
    const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
    cudaDeviceProp prop{};
    CK(cudaGetDeviceProperties(&prop, 0));
    g_sms = prop.multiProcessorCount;
    std::printf("device %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    for (int K : {1536, 2560, 2816, 5376, 12288, 21504}) {
        const int bytes = K * 4;
        CK(cudaFuncSetAttribute(staged_kernel<2, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                std::max(bytes, 48 << 10)));
        CK(cudaFuncSetAttribute(staged_kernel<4, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                std::max(bytes, 48 << 10)));
        CK(cudaFuncSetAttribute(staged_kernel<1, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                std::max(bytes, 48 << 10)));
        CK(cudaFuncSetAttribute(staged_kernel<2, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                std::max(bytes, 48 << 10)));
    }
    cublasHandle_t blas;
    CB(cublasCreate(&blas));
    cudaStream_t stream;
    CK(cudaStreamCreate(&stream));
    CB(cublasSetStream(blas, stream));

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
        CK(cudaFree(a));
        CK(cudaFree(b));
    }

    struct Shape {
        const char* what;
        int N, K;
    };
    std::vector<Shape> shapes = {{"e2b q_proj", 2048, 1536},    {"e2b mlp gate", 12288, 1536},
                                 {"e2b mlp down", 1536, 12288}, {"26b expert-like", 1408, 2816},
                                 {"26b o_proj", 2816, 4096},    {"31b mlp gate", 21504, 5376},
                                 {"31b mlp down", 5376, 21504}, {"e2b lm_head", 262144, 1536}};
    if (quick)
        shapes = {
            {"e2b mlp gate", 12288, 1536}, {"31b mlp down", 5376, 21504}, {"e2b lm_head", 262144, 1536}};

    uint64_t rng_state = 0x9e3779b97f4a7c15ull;
    auto uni = [&]() {  // xorshift64*: fast enough for a billion draws, uniform in [-1, 1)
        rng_state ^= rng_state >> 12;
        rng_state ^= rng_state << 25;
        rng_state ^= rng_state >> 27;
        return static_cast<float>((rng_state * 2685821657736338717ull) >> 40) * (2.0f / 16777216.0f) - 1.0f;
    };
    std::printf("%-16s %7s %6s | %-22s %9s %9s %8s\n", "shape", "N", "K", "variant", "us", "GB/s", "err");
    bool all_ok = true;
    for (const Shape& sh : shapes) {
        const int64_t N = sh.N, K = sh.K;
        const size_t wbytes = static_cast<size_t>(N * K * 2);
        const int copies = static_cast<int>(std::max<size_t>(1, (size_t{1} << 30) / wbytes + 1));
        std::vector<uint16_t> hw(N * K);
        std::vector<float> hx(K);
        for (auto& v : hw) v = to_bf16(uni());
        for (auto& v : hx) v = uni();
        std::vector<double> ref(N);
        for (int64_t n = 0; n < N; ++n) {
            double s = 0;
            for (int64_t k = 0; k < K; ++k) s += static_cast<double>(from_bf16(hw[n * K + k])) * hx[k];
            ref[n] = s;
        }
        uint16_t* dw = nullptr;
        float *dx = nullptr, *dy = nullptr;
        uint16_t* dxb = nullptr;
        CK(cudaMalloc(&dw, wbytes * copies));
        for (int c = 0; c < copies; ++c)
            CK(cudaMemcpy(dw + c * N * K, hw.data(), wbytes, cudaMemcpyHostToDevice));
        CK(cudaMalloc(&dx, K * 4));
        CK(cudaMalloc(&dy, N * 4));
        CK(cudaMalloc(&dxb, K * 2));
        CK(cudaMemcpy(dx, hx.data(), K * 4, cudaMemcpyHostToDevice));
        std::vector<uint16_t> hxb(K);
        for (int64_t k = 0; k < K; ++k) hxb[k] = to_bf16(hx[k]);
        CK(cudaMemcpy(dxb, hxb.data(), K * 2, cudaMemcpyHostToDevice));

        auto measure = [&](auto&& fn) {
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
        auto check = [&](double tol) {
            std::vector<float> hy(N);
            CK(cudaMemcpy(hy.data(), dy, N * 4, cudaMemcpyDeviceToHost));
            double worst = 0;
            for (int64_t n = 0; n < N; ++n) {
                const double scale = std::sqrt(static_cast<double>(K)) * 0.34;  // ~|row|*|x|
                const double e = std::isfinite(hy[n]) ? std::fabs(hy[n] - ref[n]) / scale : INFINITY;
                worst = std::max(worst, e);
            }
            if (!(worst < tol)) all_ok = false;
            return worst;
        };

        for (const Variant& v : kVariants) {
            if (v.launch == kVariants[0].launch && N * K > (int64_t{1} << 27))
                continue;                     // v0 is too slow there
            CK(cudaMemset(dy, 0xff, N * 4));  // NaN poison: every row must be written
            v.launch(dw, dx, dy, static_cast<int>(N), static_cast<int>(K), stream);
            CK(cudaGetLastError());
            CK(cudaStreamSynchronize(stream));
            const double err = check(1e-4);
            const double ms = measure([&](int c) {
                v.launch(dw + c * N * K, dx, dy, static_cast<int>(N), static_cast<int>(K), stream);
            });
            std::printf("%-16s %7lld %6lld | %-22s %9.1f %9.1f %8.1e%s\n", sh.what, static_cast<long long>(N),
                        static_cast<long long>(K), v.name, ms * 1e3, wbytes / (ms * 1e-3) / 1e9, err,
                        err < 1e-4 ? "" : "  FAIL");
        }
        // cuBLAS baseline (x rounded to bf16, so its error gate is looser)
        {
            float* dyc = dy;
            const float one = 1, zero = 0;
            auto run = [&](int c) {
                CB(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), 1, static_cast<int>(K),
                                &one, dw + c * N * K, CUDA_R_16BF, static_cast<int>(K), dxb, CUDA_R_16BF,
                                static_cast<int>(K), &zero, dyc, CUDA_R_32F, static_cast<int>(N),
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            };
            CK(cudaMemset(dy, 0xff, N * 4));
            run(0);
            CK(cudaStreamSynchronize(stream));
            const double err = check(1e-2);
            const double ms = measure(run);
            std::printf("%-16s %7lld %6lld | %-22s %9.1f %9.1f %8.1e\n", sh.what, static_cast<long long>(N),
                        static_cast<long long>(K), "cuBLAS GemmEx bf16", ms * 1e3, wbytes / (ms * 1e-3) / 1e9,
                        err);
        }
        CK(cudaFree(dw));
        CK(cudaFree(dx));
        CK(cudaFree(dy));
        CK(cudaFree(dxb));
    }
    std::printf("correctness gate: %s\n", all_ok ? "all variants pass" : "FAILURES (see FAIL rows)");
    CB(cublasDestroy(blas));
    return all_ok ? 0 : 1;
}
