// Kernel lab for the prefill attention: the production launchers on each Gemma 4 variant's sliding and full
// layer shapes, at every chunk of a long prompt (pos0 = 0, 512, ..., as a prefill of chunks x 512 tokens runs
// them), in four modes:
//   fp32    the product's attention_gemm() (src/cuda/kernels/attention_gemm.cu), fp32 products
//   tf32    attn_gemm_variants.cuh, TF32 products
//   bf16x3  attn_gemm_variants.cuh, bf16 tensor cores over hi/lo halves (key ranges over 2048 slots: fp32)
//   blk128  attn_gemm_variants.cuh, fp32, causal row blocks of 128 queries while the ring has not wrapped
// Correctness gate: each mode's output against fp32's, max |diff| / max |fp32| (blk128 should be ~1e-6,
// bf16x3 a few 1e-6, tf32 ~1e-4). Timing: CUDA events around one call, median of 10. Written to find why
// bf16x3 lost 42% on E2B's 4096-token prefill while winning at 512 tokens (docs/performance.md). (The
// CUDA-core pieces the GEMMs replaced at prefill were a fifth mode; their prefill form is in the history.)
//   markbase_attn_lab [--only SUBSTRING] [--chunks N]
// Q, K and V are drawn on the GPU from a counter hash (uniform [-1, 1)): the cache holds random rows, and
// only the masks depend on pos0.
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

#include "attn_gemm_variants.cuh"
#include "cuda/kernels/kernels.h"
#include "lab_common.cuh"

namespace {

using attn_lab::LabGemm;
using markbase::cuda::AttnArgs;

constexpr int kChunk = 512;
constexpr int64_t kKeys = 2048;  // memory_plan.h kAttnGemmKeys

__global__ void fill_kernel(float* x, int64_t n, uint64_t seed) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
         i += int64_t{gridDim.x} * blockDim.x)
        x[i] = lab::uniform_pm1(seed, i);
}

template <class T>
T* dalloc(int64_t n) {
    void* p = nullptr;
    CK(cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(T)));
    return static_cast<T*>(p);
}

void fill(float* x, int64_t n, uint64_t seed) {
    fill_kernel<<<1024, 256>>>(x, n, seed);
    CK(cudaGetLastError());
}

struct Shape {
    const char* name;
    int nH, nKV, d, window;  // window 0: a full layer
};

double max_rel(const std::vector<float>& ref, const std::vector<float>& got) {
    double mx = 0, diff = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        mx = std::max(mx, static_cast<double>(std::fabs(ref[i])));
        if (!std::isfinite(got[i])) return INFINITY;
        diff = std::max(diff, static_cast<double>(std::fabs(ref[i] - got[i])));
    }
    return mx > 0 ? diff / mx : diff;
}

}  // namespace

int main(int argc, char** argv) {
    std::string only;
    int chunks = 8;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else if (!std::strcmp(argv[i], "--chunks") && i + 1 < argc)
            chunks = std::max(1, std::atoi(argv[++i]));
    }
    const std::vector<Shape> shapes = {{"e2b-sliding", 8, 1, 256, 512},       {"e2b-full", 8, 1, 512, 0},
                                       {"e4b-sliding", 8, 2, 256, 512},       {"e4b-full", 8, 2, 512, 0},
                                       {"26b-a4b-sliding", 16, 8, 256, 1024}, {"26b-a4b-full", 16, 2, 512, 0},
                                       {"31b-sliding", 32, 16, 256, 1024},    {"31b-full", 32, 4, 512, 0}};
    const char* modes[] = {"fp32", "tf32", "bf16x3", "blk128"};
    cublasHandle_t blas = nullptr;
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
        std::fprintf(stderr, "cublasCreate failed\n");
        return 1;
    }
    cudaStream_t st = nullptr;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cublasSetStream(blas, st);
    std::printf("prefill attention, chunks of %d tokens; ms per call (median of 10), error against fp32\n",
                kChunk);
    std::printf("%-16s %6s %6s", "shape", "pos0", "keys");
    for (const char* m : modes) std::printf(" %9s", m);
    std::printf("   err:   tf32  bf16x3  blk128\n");
    for (const Shape& sh : shapes) {
        if (!only.empty() && std::string(sh.name).find(only) == std::string::npos) continue;
        const int n = kChunk, d = sh.d;
        const int64_t ctx = int64_t{chunks} * kChunk;
        const int64_t cap = sh.window ? std::min<int64_t>(ctx, sh.window + kChunk) : ctx;
        const int64_t keys = std::min<int64_t>(ctx, std::max<int64_t>(kKeys, sh.window + kChunk));
        float* q = dalloc<float>(int64_t{n} * sh.nH * d);
        float* k = dalloc<float>(cap * sh.nKV * d);
        float* v = dalloc<float>(cap * sh.nKV * d);
        float* out = dalloc<float>(int64_t{n} * sh.nH * d);
        int* pos = dalloc<int>(1);
        LabGemm g;
        g.blas = blas;
        g.s_floats = int64_t{n} * sh.nH * keys;
        g.s = dalloc<float>(g.s_floats);
        g.ptrs = dalloc<void*>(6 * sh.nH);
        g.keys3 = keys;
        g.q3 = dalloc<uint16_t>(3 * int64_t{n} * sh.nH * d);
        g.k3 = dalloc<uint16_t>(3 * keys * sh.nKV * d);
        g.v3 = dalloc<uint16_t>(3 * keys * sh.nKV * d);
        g.p3 = dalloc<uint16_t>(3 * g.s_floats);
        fill(q, int64_t{n} * sh.nH * d, 1);
        fill(k, cap * sh.nKV * d, 2);
        fill(v, cap * sh.nKV * d, 3);
        for (int c = 0; c < chunks; ++c) {
            const int64_t pos0 = int64_t{c} * kChunk;
            const int p0 = static_cast<int>(pos0);
            CK(cudaMemcpy(pos, &p0, sizeof(int), cudaMemcpyHostToDevice));
            AttnArgs a;
            a.q = q;
            a.k_cache = k;
            a.v_cache = v;
            a.kv = markbase::cuda::KvElem::kF32;  // the lab's cache is fp32
            a.cap = cap;
            a.nH = sh.nH;
            a.nKV = sh.nKV;
            a.d = d;
            a.window = sh.window;
            a.pos_base = pos;
            a.out = out;
            std::vector<float> ref, got(static_cast<size_t>(n) * sh.nH * d);
            double ms[4], err[4];
            for (const int m : {0, 1, 2, 3}) {  // fp32 (the product) first: the reference
                LabGemm gm = g;
                gm.tf32 = m == 1;
                gm.bf16x3 = m == 2;
                gm.block_rows = m == 3 ? 128 : 0;
                markbase::cuda::AttnGemm prod;
                prod.blas = g.blas;
                prod.s = g.s;
                prod.s_floats = g.s_floats;
                prod.ptrs = g.ptrs;
                auto call = [&] {
                    if (m == 0)
                        markbase::cuda::attention_gemm(a, n, pos0, prod, st);
                    else if (!attn_lab::attention_gemm_variant(a, n, pos0, gm, st))
                        std::fprintf(stderr, "%s: attention_gemm_variant declined\n", sh.name);
                };
                ms[m] = lab::time_ms(10, st, call);  // (its warm-up: cuBLAS heuristics, module loading)
                CK(cudaMemcpy(got.data(), out, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
                if (m == 0) ref = got;
                err[m] = m == 0 ? 0 : max_rel(ref, got);
            }
            std::printf("%-16s %6lld %6lld", sh.name, static_cast<long long>(pos0),
                        static_cast<long long>(std::min<int64_t>(cap, pos0 + n)));
            for (int m = 0; m < 4; ++m) std::printf(" %9.3f", ms[m]);
            std::printf("   %.1e %.1e %.1e\n", err[1], err[2], err[3]);
        }
        for (void* p : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v),
                        static_cast<void*>(out), static_cast<void*>(pos), static_cast<void*>(g.s),
                        static_cast<void*>(g.ptrs), static_cast<void*>(g.q3), static_cast<void*>(g.k3),
                        static_cast<void*>(g.v3), static_cast<void*>(g.p3)})
            CK(cudaFree(p));
    }
    cublasDestroy(blas);
    CK(cudaStreamDestroy(st));
    return 0;
}
