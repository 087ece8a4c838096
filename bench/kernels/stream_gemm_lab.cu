// Kernel lab for the projections of a few tokens (the batched step, short prompt chunks): Y[n][N] =
// x[n][K] W[N][K]^T. Two operand modes (--inputs): halves, the fp32 activations as two bf16 halves (hi + lo,
// split_rows; gemm_inputs=halves), and bf16, their one bf16 rounding (hi; gemm_inputs=bf16, the default).
// Variants:
//   v0  cuBLAS as the product runs it: halves, per matrix one GEMM over [hi; lo] (2n columns) into a
//       scratch, then sum_halves; bf16, per matrix one GEMM over hi
//   v1  the product's kernel with its shape rule: stream_gemm (src/cuda/kernels/stream_gemm.cu,
//       stream_gemm_shape) up to 16 tokens, tile_gemm (tile_gemm.cu, tile_gemm_shape) past that in bf16
//   v2  stream_gemm with each forced shape (mt row tiles per block x ks K splits)
//   v3  tile_gemm (bf16 only) with each K split ks, tiles of 128 weight rows
//   v4  tile_gemm (bf16 only) with each K split ks, tiles of 64 weight rows
// Correctness gate: every output of every variant against an fp64 GPU reference of the same operands and
// weights (relative to the row's sum of |x| |w|); a variant over 1e-5 fails the run. Timing: each variant's
// launches over rotating weight copies (>= 256 MB distinct, so that the 60 MB L2 cannot serve them) captured
// as one CUDA graph; per-launch time, median of 5 replays; GB/s = weight bytes / time.
//   markbase_stream_gemm_lab [--inputs halves|bf16] [--n 8,16,...] [--only SUBSTRING]
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
using namespace markbase::cuda;

namespace {

struct Shape {
    const char* name;
    std::vector<int> rows;  // the segments of one launch
    int K;
};

// Every projection a batched step runs, per variant (real widths; E2B's full layers have head dim 512).
const std::vector<Shape> kShapes = {
    {"e2b qkv", {2048, 256, 256}, 1536},
    {"e2b qkv full", {4096, 512, 512}, 1536},
    {"e2b o_proj", {1536}, 2048},
    {"e2b gate+up", {12288, 12288}, 1536},
    {"e2b down", {1536}, 12288},
    {"e2b ple gate", {256}, 1536},
    {"e2b ple proj", {1536}, 256},
    {"e2b ple inputs", {8960}, 1536},
    {"e2b lm_head", {262144}, 1536},
    {"e4b qkv", {2048, 512, 512}, 2560},
    {"e4b o_proj", {2560}, 2048},
    {"e4b gate+up", {10240, 10240}, 2560},
    {"e4b down", {2560}, 10240},
    {"26b qkv", {4096, 2048, 2048}, 2816},
    {"26b o_proj", {2816}, 4096},
    {"26b gate+up", {2112, 2112}, 2816},
    {"26b down", {2816}, 2112},
    {"26b router", {128}, 2816},
    {"31b qkv", {8192, 4096, 4096}, 5376},
    {"31b o_proj", {5376}, 8192},
    {"31b gate+up", {21504, 21504}, 5376},
    {"31b down", {5376}, 21504},
};

__global__ void fill_bf16(bf16* p, int64_t n, uint64_t seed, float scale) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
         i += int64_t{gridDim.x} * blockDim.x) {
        const float v = lab::uniform_pm1(seed, i) * scale;
        p[i] = static_cast<bf16>(__float_as_uint(v) >> 16);
    }
}
__global__ void fill_f32(float* p, int64_t n, uint64_t seed) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
         i += int64_t{gridDim.x} * blockDim.x)
        p[i] = lab::uniform_pm1(seed, i);
}
__device__ float bf(bf16 b) {
    return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

// ref[t][r] = sum_k (hi + lo)[t][k] w[r][k] in fp64; mag = sum |x| |w| (the error's scale)
__global__ void reference(const bf16* w, const bf16* hi, const bf16* lo, int N, int K, int n, double* ref,
                          double* mag) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (r >= N) return;
    double s = 0.0, m = 0.0;
    for (int k = 0; k < K; ++k) {
        const double x = double(bf(hi[int64_t{t} * K + k])) + double(bf(lo[int64_t{t} * K + k]));
        const double v = double(bf(w[int64_t{r} * K + k]));
        s += x * v;
        m += std::fabs(x * v);
    }
    ref[int64_t{t} * N + r] = s;
    mag[int64_t{t} * N + r] = m;
}

struct Bench {
    bool bf16 = false;  // --inputs bf16: one operand (lo zeros for the reference, null for stream_gemm)
    cudaStream_t s = nullptr;
    cublasHandle_t blas = nullptr;
    int sms = 0;
    float* y2 = nullptr;  // cuBLAS's [2n][N] scratch
};

struct Variant {
    std::string name;
    int mt = 0, ks = 0;  // 0: cuBLAS (v0); -1: the shape rule (v1)
    bool tile = false;   // v3, v4: tile_gemm with K split ks
    int tile_mt = 2;     // v3: 128-row tiles (two m64); v4: 64-row tiles
};

// One launch of variant v over weight copy `w` (one pointer per segment).
void launch(const Bench& b, const Variant& v, const Shape& sh, const std::vector<const bf16*>& w,
            const std::vector<float*>& y, const bf16* hi, const bf16* lo, int n) {
    const int nseg = static_cast<int>(sh.rows.size());
    if (v.mt == 0) {
        const float one = 1.0f, zero = 0.0f;
        for (int i = 0; i < nseg; ++i) {
            if (b.bf16) {
                CB(cublasGemmEx(b.blas, CUBLAS_OP_T, CUBLAS_OP_N, sh.rows[i], n, sh.K, &one, w[i],
                                CUDA_R_16BF, sh.K, hi, CUDA_R_16BF, sh.K, &zero, y[i], CUDA_R_32F, sh.rows[i],
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
                continue;
            }
            CB(cublasGemmEx(b.blas, CUBLAS_OP_T, CUBLAS_OP_N, sh.rows[i], 2 * n, sh.K, &one, w[i],
                            CUDA_R_16BF, sh.K, hi, CUDA_R_16BF, sh.K, &zero, b.y2, CUDA_R_32F, sh.rows[i],
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            sum_halves(b.y2, n, sh.rows[i], y[i], sh.rows[i], b.s);
        }
        return;
    }
    GemvSeg segs[kStreamGemmMaxSegs];
    for (int i = 0; i < nseg; ++i) segs[i] = GemvSeg{w[i], y[i], sh.rows[i], sh.rows[i]};
    if (v.tile || (v.mt < 0 && b.bf16 && n > 16)) {
        const TileGemmShape shape =
            v.tile ? TileGemmShape{v.ks, v.tile_mt} : tile_gemm_shape(segs, nseg, sh.K, n, b.sms);
        tile_gemm(segs, nseg, hi, n, sh.K, shape, b.s);
        return;
    }
    StreamGemmShape shape = stream_gemm_shape(segs, nseg, sh.K, n, b.sms);
    if (v.mt > 0) shape = StreamGemmShape{v.mt, v.ks};
    stream_gemm(segs, nseg, hi, b.bf16 ? nullptr : lo, n, sh.K, shape, b.s);
}

// One shape's weights: `copies` rotating copies of its segments (>= 256 MB in all), and its outputs.
struct ShapeRun {
    const Shape& sh;
    int64_t elems = 0;  // weights of one copy
    int copies = 1;
    bf16* wall = nullptr;
    std::vector<float*> y;

    ShapeRun(const Shape& s, const Bench& b, int max_n) : sh(s) {
        for (int r : sh.rows) elems += int64_t{r} * sh.K;
        copies = static_cast<int>(std::max<double>(1.0, std::ceil(256e6 / (2.0 * elems))));
        CK(cudaMalloc(&wall, sizeof(bf16) * elems * copies));
        fill_bf16<<<1024, 256, 0, b.s>>>(wall, elems * copies, 7, 0.05f);
        for (int r : sh.rows) {
            y.push_back(nullptr);
            CK(cudaMalloc(&y.back(), sizeof(float) * max_n * r));
        }
    }
    ~ShapeRun() {
        for (float* p : y) CK(cudaFree(p));
        CK(cudaFree(wall));
    }
    std::vector<const bf16*> weights(int c) const {
        std::vector<const bf16*> w;
        int64_t off = int64_t{c} * elems;
        for (int r : sh.rows) {
            w.push_back(wall + off);
            off += int64_t{r} * sh.K;
        }
        return w;
    }
};

// Variant v's largest error on copy 0 against the fp64 reference, segment by segment (outputs poisoned
// after).
double max_error(const Bench& b, const Variant& v, ShapeRun& run, const bf16* hi, const bf16* lo, int n,
                 double* ref, double* mag) {
    const Shape& sh = run.sh;
    double worst = 0.0;
    launch(b, v, sh, run.weights(0), run.y, hi, lo, n);
    for (size_t i = 0; i < sh.rows.size(); ++i) {
        const int N = sh.rows[i];
        reference<<<dim3((N + 127) / 128, n), 128, 0, b.s>>>(run.weights(0)[i], hi, lo, N, sh.K, n, ref, mag);
        std::vector<float> got(static_cast<size_t>(n) * N);
        std::vector<double> want(got.size()), m(got.size());
        CK(cudaMemcpyAsync(got.data(), run.y[i], sizeof(float) * got.size(), cudaMemcpyDeviceToHost, b.s));
        CK(cudaMemcpyAsync(want.data(), ref, sizeof(double) * got.size(), cudaMemcpyDeviceToHost, b.s));
        CK(cudaMemcpyAsync(m.data(), mag, sizeof(double) * got.size(), cudaMemcpyDeviceToHost, b.s));
        CK(cudaStreamSynchronize(b.s));
        for (size_t j = 0; j < got.size(); ++j) {
            const double e = std::fabs(got[j] - want[j]) / std::max(m[j], 1e-30);
            worst = std::max(worst, std::isfinite(e) ? e : 1e30);
        }
        CK(cudaMemsetAsync(run.y[i], 0xff, sizeof(float) * got.size(), b.s));  // poison
    }
    return worst;
}

// Variant v's time per launch (us): a graph of launches over the rotating copies, median of 5 replays.
double time_us(const Bench& b, const Variant& v, const ShapeRun& run, const bf16* hi, const bf16* lo, int n) {
    const int per_graph = std::max(20, run.copies);
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(b.s, cudaStreamCaptureModeRelaxed));
    for (int r = 0; r < per_graph; ++r) launch(b, v, run.sh, run.weights(r % run.copies), run.y, hi, lo, n);
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
    bool quick = false;
    std::string only;
    Bench b;
    std::vector<int> ns;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--quick"))
            quick = true;
        else if (!std::strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else if (!std::strcmp(argv[i], "--inputs") && i + 1 < argc)
            b.bf16 = !std::strcmp(argv[++i], "bf16");
        else if (!std::strcmp(argv[i], "--n") && i + 1 < argc)
            ns = parse_ns(argv[++i]);
    }
    if (ns.empty())
        ns = quick    ? std::vector<int>{8, 32}
             : b.bf16 ? std::vector<int>{8, 16, 32, 64, 96, 128}
                      : std::vector<int>{1, 4, 8, 16, 32, 64};
    CK(cudaStreamCreateWithFlags(&b.s, cudaStreamNonBlocking));
    tile_gemm_prepare();
    CB(cublasCreate(&b.blas));
    CB(cublasSetStream(b.blas, b.s));
    cudaDeviceProp prop{};
    CK(cudaGetDeviceProperties(&prop, 0));
    b.sms = prop.multiProcessorCount;
    std::printf("device %s, %d SMs, inputs %s\n", prop.name, b.sms, b.bf16 ? "bf16" : "halves");
    const int max_n = *std::max_element(ns.begin(), ns.end());
    int max_rows = 0, max_k = 0;
    for (const Shape& sh : kShapes) {
        for (int r : sh.rows) max_rows = std::max(max_rows, r);
        max_k = std::max(max_k, sh.K);
    }
    CK(cudaMalloc(&b.y2, sizeof(float) * 2 * max_n * max_rows));
    float* x = nullptr;
    bf16* hl = nullptr;
    CK(cudaMalloc(&x, sizeof(float) * max_n * max_k));
    CK(cudaMalloc(&hl, sizeof(bf16) * 2 * max_n * max_k));
    double *ref = nullptr, *mag = nullptr;
    CK(cudaMalloc(&ref, sizeof(double) * max_n * max_rows));
    CK(cudaMalloc(&mag, sizeof(double) * max_n * max_rows));
    std::vector<Variant> variants = {{"v0 cublas", 0, 0}, {"v1 rule", -1, -1}};
    for (int mt : {1, 2, 4})
        for (int ks : {1, 2, 4, 8})
            variants.push_back({"v2 mt" + std::to_string(mt) + " ks" + std::to_string(ks), mt, ks});
    if (b.bf16) {
        for (int ks : {1, 2, 4, 8}) variants.push_back({"v3 tile ks" + std::to_string(ks), 1, ks, true, 2});
        for (int ks : {1, 2, 4, 8}) variants.push_back({"v4 tile64 ks" + std::to_string(ks), 1, ks, true, 1});
    }
    bool failed = false;
    std::printf("%-16s %3s  %-16s %9s %8s %10s\n", "shape", "n", "variant", "us", "GB/s", "max err");
    for (const Shape& sh : kShapes) {
        if (!only.empty() && std::string(sh.name).find(only) == std::string::npos) continue;
        ShapeRun run(sh, b, max_n);
        const double bytes = 2.0 * run.elems;
        for (int n : ns) {
            fill_f32<<<256, 256, 0, b.s>>>(x, int64_t{n} * sh.K, 1000 + n);
            split_rows(x, sh.K, sh.K, n, false, nullptr, 1e-6f, hl, hl + int64_t{n} * sh.K, b.s);
            const bf16 *hi = hl, *lo = hl + int64_t{n} * sh.K;
            if (b.bf16) CK(cudaMemsetAsync(hl + int64_t{n} * sh.K, 0, sizeof(bf16) * n * sh.K, b.s));
            const int nt = (n + 7) / 8;
            for (const Variant& v : variants) {
                if (v.mt > 0 && !v.tile && (v.mt * nt > 16 || nt > 8)) continue;
                if ((v.tile || (v.mt < 0 && b.bf16 && n > 16)) && !tile_gemm_fits(sh.rows[0], sh.K, n))
                    continue;
                const double worst = max_error(b, v, run, hi, lo, n, ref, mag);
                const double us = time_us(b, v, run, hi, lo, n);
                const bool bad = !(worst <= 1e-5);
                failed |= bad;
                std::printf("%-16s %3d  %-16s %9.2f %8.0f %10.2e%s\n", sh.name, n, v.name.c_str(), us,
                            bytes / us * 1e-3, worst, bad ? "  FAIL" : "");
            }
        }
    }
    std::printf(failed ? "correctness gate: FAILED\n" : "correctness gate: every variant within 1e-5\n");
    return failed ? 1 : 0;
}
