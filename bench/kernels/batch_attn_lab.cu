// Kernel lab for decode's attention pieces (cuda/kernels/attention_warp.cu, attention_mma.cu, attention.cu):
// B sequences with one query each near position P (default: the serving step's shape, 96 sequences near 768:
// 512 in, 512 out, halfway), over one layer's cache of each serving model's layer kinds, fp32, bf16 and fp8
// (e4m3) rows. Variants: v0 the CUDA-core warp kernel (batch_attn=warp) and v1 the tensor-core kernel (the
// product's for bf16 and fp8), both in the batched step's fixed pieces of K keys with a separate merge; with
// one sequence also v2, the one-sequence decode graph's kernel (split_len 0: the range in as many pieces as
// the product's plan gives a head, CudaModel's decode_splits, merged by the last piece), the only one over
// fp32 rows (the one-sequence default). Correctness gate: every output against an fp64 GPU reference of the
// same queries and cache values, max |error| / max |reference|; a variant over 2e-4 (bf16: queries and
// softmax weights as bf16 halves on the tensor cores, ~6e-5 emulated on the CPU) or 1e-2 (v1 over fp8: one
// f16 each; the random queries make scores of ~15 sigma, a peaked softmax that passes the queries' f16
// rounding through: 3.1e-3 at d = 256 and 4.9e-3 at 512 emulated) fails the run. Timing: 20 steps (the
// pieces, then their merge) in one CUDA graph over 8 copies of the cache (so that L2 serves none of its
// rows), per-step time, median of 5 replays; GB/s = the K and V bytes the queries read / the pieces' time.
//   markbase_batch_attn_lab [--only SUBSTRING] [--seqs B] [--pos P] [--keys K]
// (--seqs 1 --pos 32768 --keys 256: the long-context decode of one sequence, the batched-step issue's row)
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/kernels/kernels.h"
#include "lab_common.cuh"
#include "loading/memory_plan.h"

using namespace markbase::cuda;

namespace {

struct Shape {
    const char* name;
    int seqs, nH, nKV, d, window;  // window 0: a full layer
};
// What the command line sets: sequences (0: each shape's), the query positions' middle, the pieces' keys
struct Opts {
    const char* only = nullptr;
    int seqs = 0, pos = 768, keys = 64;
    int cap() const { return pos + 8 + 1 + 512; }  // no ring wrap for a full layer; past every window
};
// The serving step's layers: 26B-A4B and E2B at 96 sequences, the 31B at 64 (what its bf16 KV held)
const Shape kShapes[] = {
    {"26b sliding", 96, 16, 8, 256, 1024},  {"26b full", 96, 16, 2, 512, 0},
    {"31b sliding", 64, 32, 16, 256, 1024}, {"31b full", 64, 32, 4, 512, 0},
    {"e2b sliding", 96, 8, 1, 256, 512},    {"e2b full", 96, 8, 1, 512, 0},
};
constexpr int kCopies = 8;

int elem_bytes(KvElem e) {
    return e == KvElem::kF32 ? 4 : e == KvElem::kBf16 ? 2 : 1;
}
const char* elem_name(KvElem e) {
    return e == KvElem::kF32 ? "f32" : e == KvElem::kBf16 ? "bf16" : "fp8";
}

// K and V rows of every slot: uniform [-2, 2) in fp32, or rounded to bf16 or e4m3
__global__ void fill_cache(void* p, int64_t n, uint64_t seed, KvElem e) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
         i += int64_t{gridDim.x} * blockDim.x) {
        const float v = 2.0f * lab::uniform_pm1(seed, i);
        if (e == KvElem::kFp8)
            static_cast<uint8_t*>(p)[i] =
                static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
        else if (e == KvElem::kBf16)
            static_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(__float_as_uint(v) >> 16);
        else
            static_cast<float*>(p)[i] = v;
    }
}
__global__ void fill_f32(float* p, int64_t n, uint64_t seed) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
         i += int64_t{gridDim.x} * blockDim.x)
        p[i] = lab::uniform_pm1(seed, i);
}

__device__ double cache_at(const void* c, KvElem e, int64_t i) {
    if (e == KvElem::kFp8)
        return double(
            __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<const uint8_t*>(c)[i], __NV_E4M3))));
    if (e == KvElem::kBf16)
        return double(__uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(c)[i]) << 16));
    return double(static_cast<const float*>(c)[i]);
}
// The row of slot t's position p (a ring of cap rows per slot), head g's d values
__device__ int64_t row_at(int t, int p, int cap, int nKV, int g, int d) {
    return ((int64_t{t} * cap + p % cap) * nKV + g) * d;
}
// s[t][h][j] = q . k_j for the keys token t sees (lo .. pos)
__global__ void ref_scores(const float* q, const void* k, KvElem e, const int* pos, Shape sh, int cap,
                           double* s) {
    const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
    if (i >= int64_t{sh.seqs} * sh.nH * cap) return;
    const int j = static_cast<int>(i % cap), h = static_cast<int>(i / cap % sh.nH),
              t = static_cast<int>(i / cap / sh.nH);
    const int p = pos[t], lo = sh.window ? max(0, p - sh.window + 1) : 0;
    if (j < lo || j > p) return;
    const int g = h / (sh.nH / sh.nKV);
    double acc = 0;
    for (int c = 0; c < sh.d; ++c)
        acc += double(q[(int64_t{t} * sh.nH + h) * sh.d + c]) *
               cache_at(k, e, row_at(t, j, cap, sh.nKV, g, sh.d) + c);
    s[i] = acc;
}
// out[t][h][c] = softmax(s) . v
__global__ void ref_out(const double* s, const void* v, KvElem kind, const int* pos, Shape sh, int cap,
                        double* out) {
    const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
    if (i >= int64_t{sh.seqs} * sh.nH * sh.d) return;
    const int c = static_cast<int>(i % sh.d), h = static_cast<int>(i / sh.d % sh.nH),
              t = static_cast<int>(i / sh.d / sh.nH);
    const int p = pos[t], lo = sh.window ? max(0, p - sh.window + 1) : 0, g = h / (sh.nH / sh.nKV);
    const double* row = s + (int64_t{t} * sh.nH + h) * cap;
    double m = -1e300, l = 0, acc = 0;
    for (int j = lo; j <= p; ++j) m = fmax(m, row[j]);
    for (int j = lo; j <= p; ++j) {
        const double e = exp(row[j] - m);
        l += e;
        acc += e * cache_at(v, kind, row_at(t, j, cap, sh.nKV, g, sh.d) + c);
    }
    out[i] = acc / l;
}

template <class T>
T* dalloc(int64_t n) {
    T* p = nullptr;
    CK(cudaMalloc(&p, sizeof(T) * static_cast<size_t>(n)));
    return p;
}

enum class Variant { kWarp, kMma, kDecode };
const char* variant_name(Variant v) {
    return v == Variant::kWarp ? "v0 warp" : v == Variant::kMma ? "v1 mma" : "v2 decode";
}

// One shape's buffers: positions and slots, the queries, the pieces' scratch, the output, the reference's
struct Bufs {
    int *pos = nullptr, *slot = nullptr;
    float *q = nullptr, *part_o = nullptr, *part_ml = nullptr, *out = nullptr;
    unsigned int* counters = nullptr;  // v2: [nH] zeroed; the last piece of a head resets its own
    double *sc = nullptr, *ref = nullptr;
    int nsplit = 0, decode_splits = 0;
};

AttnArgs args_for(Variant v, const Shape& sh, const Opts& o, KvElem e, const Bufs& b) {
    AttnArgs a;
    a.q = b.q;
    a.kv = e;
    a.cap = o.cap();
    a.nH = sh.nH;
    a.nKV = sh.nKV;
    a.d = sh.d;
    a.window = sh.window;
    a.part_o = b.part_o;
    a.part_ml = b.part_ml;
    a.out = b.out;
    if (v == Variant::kDecode) {  // the one-sequence graph's: positions from pos_base, the ticket's merge
        a.pos_base = b.pos;
        a.nsplit = b.decode_splits;
        a.split_len = 0;
        a.min_split = kAttnMinKeys;
        a.merge_counters = b.counters;
        return a;
    }
    a.tok_pos = b.pos;
    a.tok_slot = b.slot;
    a.nsplit = b.nsplit;
    a.split_len = o.keys;
    a.mma = v == Variant::kMma;
    return a;
}

// One variant over one cache kind: its error against the reference (want), then its time; returns whether
// it failed the bound.
bool run_variant(Variant v, const Shape& sh, const Opts& o, KvElem e, const Bufs& b,
                 const std::vector<char*>& k, const std::vector<char*>& vc, const std::vector<double>& want,
                 double kv_gb, cudaStream_t s) {
    const int seqs = static_cast<int>(want.size() / (int64_t{sh.nH} * sh.d));
    auto args = [&](int c) {
        AttnArgs a = args_for(v, sh, o, e, b);
        a.k_cache = k[c];
        a.v_cache = vc[c];
        return a;
    };
    attention(args(0), seqs, s);
    std::vector<float> got(want.size());
    CK(cudaMemcpy(got.data(), b.out, sizeof(float) * got.size(), cudaMemcpyDeviceToHost));
    double err = 0, m = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        err = std::max(err, std::isfinite(got[i]) ? std::fabs(double(got[i]) - want[i]) : 1e30);
        m = std::max(m, std::fabs(want[i]));
    }
    err /= m;
    const double bound = e == KvElem::kFp8 && v == Variant::kMma ? 1e-2 : 2e-4;
    auto time = [&](bool merge) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        for (int r = 0; r < 20; ++r) {
            const AttnArgs a = args(r % kCopies);
            attention_pieces(a, seqs, s);
            if (merge && v != Variant::kDecode) attention_combine(a, seqs, s);
        }
        CK(cudaStreamEndCapture(s, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        const float ms = lab::time_ms(5, s, [&] { CK(cudaGraphLaunch(ge, s)); });
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
        return ms / 20;
    };
    const float pieces = time(false), step = time(true);
    const int np = v == Variant::kDecode ? b.decode_splits : b.nsplit;
    std::printf("%-12s %-5s %-10s %6d %10.2f %10.2f %9.0f %10.2e%s\n", sh.name, elem_name(e), variant_name(v),
                np, pieces * 1e3, step * 1e3, kv_gb / (pieces * 1e-3), err, err > bound ? "  FAIL" : "");
    return err > bound;
}

// Every variant of one shape over every cache kind it takes; returns the failures
int run_shape(Shape sh, const Opts& o, int sms, cudaStream_t s) {
    if (o.seqs > 0) sh.seqs = o.seqs;
    const int cap = o.cap();
    const int64_t row = int64_t{sh.nKV} * sh.d, cache_elems = int64_t{sh.seqs} * cap * row;
    std::vector<int> pos(sh.seqs), slot(sh.seqs);
    int64_t keys = 0;
    for (int t = 0; t < sh.seqs; ++t) {
        pos[t] = o.pos - 8 + (t * 7) % 17;  // P - 8 .. P + 8: the pieces end unevenly
        slot[t] = t;
        keys += pos[t] + 1 - (sh.window ? std::max(0, pos[t] - sh.window + 1) : 0);
    }
    Bufs b;
    b.nsplit = (o.pos + 9 + o.keys - 1) / o.keys;
    b.decode_splits = markbase::decode_attention_splits(sh.window ? sh.window : o.pos + 9, sh.nH, sms);
    const int64_t pieces = std::max(b.nsplit, b.decode_splits);
    const int64_t nq = int64_t{sh.seqs} * sh.nH * sh.d, ns = int64_t{sh.seqs} * sh.nH * cap;
    b.pos = dalloc<int>(sh.seqs);
    b.slot = dalloc<int>(sh.seqs);
    b.q = dalloc<float>(nq);
    b.part_o = dalloc<float>(nq * pieces);
    b.part_ml = dalloc<float>(int64_t{sh.seqs} * sh.nH * pieces * 2);
    b.out = dalloc<float>(nq);
    b.counters = dalloc<unsigned int>(sh.nH);
    b.sc = dalloc<double>(ns);
    b.ref = dalloc<double>(nq);
    CK(cudaMemcpy(b.pos, pos.data(), sizeof(int) * sh.seqs, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b.slot, slot.data(), sizeof(int) * sh.seqs, cudaMemcpyHostToDevice));
    CK(cudaMemset(b.counters, 0, sizeof(unsigned int) * sh.nH));
    fill_f32<<<1024, 256, 0, s>>>(b.q, nq, 11);
    int failures = 0;
    for (const KvElem e : {KvElem::kF32, KvElem::kBf16, KvElem::kFp8}) {
        std::vector<Variant> vs;
        if (e != KvElem::kF32) vs = {Variant::kWarp, Variant::kMma};
        if (sh.seqs == 1) vs.push_back(Variant::kDecode);  // the one-sequence graph's kernel
        if (vs.empty()) continue;
        const int64_t bytes = elem_bytes(e);
        std::vector<char*> k(kCopies), v(kCopies);
        for (int c = 0; c < kCopies; ++c) {
            k[c] = dalloc<char>(cache_elems * bytes);
            v[c] = dalloc<char>(cache_elems * bytes);
            fill_cache<<<4096, 256, 0, s>>>(k[c], cache_elems, 100 + c, e);
            fill_cache<<<4096, 256, 0, s>>>(v[c], cache_elems, 200 + c, e);
        }
        CK(cudaMemsetAsync(b.sc, 0, sizeof(double) * ns, s));
        ref_scores<<<(ns + 255) / 256, 256, 0, s>>>(b.q, k[0], e, b.pos, sh, cap, b.sc);
        ref_out<<<(nq + 255) / 256, 256, 0, s>>>(b.sc, v[0], e, b.pos, sh, cap, b.ref);
        std::vector<double> want(nq);
        CK(cudaMemcpy(want.data(), b.ref, sizeof(double) * nq, cudaMemcpyDeviceToHost));
        const double kv_gb = 2.0 * double(keys) * row * bytes / 1e9;
        for (const Variant var : vs) failures += run_variant(var, sh, o, e, b, k, v, want, kv_gb, s);
        for (int c = 0; c < kCopies; ++c) {
            CK(cudaFree(k[c]));
            CK(cudaFree(v[c]));
        }
    }
    for (void* p : {static_cast<void*>(b.pos), static_cast<void*>(b.slot), static_cast<void*>(b.q),
                    static_cast<void*>(b.part_o), static_cast<void*>(b.part_ml), static_cast<void*>(b.out),
                    static_cast<void*>(b.counters), static_cast<void*>(b.sc), static_cast<void*>(b.ref)})
        CK(cudaFree(p));
    return failures;
}

Opts parse(int argc, char** argv) {
    Opts o;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string f = argv[i];
        if (f == "--only")
            o.only = argv[i + 1];
        else if (f == "--seqs")
            o.seqs = std::atoi(argv[i + 1]);
        else if (f == "--pos")
            o.pos = std::atoi(argv[i + 1]);
        else if (f == "--keys")
            o.keys = std::atoi(argv[i + 1]);
        else
            std::fprintf(stderr, "unknown flag %s\n", argv[i]), std::exit(2);
    }
    if (o.seqs < 0 || o.pos < 16 || o.keys < 16)
        std::fprintf(stderr, "bad --seqs/--pos/--keys\n"), std::exit(2);
    return o;
}

}  // namespace

int main(int argc, char** argv) {
    const Opts o = parse(argc, argv);
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device %s, %d SMs; positions %d..%d, batched pieces of %d keys\n", prop.name,
                prop.multiProcessorCount, o.pos - 8, o.pos + 8, o.keys);
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    int failures = 0;
    std::printf("%-12s %-5s %-10s %6s %10s %10s %9s %10s\n", "layer", "kv", "variant", "pieces", "pieces us",
                "step us", "GB/s", "max err");
    for (const Shape& sh : kShapes)
        if (!o.only || std::strstr(sh.name, o.only))
            failures += run_shape(sh, o, prop.multiProcessorCount, s);
    std::printf("%s: %d variant(s) over the bound\n", failures ? "FAIL" : "ok", failures);
    return failures ? 1 : 0;
}
