// Kernel lab for a batched decode step's attention pieces (cuda/kernels/attention_warp.cu, attention_mma.cu):
// B sequences with one query each near position 768 (the serving step's shape: 512 in, 512 out, halfway),
// over one layer's ring cache of each serving model's layer kinds, bf16 and fp8 (e4m3) rows, in the product's
// pieces of 64 keys. Variants: v0 the CUDA-core warp kernel (batch_attn=warp), v1 the tensor-core kernel (the
// product's for bf16 and fp8). Correctness gate: every output against an fp64 GPU reference of the same
// queries and cache values, max |error| / max |reference|; a variant over 2e-4 (bf16: queries and softmax
// weights as bf16 halves on the tensor cores, ~6e-5 emulated on the CPU) or 1e-2 (fp8: one f16 each; the
// random queries make scores of ~15 sigma, a peaked softmax that passes the queries' f16 rounding through:
// 3.1e-3 at d = 256 and 4.9e-3 at 512 emulated) fails the run. Timing: 20 steps
// (the pieces, then their merge) in one CUDA graph over 8 copies of the cache (so that L2 serves none of its
// rows), per-step time, median of 5 replays; GB/s = the K and V bytes the queries read / the pieces' time.
//   markbase_batch_attn_lab [--only SUBSTRING]
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/kernels/kernels.h"
#include "lab_common.cuh"

using namespace markbase::cuda;

namespace {

struct Shape {
    const char* name;
    int seqs, nH, nKV, d, window;  // window 0: a full layer
};
// The serving step's layers: 26B-A4B and E2B at 96 sequences, the 31B at 64 (what its bf16 KV held)
const Shape kShapes[] = {
    {"26b sliding", 96, 16, 8, 256, 1024},  {"26b full", 96, 16, 2, 512, 0},
    {"31b sliding", 64, 32, 16, 256, 1024}, {"31b full", 64, 32, 4, 512, 0},
    {"e2b sliding", 96, 8, 1, 256, 512},    {"e2b full", 96, 8, 1, 512, 0},
};
constexpr int kPos = 768, kCap = 1024 + 512, kKeys = 64, kCopies = 8;

// K and V rows of every slot: bf16 of uniform [-2, 2), or e4m3 of the same
__global__ void fill_cache(void* p, int64_t n, uint64_t seed, bool fp8) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
         i += int64_t{gridDim.x} * blockDim.x) {
        const float v = 2.0f * lab::uniform_pm1(seed, i);
        if (fp8)
            static_cast<uint8_t*>(p)[i] =
                static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
        else
            static_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(__float_as_uint(v) >> 16);
    }
}
__global__ void fill_f32(float* p, int64_t n, uint64_t seed) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
         i += int64_t{gridDim.x} * blockDim.x)
        p[i] = lab::uniform_pm1(seed, i);
}

__device__ double cache_at(const void* c, bool fp8, int64_t i) {
    if (fp8)
        return double(
            __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<const uint8_t*>(c)[i], __NV_E4M3))));
    return double(__uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(c)[i]) << 16));
}
// The row of slot t's position p (a ring of kCap rows per slot), head g's d values
__device__ int64_t row_at(int t, int p, int nKV, int g, int d) {
    return ((int64_t{t} * kCap + p % kCap) * nKV + g) * d;
}
// s[t][h][j] = q . k_j for the keys token t sees (lo .. pos)
__global__ void ref_scores(const float* q, const void* k, bool fp8, const int* pos, Shape sh, double* s) {
    const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
    if (i >= int64_t{sh.seqs} * sh.nH * kCap) return;
    const int j = static_cast<int>(i % kCap), h = static_cast<int>(i / kCap % sh.nH),
              t = static_cast<int>(i / kCap / sh.nH);
    const int p = pos[t], lo = sh.window ? max(0, p - sh.window + 1) : 0;
    if (j < lo || j > p) return;
    const int g = h / (sh.nH / sh.nKV);
    double acc = 0;
    for (int c = 0; c < sh.d; ++c)
        acc += double(q[(int64_t{t} * sh.nH + h) * sh.d + c]) *
               cache_at(k, fp8, row_at(t, j, sh.nKV, g, sh.d) + c);
    s[i] = acc;
}
// out[t][h][c] = softmax(s) . v
__global__ void ref_out(const double* s, const void* v, bool fp8, const int* pos, Shape sh, double* out) {
    const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
    if (i >= int64_t{sh.seqs} * sh.nH * sh.d) return;
    const int c = static_cast<int>(i % sh.d), h = static_cast<int>(i / sh.d % sh.nH),
              t = static_cast<int>(i / sh.d / sh.nH);
    const int p = pos[t], lo = sh.window ? max(0, p - sh.window + 1) : 0, g = h / (sh.nH / sh.nKV);
    const double* row = s + (int64_t{t} * sh.nH + h) * kCap;
    double m = -1e300, l = 0, acc = 0;
    for (int j = lo; j <= p; ++j) m = fmax(m, row[j]);
    for (int j = lo; j <= p; ++j) {
        const double e = exp(row[j] - m);
        l += e;
        acc += e * cache_at(v, fp8, row_at(t, j, sh.nKV, g, sh.d) + c);
    }
    out[i] = acc / l;
}

template <class T>
T* dalloc(int64_t n) {
    T* p = nullptr;
    CK(cudaMalloc(&p, sizeof(T) * static_cast<size_t>(n)));
    return p;
}

}  // namespace

int main(int argc, char** argv) {
    const char* only = argc > 2 && std::strcmp(argv[1], "--only") == 0 ? argv[2] : nullptr;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device %s, %d SMs; positions %d..%d, pieces of %d keys\n", prop.name,
                prop.multiProcessorCount, kPos - 8, kPos + 8, kKeys);
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    int failures = 0;
    std::printf("%-12s %-5s %-10s %10s %10s %9s %10s\n", "layer", "kv", "variant", "pieces us", "step us",
                "GB/s", "max err");
    for (const Shape& sh : kShapes) {
        if (only && !std::strstr(sh.name, only)) continue;
        const int64_t row = int64_t{sh.nKV} * sh.d, slot_elems = int64_t{kCap} * row;
        const int64_t cache_elems = int64_t{sh.seqs} * slot_elems;
        std::vector<int> pos(sh.seqs), slot(sh.seqs);
        int64_t keys = 0;
        for (int t = 0; t < sh.seqs; ++t) {
            pos[t] = kPos - 8 + (t * 7) % 17;  // 760 .. 776: the pieces end unevenly
            slot[t] = t;
            keys += pos[t] + 1 - (sh.window ? std::max(0, pos[t] - sh.window + 1) : 0);
        }
        int *d_pos = dalloc<int>(sh.seqs), *d_slot = dalloc<int>(sh.seqs);
        CK(cudaMemcpy(d_pos, pos.data(), sizeof(int) * sh.seqs, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d_slot, slot.data(), sizeof(int) * sh.seqs, cudaMemcpyHostToDevice));
        const int nsplit = (kPos + 8 + kKeys) / kKeys;
        float* q = dalloc<float>(int64_t{sh.seqs} * sh.nH * sh.d);
        float* part_o = dalloc<float>(int64_t{sh.seqs} * sh.nH * nsplit * sh.d);
        float* part_ml = dalloc<float>(int64_t{sh.seqs} * sh.nH * nsplit * 2);
        float* out = dalloc<float>(int64_t{sh.seqs} * sh.nH * sh.d);
        double* sc = dalloc<double>(int64_t{sh.seqs} * sh.nH * kCap);
        double* ref = dalloc<double>(int64_t{sh.seqs} * sh.nH * sh.d);
        fill_f32<<<1024, 256, 0, s>>>(q, int64_t{sh.seqs} * sh.nH * sh.d, 11);
        for (const bool fp8 : {false, true}) {
            const int64_t bytes = fp8 ? 1 : 2;
            std::vector<char*> k(kCopies), v(kCopies);
            for (int c = 0; c < kCopies; ++c) {
                k[c] = dalloc<char>(cache_elems * bytes);
                v[c] = dalloc<char>(cache_elems * bytes);
                fill_cache<<<4096, 256, 0, s>>>(k[c], cache_elems, 100 + c, fp8);
                fill_cache<<<4096, 256, 0, s>>>(v[c], cache_elems, 200 + c, fp8);
            }
            CK(cudaMemsetAsync(sc, 0, sizeof(double) * sh.seqs * sh.nH * kCap, s));
            const int64_t ns = int64_t{sh.seqs} * sh.nH * kCap, no = int64_t{sh.seqs} * sh.nH * sh.d;
            ref_scores<<<(ns + 255) / 256, 256, 0, s>>>(q, k[0], fp8, d_pos, sh, sc);
            ref_out<<<(no + 255) / 256, 256, 0, s>>>(sc, v[0], fp8, d_pos, sh, ref);
            std::vector<double> want(no);
            CK(cudaMemcpy(want.data(), ref, sizeof(double) * no, cudaMemcpyDeviceToHost));
            const double kv_gb = 2.0 * double(keys) * row * bytes / 1e9;
            for (const bool mma : {false, true}) {
                AttnArgs a;
                a.q = q;
                a.kv = fp8 ? KvElem::kFp8 : KvElem::kBf16;
                a.cap = kCap;
                a.nH = sh.nH;
                a.nKV = sh.nKV;
                a.d = sh.d;
                a.window = sh.window;
                a.tok_pos = d_pos;
                a.tok_slot = d_slot;
                a.nsplit = nsplit;
                a.split_len = kKeys;
                a.part_o = part_o;
                a.part_ml = part_ml;
                a.out = out;
                a.mma = mma;
                auto args = [&](int c) {
                    AttnArgs b = a;
                    b.k_cache = k[c];
                    b.v_cache = v[c];
                    return b;
                };
                attention(args(0), sh.seqs, s);
                std::vector<float> got(no);
                CK(cudaMemcpy(got.data(), out, sizeof(float) * no, cudaMemcpyDeviceToHost));
                double e = 0, m = 0;
                for (int64_t i = 0; i < no; ++i) {
                    e = std::max(e, std::isfinite(got[i]) ? std::fabs(double(got[i]) - want[i]) : 1e30);
                    m = std::max(m, std::fabs(want[i]));
                }
                const double err = e / m, bound = fp8 && mma ? 1e-2 : 2e-4;
                auto time = [&](bool merge) {
                    cudaGraph_t g;
                    cudaGraphExec_t ge;
                    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
                    for (int r = 0; r < 20; ++r) {
                        const AttnArgs b = args(r % kCopies);
                        attention_pieces(b, sh.seqs, s);
                        if (merge) attention_combine(b, sh.seqs, s);
                    }
                    CK(cudaStreamEndCapture(s, &g));
                    CK(cudaGraphInstantiate(&ge, g, 0));
                    const float ms = lab::time_ms(5, s, [&] { CK(cudaGraphLaunch(ge, s)); });
                    CK(cudaGraphExecDestroy(ge));
                    CK(cudaGraphDestroy(g));
                    return ms / 20;
                };
                const float pieces = time(false), step = time(true);
                std::printf("%-12s %-5s %-10s %10.2f %10.2f %9.0f %10.2e%s\n", sh.name, fp8 ? "fp8" : "bf16",
                            mma ? "v1 mma" : "v0 warp", pieces * 1e3, step * 1e3, kv_gb / (pieces * 1e-3),
                            err, err > bound ? "  FAIL" : "");
                failures += err > bound;
            }
            for (int c = 0; c < kCopies; ++c) {
                CK(cudaFree(k[c]));
                CK(cudaFree(v[c]));
            }
        }
        for (void* p : {static_cast<void*>(d_pos), static_cast<void*>(d_slot), static_cast<void*>(q),
                        static_cast<void*>(part_o), static_cast<void*>(part_ml), static_cast<void*>(out),
                        static_cast<void*>(sc), static_cast<void*>(ref)})
            CK(cudaFree(p));
    }
    std::printf("%s: %d variant(s) over the bound\n", failures ? "FAIL" : "ok", failures);
    return failures ? 1 : 0;
}
