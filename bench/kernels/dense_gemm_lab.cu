// Kernel lab for the dense products of a serving step (17-128 tokens: a batched decode step of ~100 rows, a
// short prompt chunk): Y[n][N] = X[n][K] W[N][K]^T, X one bf16 operand (gemm_inputs=bf16), fp32 outputs.
// At ~96 rows the product's cublasGemmEx(CUBLAS_GEMM_DEFAULT) ran E2B's MLP at ~1.5 TB/s of its weights
// (docs/performance.md): 96 x 24,576 x 1,536 is neither bandwidth- nor compute-bound in its tiles. Variants:
//   v0  cublasGemmEx, CUBLAS_GEMM_DEFAULT (the product)
//   v1  cublasLt, the heuristic's first algorithm (32 MB workspace)
//   v2  cublasLt, each of the heuristic's next algorithms (up to kAlgos), the fastest reported with its
//       configuration (tile, split-K, stages, cluster)
// Correctness gate: every output against an fp64 GPU reference of the same bf16 operands (relative to the
// row's sum of |x| |w|); a variant over 1e-5 fails the run. Timing: launches over rotating weight copies
// (>= 256 MB distinct, so that the 60 MB L2 cannot serve them) captured as one CUDA graph; per-launch time,
// median of 5 replays; GB/s = weight bytes / time.
//   markbase_dense_gemm_lab [--only SUBSTRING] [--n 32,64,96,128]
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/kernels/kernels.h"
#include "lab_common.cuh"

using markbase::bf16;

namespace {

constexpr int kAlgos = 24;
constexpr size_t kWorkspace = size_t{32} << 20;

struct Shape {
    const char* name;
    int N, K;
};

// Every dense matrix a batched step multiplies through cuBLAS, one at a time as gemm() runs them.
const std::vector<Shape> kShapes = {
    {"e2b q", 2048, 1536},       {"e2b q full", 4096, 1536},     {"e2b k", 256, 1536},
    {"e2b o_proj", 1536, 2048},  {"e2b gate", 6144, 1536},       {"e2b gate wide", 12288, 1536},
    {"e2b down", 1536, 6144},    {"e2b down wide", 1536, 12288}, {"e2b ple gate", 256, 1536},
    {"e2b ple proj", 1536, 256}, {"e2b lm_head", 262144, 1536},  {"e4b q", 2048, 2560},
    {"e4b k", 512, 2560},        {"e4b o_proj", 2560, 2048},     {"e4b gate", 10240, 2560},
    {"e4b down", 2560, 10240},   {"26b q", 4096, 2816},          {"26b k", 2048, 2816},
    {"26b o_proj", 2816, 4096},  {"26b gate", 2112, 2816},       {"26b down", 2816, 2112},
    {"26b router", 128, 2816},   {"31b q", 8192, 5376},          {"31b k", 4096, 5376},
    {"31b o_proj", 5376, 8192},  {"31b gate", 21504, 5376},      {"31b down", 5376, 21504},
};

__global__ void fill_bf16(bf16* p, int64_t n, uint64_t seed, float scale) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
         i += int64_t{gridDim.x} * blockDim.x) {
        const float v = lab::uniform_pm1(seed, i) * scale;
        p[i] = static_cast<bf16>(__float_as_uint(v) >> 16);
    }
}
__device__ double bf(bf16 b) {
    return static_cast<double>(__uint_as_float(static_cast<uint32_t>(b) << 16));
}

// ref[t][r] = sum_k x[t][k] w[r][k] in fp64; mag = sum |x| |w| (the error's scale)
__global__ void reference(const bf16* w, const bf16* x, int N, int K, double* ref, double* mag) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (r >= N) return;
    double s = 0.0, m = 0.0;
    for (int k = 0; k < K; ++k) {
        const double p = bf(x[int64_t{t} * K + k]) * bf(w[int64_t{r} * K + k]);
        s += p;
        m += std::fabs(p);
    }
    ref[int64_t{t} * N + r] = s;
    mag[int64_t{t} * N + r] = m;
}

// worst = max |y - ref| / mag over n x N outputs (as float bits: non-negative floats order as integers;
// NaN or Inf counts as 1e30)
__global__ void max_error(const float* y, const double* ref, const double* mag, int64_t count,
                          unsigned* worst) {
    float e = 0.0f;
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
         i += int64_t{gridDim.x} * blockDim.x) {
        const double d = std::fabs(static_cast<double>(y[i]) - ref[i]) / fmax(mag[i], 1e-30);
        e = fmaxf(e, isfinite(d) ? static_cast<float>(d) : 1e30f);
    }
    atomicMax(worst, __float_as_uint(e));
}

struct Bench {
    cudaStream_t s = nullptr;
    cublasHandle_t blas = nullptr;
    cublasLtHandle_t lt = nullptr;
    void* workspace = nullptr;
    unsigned* worst = nullptr;
};

// One shape at n tokens through cublasLt: its descriptors and the heuristic's algorithms.
struct LtPlan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulHeuristicResult_t algos[kAlgos] = {};  // (a plain array: nvcc 13 aborts on a vector of it)
    int count = 0;

    LtPlan(const Bench& bench, const Shape& sh, int n) {
        // column-major Y^T[N][n] = W^T(op T: W is [N][K] row-major = [K][N] column-major) X^T[K][n]
        CB(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
        CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
        CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof(nn)));
        CB(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, sh.K, sh.N, sh.K));
        CB(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, sh.K, n, sh.K));
        CB(cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, sh.N, n, sh.N));
        cublasLtMatmulPreference_t pref = nullptr;
        CB(cublasLtMatmulPreferenceCreate(&pref));
        CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWorkspace,
                                                sizeof(kWorkspace)));
        CB(cublasLtMatmulAlgoGetHeuristic(bench.lt, op, a, b, c, c, pref, kAlgos, algos, &count));
        CB(cublasLtMatmulPreferenceDestroy(pref));
    }
    ~LtPlan() {
        cublasLtMatrixLayoutDestroy(c);
        cublasLtMatrixLayoutDestroy(b);
        cublasLtMatrixLayoutDestroy(a);
        cublasLtMatmulDescDestroy(op);
    }
};

std::string describe(const cublasLtMatmulAlgo_t& algo) {
    auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr) {
        uint32_t v = 0;
        size_t written = 0;
        cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written);
        return static_cast<int>(v);
    };
    char buf[160];
    std::snprintf(buf, sizeof buf, "id%d tile%d splitk%d red%d stages%d swz%d cluster%d",
                  get(CUBLASLT_ALGO_CONFIG_ID), get(CUBLASLT_ALGO_CONFIG_TILE_ID),
                  get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM), get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
                  get(CUBLASLT_ALGO_CONFIG_STAGES_ID), get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
                  get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID));
    return buf;
}

// Algorithm `v` (-1: cublasGemmEx's default, else the heuristic's v-th) over weight copy w.
void launch(const Bench& b, const LtPlan& plan, int v, const Shape& sh, const bf16* w, const bf16* x,
            float* y, int n) {
    const float one = 1.0f, zero = 0.0f;
    if (v < 0) {
        CB(cublasGemmEx(b.blas, CUBLAS_OP_T, CUBLAS_OP_N, sh.N, n, sh.K, &one, w, CUDA_R_16BF, sh.K, x,
                        CUDA_R_16BF, sh.K, &zero, y, CUDA_R_32F, sh.N, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT));
        return;
    }
    CB(cublasLtMatmul(b.lt, plan.op, &one, w, plan.a, x, plan.b, &zero, y, plan.c, y, plan.c,
                      &plan.algos[v].algo, b.workspace, kWorkspace, b.s));
}

// The largest error of algorithm v on copy 0 against the reference (outputs poisoned after).
float error_of(const Bench& b, const LtPlan& plan, int v, const Shape& sh, const bf16* w, const bf16* x,
               float* y, int n, const double* ref, const double* mag) {
    launch(b, plan, v, sh, w, x, y, n);
    CK(cudaMemsetAsync(b.worst, 0, sizeof(unsigned), b.s));
    max_error<<<264, 256, 0, b.s>>>(y, ref, mag, int64_t{n} * sh.N, b.worst);
    unsigned bits = 0;
    CK(cudaMemcpyAsync(&bits, b.worst, sizeof bits, cudaMemcpyDeviceToHost, b.s));
    CK(cudaStreamSynchronize(b.s));
    CK(cudaMemsetAsync(y, 0xff, sizeof(float) * n * sh.N, b.s));
    float e = 0.0f;
    std::memcpy(&e, &bits, sizeof e);
    return e;
}

// Algorithm v's time per launch (us): a graph of launches over the rotating copies, median of 5 replays.
double time_us(const Bench& b, const LtPlan& plan, int v, const Shape& sh, const bf16* wall, int64_t elems,
               int copies, const bf16* x, float* y, int n) {
    const int per_graph = std::max(20, copies);
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(b.s, cudaStreamCaptureModeRelaxed));
    for (int r = 0; r < per_graph; ++r) launch(b, plan, v, sh, wall + (r % copies) * elems, x, y, n);
    CK(cudaStreamEndCapture(b.s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    const float ms = lab::time_ms(5, b.s, [&] { CK(cudaGraphLaunch(ge, b.s)); });
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return 1e3 * ms / per_graph;
}

std::vector<int> parse_ns(const char* s) {
    std::vector<int> ns;
    for (const char* p = s; *p;) {
        ns.push_back(std::atoi(p));
        while (*p && *p != ',') ++p;
        if (*p == ',') ++p;
    }
    return ns;
}

}  // namespace

int main(int argc, char** argv) {
    std::string only;
    std::vector<int> ns = {32, 64, 96, 128};
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else if (!std::strcmp(argv[i], "--n") && i + 1 < argc)
            ns = parse_ns(argv[++i]);
    }
    const int max_n = *std::max_element(ns.begin(), ns.end());
    Bench b;
    CK(cudaStreamCreateWithFlags(&b.s, cudaStreamNonBlocking));
    CB(cublasCreate(&b.blas));
    CB(cublasSetStream(b.blas, b.s));
    CB(cublasLtCreate(&b.lt));
    CK(cudaMalloc(&b.workspace, kWorkspace));
    CK(cudaMalloc(&b.worst, sizeof(unsigned)));
    cudaDeviceProp prop{};
    CK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device %s, %d SMs, cuBLAS %d\n", prop.name, prop.multiProcessorCount,
                static_cast<int>(cublasLtGetVersion()));
    int max_rows = 0, max_k = 0;
    for (const Shape& sh : kShapes) max_rows = std::max(max_rows, sh.N), max_k = std::max(max_k, sh.K);
    bf16* x = nullptr;
    float* y = nullptr;
    double *ref = nullptr, *mag = nullptr;
    CK(cudaMalloc(&x, sizeof(bf16) * max_n * max_k));
    CK(cudaMalloc(&y, sizeof(float) * max_n * max_rows));
    CK(cudaMalloc(&ref, sizeof(double) * max_n * max_rows));
    CK(cudaMalloc(&mag, sizeof(double) * max_n * max_rows));
    bool failed = false;
    std::printf("%-14s %3s  %-8s %9s %8s %10s  %s\n", "shape", "n", "variant", "us", "GB/s", "max err",
                "algo");
    for (const Shape& sh : kShapes) {
        if (!only.empty() && std::string(sh.name).find(only) == std::string::npos) continue;
        const int64_t elems = int64_t{sh.N} * sh.K;
        const int copies = static_cast<int>(std::max<double>(1.0, std::ceil(256e6 / (2.0 * elems))));
        bf16* wall = nullptr;
        CK(cudaMalloc(&wall, sizeof(bf16) * elems * copies));
        fill_bf16<<<1024, 256, 0, b.s>>>(wall, elems * copies, 7, 0.05f);
        const double bytes = 2.0 * elems;
        for (int n : ns) {
            fill_bf16<<<256, 256, 0, b.s>>>(x, int64_t{n} * sh.K, 1000 + n, 1.0f);
            reference<<<dim3((sh.N + 127) / 128, n), 128, 0, b.s>>>(wall, x, sh.N, sh.K, ref, mag);
            const LtPlan plan(b, sh, n);
            const int count = plan.count;
            double best_us = 1e30;
            int best = -2;
            for (int v = -1; v < count; ++v) {
                const float err = error_of(b, plan, v, sh, wall, x, y, n, ref, mag);
                const double us = time_us(b, plan, v, sh, wall, elems, copies, x, y, n);
                const bool bad = !(err <= 1e-5f);
                failed |= bad;
                if (v <= 0 || bad)
                    std::printf("%-14s %3d  %-8s %9.2f %8.0f %10.2e  %s%s\n", sh.name, n, v < 0 ? "v0" : "v1",
                                us, bytes / us * 1e-3, err,
                                v < 0 ? "cublasGemmEx default" : describe(plan.algos[0].algo).c_str(),
                                bad ? "  FAIL" : "");
                if (v >= 0 && !bad && us < best_us) best_us = us, best = v;
            }
            if (best >= 0)
                std::printf("%-14s %3d  %-8s %9.2f %8.0f %10s  #%d of %d: %s\n", sh.name, n, "v2 best",
                            best_us, bytes / best_us * 1e-3, "", best, count,
                            describe(plan.algos[best].algo).c_str());
        }
        CK(cudaFree(wall));
    }
    std::printf(failed ? "correctness gate: FAILED\n" : "correctness gate: every variant within 1e-5\n");
    return failed ? 1 : 0;
}
