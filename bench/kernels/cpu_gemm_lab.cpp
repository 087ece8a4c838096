// Kernel lab for the CPU prefill matmul (n >= 48 tokens): y = x w^T, w bf16 [out][in] (HF layout), x and y
// fp32. A scalar reference (fp32 products summed in fp64), the product's kernel (cpu::matmul_bf16: outer
// products over x transposed once, src/cpu/matmul_kernels.h rows_blocked), numbered variants, a correctness
// gate and a GFLOP/s sweep over the matrices of an E2B prompt at 64, 256 and 512 tokens, on 1 and 2 threads,
// each cell also shown as a share of the FMA ceiling that cpu::measure_fma_peak_gflops measures with the same
// pool (the bf16 unit's ceiling, AMX where present, else the dot product, is printed beside it). The gate of
// v3 and v4 allows x's rounding to bf16 (2^-9 of each product).
//   markbase_cpu_gemm_lab [--gate] [--reps N] [--threads N]...
// --gate checks every variant against the reference on shapes that cross every blocking boundary and exits
// (ctest runs it). A cell is the median of --reps (default 5) timed calls, the variants interleaved call by
// call.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cpu/matmul.h"
#include "cpu/memory_bandwidth.h"
#include "cpu/thread_pool.h"
#include "cpu_lab_random.h"
#include "model/bf16.h"

namespace {

using markbase::bf16;
using markbase::cpu::ThreadPool;
namespace mc = markbase::cpu;

struct Problem {
    const float* x;  // [n][in]
    const bf16* w;   // [out][in]
    int64_t n, in, out;
};

using VariantFn = void (*)(ThreadPool& pool, const Problem& p, float* y);

struct Variant {
    const char* name;
    const char* what;
    VariantFn fn;
};

void v0_product(ThreadPool& pool, const Problem& p, float* y) {
    mc::matmul_bf16(pool, p.x, p.n, p.in, p.w, p.out, y);
}

// The direct kernel at every n: dot-product tiles over bf16 weights read in place (what n < 48 runs).
void v1_direct(ThreadPool& pool, const Problem& p, float* y) {
    mc::matmul_bf16_rowwise(pool, p.x, p.n, p.in, p.w, p.out, y);
}

#if defined(__x86_64__)
void v3_dot_bf16(ThreadPool& pool, const Problem& p, float* y) {
    mc::matmul_bf16_pairs_on(mc::PairPath::kDot, pool, p.x, p.n, p.in, p.w, p.out, y);
}

void v4_amx_bf16(ThreadPool& pool, const Problem& p, float* y) {
    mc::matmul_bf16_pairs_on(mc::PairPath::kAmx, pool, p.x, p.n, p.in, p.w, p.out, y);
}

void v2_product_avx2(ThreadPool& pool, const Problem& p, float* y) {
    mc::matmul_bf16_on(mc::SimdPath::Avx2, pool, p.x, p.n, p.in, p.w, p.out, y);
}
#endif

const Variant kVariants[] = {
    {"v0", "product: outer products, 6 rows x 64 tokens, x^T once per matmul", v0_product},
    {"v1", "the direct kernel at every n (dot-product tiles on bf16 in place)", v1_direct},
#if defined(__x86_64__)
    {"v2", "product on the AVX2 path (6 rows x 16 tokens)", v2_product_avx2},
    {"v3", "bf16 products on vdpbf16ps (AVX-512-BF16: x rounded to bf16 pairs, 6 rows x 64 tokens)",
     v3_dot_bf16},
    {"v4", "bf16 products on the AMX tile unit (the same pairs; 32 rows x 32 tokens of C in four tiles)",
     v4_amx_bf16},
#endif
};

bool runs_here(const Variant& v) {
#if defined(__x86_64__)
    if (std::string(v.name) == "v2") {
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    if (std::string(v.name) == "v3" || std::string(v.name) == "v4") {
        const auto paths = mc::supported_pair_paths();
        const mc::PairPath want = std::string(v.name) == "v3" ? mc::PairPath::kDot : mc::PairPath::kAmx;
        return std::find(paths.begin(), paths.end(), want) != paths.end();
    }
#endif
    (void)v;
    return true;
}

struct Data {
    std::vector<float> x;
    std::vector<bf16> w;
    Problem p() const { return {x.data(), w.data(), n, in, out}; }
    int64_t n, in, out;
};

Data make_data(int64_t n, int64_t in, int64_t out, uint64_t seed) {
    Data d{{}, {}, n, in, out};
    d.x.resize(static_cast<size_t>(n * in));
    d.w.resize(static_cast<size_t>(out * in));
    for (size_t i = 0; i < d.x.size(); ++i) d.x[i] = lab::hash_unit(seed * 1000003 + i);
    for (size_t i = 0; i < d.w.size(); ++i)
        d.w[i] = markbase::float_to_bf16(0.05f * lab::hash_unit(~seed + 7 * i));
    return d;
}

// Every variant within 1e-5 of sum |w x| of the fp64 reference, on shapes crossing every blocking boundary
// (token tiles and their pairs, input blocks of 1024, groups of 6 rows, with tails).
bool gate(ThreadPool& pool) {
    const int64_t shapes[][3] = {{130, 1537, 67}, {70, 1031, 97},  {200, 2100, 13}, {48, 300, 7},
                                 {64, 64, 6},     {130, 2112, 67}, {70, 1056, 40}};
    bool ok = true;
    for (const auto& s : shapes) {
        const Data d = make_data(s[0], s[1], s[2], static_cast<uint64_t>(s[0] * 31 + s[2]));
        std::vector<double> ref(static_cast<size_t>(d.n * d.out)), mag(ref.size());
        for (int64_t t = 0; t < d.n; ++t)
            for (int64_t o = 0; o < d.out; ++o) {
                double acc = 0, m = 0;
                for (int64_t i = 0; i < d.in; ++i) {
                    const double v = double(d.x[t * d.in + i]) * markbase::bf16_to_float(d.w[o * d.in + i]);
                    acc += v;
                    m += std::fabs(v);
                }
                ref[t * d.out + o] = acc;
                mag[t * d.out + o] = m;
            }
        for (const Variant& v : kVariants) {
            if (!runs_here(v)) continue;
            // the bf16 units take pairs of inputs, AMX whole tiles of 32
            if ((std::string(v.name) == "v3" && d.in % 2) || (std::string(v.name) == "v4" && d.in % 32))
                continue;
            std::vector<float> y(ref.size(), NAN);
            v.fn(pool, d.p(), y.data());
            double worst = 0;
            for (size_t i = 0; i < y.size(); ++i) {
                const double e =
                    std::isfinite(y[i]) ? std::fabs(y[i] - ref[i]) / std::max(mag[i], 1e-30) : 1e30;
                worst = std::max(worst, e);
            }
            // x rounded to bf16 moves each product by up to 2^-9 of itself
            const bool pass = worst <= (std::string(v.name) >= "v3" ? 2.5e-3 : 1e-5);
            ok = ok && pass;
            if (!pass)
                std::printf("gate FAIL %s n=%lld in=%lld out=%lld: %.3g of sum|wx|\n", v.name,
                            static_cast<long long>(d.n), static_cast<long long>(d.in),
                            static_cast<long long>(d.out), worst);
        }
    }
    return ok;
}

double seconds(ThreadPool& pool, const Variant& v, const Problem& p, float* y) {
    const auto t0 = std::chrono::steady_clock::now();
    v.fn(pool, p, y);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// An E2B prompt's matrices (src/model/variants.cpp's e2b), each with the number of its kind per token.
struct Shape {
    const char* name;
    int64_t out, in;
};
const Shape kShapes[] = {{"q_proj slide", 2048, 1536},
                         {"o_proj slide", 1536, 2048},
                         {"gate/up 2x", 12288, 1536},
                         {"down 2x", 1536, 12288},
                         {"k/v_proj", 256, 1536}};

void sweep(ThreadPool& pool, int reps, double peak) {
    std::printf(
        "threads %d, FMA ceiling %.1f GFLOP/s, bf16 unit ceiling %.1f (GFLOP/s, %% of the FMA "
        "ceiling)\n",
        pool.size(), peak, mc::measure_bf16_peak_gflops(pool));
    std::printf("%-14s %5s", "shape", "n");
    for (const Variant& v : kVariants)
        if (runs_here(v)) std::printf(" %14s", v.name);
    std::printf("\n");
    for (int64_t n : {64, 256, 512}) {
        for (const Shape& s : kShapes) {
            const Data d = make_data(n, s.in, s.out, static_cast<uint64_t>(n + s.out));
            std::vector<float> y(static_cast<size_t>(n * s.out));
            std::vector<std::vector<double>> t(std::size(kVariants));
            for (const Variant& v : kVariants)
                if (runs_here(v)) v.fn(pool, d.p(), y.data());  // untimed warm-up
            for (int r = 0; r < reps; ++r)
                for (size_t i = 0; i < std::size(kVariants); ++i)
                    if (runs_here(kVariants[i])) t[i].push_back(seconds(pool, kVariants[i], d.p(), y.data()));
            std::printf("%-14s %5lld", s.name, static_cast<long long>(n));
            for (size_t i = 0; i < std::size(kVariants); ++i) {
                if (!runs_here(kVariants[i])) continue;
                std::sort(t[i].begin(), t[i].end());
                const double gf = 2.0 * double(n) * s.in * s.out / t[i][t[i].size() / 2] / 1e9;
                std::printf(" %7.1f %5.0f%%", gf, 100.0 * gf / peak);
            }
            std::printf("\n");
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    bool gate_only = false;
    int reps = 5;
    std::vector<int> threads;  // pool sizes of the sweep; 1 and 2 unless --threads is given
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--gate") {
            gate_only = true;
        } else if (a == "--reps" && i + 1 < argc) {
            reps = std::max(1, std::atoi(argv[++i]));
        } else if (a == "--threads" && i + 1 < argc) {
            threads.push_back(std::max(1, std::atoi(argv[++i])));
        } else {
            std::fprintf(stderr, "usage: markbase_cpu_gemm_lab [--gate] [--reps N] [--threads N]...\n");
            return 2;
        }
    }
    if (threads.empty()) threads = {1, 2};
    for (const Variant& v : kVariants)
        std::printf("%s: %s%s\n", v.name, v.what, runs_here(v) ? "" : " (not here)");
    ThreadPool pool1(1), pool2(2);
    const bool ok = gate(pool2) && gate(pool1);
    std::printf("gate: %s\n", ok ? "PASS" : "FAIL");
    if (!ok) return 1;
    if (gate_only) return 0;
    for (int t : threads) {
        ThreadPool pool(t);
        sweep(pool, reps, mc::measure_fma_peak_gflops(pool));
    }
    return 0;
}
