// Kernel lab for the CPU decode GEMV (n = 1 token): y = W x, W bf16 [out][in] (HF layout), x and y fp32.
// A scalar reference (fp32 products summed in fp64), the product's kernel (cpu::matmul_bf16 as decode calls
// it), numbered variants (cpu_gemv_variants.h), a correctness gate and a GB/s sweep over the matrices of one
// Gemma 4 E2B decode step at 1 and 2 threads, each shown as a share of the read bandwidth that
// cpu::measure_read_bandwidth measures with the same pool.
//   markbase_cpu_gemv_lab [--gate] [--quick] [--pin] [--only SUBSTRING] [--sweeps N] [--rotate-mb MB]
// A cell is GB/s and the share of "rd", the same bytes read (summed as integers) with the same split in the
// same rounds; the E2B step line adds, in parentheses, the share of cpu::measure_read_bandwidth taken before
// the sweep, which is printed again after it (on a shared host the two can differ by 2x).
// --gate checks and exits (ctest runs it). Every timed call reads a different copy of the weight, rotating
// over at least --rotate-mb (default 1024) MB of copies, so that the stream comes from DRAM and not from the
// last-level cache (choose it well above the L3; lscpu). A cell is the median of >= 15 timed calls, the
// variants interleaved call by call.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

#include "cpu/matmul.h"
#include "cpu/matmul_kernels.h"
#include "cpu/memory_bandwidth.h"
#include "cpu/thread_pool.h"
#include "cpu_gemv_variants.h"
#include "cpu_lab_random.h"
#include "model/bf16.h"

namespace {

using markbase::bf16;
using markbase::cpu::ThreadPool;
using Clock = std::chrono::steady_clock;

struct Problem {
    const float* x;  // fp32 [in]
    const bf16* x2;  // x rounded to bf16, zero-padded to a multiple of 32 (the dpbf16 variant only)
    int64_t in, out;
    const bf16* w;
};

using VariantFn = void (*)(ThreadPool& pool, const Problem& p, float* y);

struct Variant {
    const char* name;
    const char* what;
    bool drop_in;  // claims the product's bits: the gate requires them
    double tol;    // |y - ref| <= tol * sum_i |w_i x_i|
    bool avx512, bf16_dot;
    VariantFn fn;
};

// Splits the rows over the pool in one contiguous share per thread, cut at multiples of gran rows.
template <class F>
void static_split(ThreadPool& pool, int64_t out, int64_t gran, const F& f) {
    const int t = pool.size();
    const int64_t tiles = (out + gran - 1) / gran;
    pool.parallel_for(t, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
            const int64_t r0 = tiles * i / t * gran, r1 = std::min(out, tiles * (i + 1) / t * gran);
            if (r0 < r1) f(r0, r1);
        }
    });
}

void v0_product(ThreadPool& pool, const Problem& p, float* y) {
    markbase::cpu::matmul_bf16(pool, p.x, 1, p.in, p.w, p.out, y);
}

#if defined(__x86_64__)
void v1_product_avx2(ThreadPool& pool, const Problem& p, float* y) {
    markbase::cpu::matmul_bf16_on(markbase::cpu::SimdPath::Avx2, pool, p.x, 1, p.in, p.w, p.out, y);
}

void v2_static(ThreadPool& pool, const Problem& p, float* y) {
    const auto rows = markbase::cpu::kMatmulKernelsAvx512.direct_bf16;
    static_split(pool, p.out, 16,
                 [&](int64_t r0, int64_t r1) { rows(p.x, 1, p.in, p.w, p.out, y, r0, r1, nullptr); });
}

template <int R, bool kPerm, int kPrefetch>
void v_tiles(ThreadPool& pool, const Problem& p, float* y) {
    static_split(pool, p.out, R, [&](int64_t r0, int64_t r1) {
        lab::gemv_rows<R, kPerm, kPrefetch>(p.x, p.in, p.w, y, r0, r1);
    });
}

// Not a GEMV: every thread sums its contiguous share of the same weight bytes as 64-bit integers (vectorised,
// far faster than memory). Timed in the same rounds as the kernels, it is the read ceiling of these very
// bytes at this moment, which matters on a host whose bandwidth drifts while the sweep runs.
void rd_read(ThreadPool& pool, const Problem& p, float* y) {
    const auto* q = reinterpret_cast<const uint64_t*>(p.w);
    const int64_t words = p.out * p.in / 4;
    std::atomic<uint64_t> total{0};
    static_split(pool, words, 8, [&](int64_t b, int64_t e) {
        uint64_t acc[8] = {};
        for (int64_t i = b; i + 8 <= e; i += 8)
            for (int j = 0; j < 8; ++j) acc[j] += q[i + j];
        uint64_t t = 0;
        for (int j = 0; j < 8; ++j) t += acc[j];
        total.fetch_add(t, std::memory_order_relaxed);
    });
    y[0] = static_cast<float>(total.load());
}

void v8_dpbf16(ThreadPool& pool, const Problem& p, float* y) {
    static_split(pool, p.out, 16,
                 [&](int64_t r0, int64_t r1) { lab::dpbf16_rows<16>(p.x2, p.in, p.w, y, r0, r1); });
}
#endif

const Variant kVariants[] = {
    {"v0", "product: cpu::matmul_bf16 (best path, 4 runs/thread from a shared counter)", true, 1e-5, false,
     false, v0_product},
#if defined(__x86_64__)
    {"v1", "product on the AVX2 path (8 lanes: other sums)", false, 1e-5, false, false, v1_product_avx2},
    {"v2", "product AVX-512 row kernel, one contiguous share per thread", true, 1e-5, true, false, v2_static},
    {"v3", "16 rows, bf16 widened by vpermw (1 uop) instead of zero-extend + shift", true, 1e-5, true, false,
     v_tiles<16, true, 0>},
    {"v4", "16 rows, widen as product, software prefetch 1 KB ahead", true, 1e-5, true, false,
     v_tiles<16, false, 1024>},
    {"v5", "16 rows, vpermw + prefetch 1 KB ahead", true, 1e-5, true, false, v_tiles<16, true, 1024>},
    {"v6", "8 rows, vpermw", true, 1e-5, true, false, v_tiles<8, true, 0>},
    {"v7", "24 rows, vpermw", true, 1e-5, true, false, v_tiles<24, true, 0>},
    {"v8", "AVX-512-BF16 dpbf16 with x rounded to bf16 (NOT a drop-in: changes results)", false, 4e-3, true,
     true, v8_dpbf16},
    {"v9", "16 rows, widen as product, no prefetch (the product's pre-prefetch loop)", true, 1e-5, true,
     false, v_tiles<16, false, 0>},
    {"v10", "16 rows, widen as product, software prefetch 512 B ahead", true, 1e-5, true, false,
     v_tiles<16, false, 512>},
    {"v11", "16 rows, widen as product, software prefetch 2 KB ahead", true, 1e-5, true, false,
     v_tiles<16, false, 2048>},
#endif
    {"rd", "read ceiling: the same bytes summed as integers, same split (not a GEMV; timing only)", false, 0,
     false, false, rd_read},
};

bool runs_here(const Variant& v) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    const bool a512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl");
    if (v.avx512 && !a512) return false;
    if (v.bf16_dot && !__builtin_cpu_supports("avx512bf16")) return false;
    if (std::string_view(v.name) == "v1" && !__builtin_cpu_supports("avx2")) return false;
#endif
    return true;
}

// The matrices of one E2B decode step (src/model/variants.cpp's e2b: 35 layers, every 5th full attention,
// the last 20 share the KV of earlier layers and have the double-wide MLP; head_dim 256 / 512 global) and
// how many times each is read per token.
struct Shape {
    const char* name;
    int64_t out, in;
    int per_token;
};
const Shape kShapes[] = {
    {"q_proj slide", 2048, 1536, 28},  {"q_proj full", 4096, 1536, 7},   {"k/v_proj slide", 256, 1536, 24},
    {"k/v_proj full", 512, 1536, 6},   {"o_proj slide", 1536, 2048, 28}, {"o_proj full", 1536, 4096, 7},
    {"gate/up", 6144, 1536, 30},       {"gate/up 2x", 12288, 1536, 40},  {"down", 1536, 6144, 15},
    {"down 2x", 1536, 12288, 20},      {"ple_gate", 256, 1536, 35},      {"ple_proj", 1536, 256, 35},
    {"ple_model_proj", 8960, 1536, 1}, {"lm_head", 262144, 1536, 1},
};

struct Data {
    std::vector<bf16> w;  // copies x out x in
    std::vector<float> x;
    std::vector<bf16> x2;
    int64_t copies = 1;
};

Data make_data(ThreadPool& pool, const Shape& s, int64_t rotate_bytes) {
    Data d;
    const int64_t elems = s.out * s.in;
    d.copies = std::max<int64_t>(1, (rotate_bytes + elems * 2 - 1) / (elems * 2));
    d.w.resize(static_cast<size_t>(elems * d.copies));
    bf16* w = d.w.data();
    pool.parallel_for(elems * d.copies, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i)
            w[i] = markbase::float_to_bf16(lab::hash_unit(static_cast<uint64_t>(i)));
    });
    d.x.resize(static_cast<size_t>(s.in));
    d.x2.assign(static_cast<size_t>((s.in + 31) / 32 * 32), 0);
    for (int64_t i = 0; i < s.in; ++i) {
        d.x[i] = lab::hash_unit(static_cast<uint64_t>(i) + (uint64_t{1} << 60));
        d.x2[i] = markbase::float_to_bf16(d.x[i]);
    }
    return d;
}

// Checks every runnable variant at this pool size against the reference (and the product's bits for a
// drop-in); prints one line per variant. Returns false on any failure.
bool gate(ThreadPool& pool, const Shape& s, const Data& d) {
    const Problem p{d.x.data(), d.x2.data(), s.in, s.out, d.w.data()};
    std::vector<double> ref(static_cast<size_t>(s.out)), scale(static_cast<size_t>(s.out));
    for (int64_t o = 0; o < s.out; ++o) {
        double acc = 0, mag = 0;
        for (int64_t i = 0; i < s.in; ++i) {
            const double t = static_cast<double>(markbase::bf16_to_float(p.w[o * s.in + i]) * p.x[i]);
            acc += t;
            mag += std::fabs(t);
        }
        ref[o] = acc;
        scale[o] = mag;
    }
    std::vector<float> prod(static_cast<size_t>(s.out), NAN), y(static_cast<size_t>(s.out));
    v0_product(pool, p, prod.data());
    bool ok = true;
    for (const Variant& v : kVariants) {
        if (!runs_here(v) || v.tol == 0) continue;
        std::fill(y.begin(), y.end(), NAN);  // poisoned: a row left unwritten fails
        v.fn(pool, p, y.data());
        double worst = 0;
        for (int64_t o = 0; o < s.out; ++o) {
            const double e = std::fabs(y[o] - ref[o]) / (scale[o] + 1e-30);
            worst = std::isnan(e) ? INFINITY : std::max(worst, e);
        }
        const bool same = std::memcmp(y.data(), prod.data(), y.size() * sizeof(float)) == 0;
        const bool pass = worst <= v.tol && (!v.drop_in || same);
        ok = ok && pass;
        std::printf("gate %-15s t=%d %s: max |y-ref|/sum|w*x| %.2e (tol %.0e), %s product bits: %s\n", s.name,
                    pool.size(), v.name, worst, v.tol, same ? "same" : "differs", pass ? "PASS" : "FAIL");
    }
    return ok;
}

// Median seconds per call of every runnable variant (0 for the others). The variants are timed in rounds,
// one call of each per round, so a drift of the host's bandwidth during the sweep hits them all alike; >= 15
// rounds and >= 0.2 s of calls per variant, each call on the next weight copy.
std::vector<double> time_variants(ThreadPool& pool, const Shape& s, const Data& d, std::vector<float>& y) {
    const int64_t elems = s.out * s.in;
    const size_t nv = std::size(kVariants);
    Problem p{d.x.data(), d.x2.data(), s.in, s.out, d.w.data()};
    int64_t c = 0;
    auto call = [&](const Variant& v) {
        p.w = d.w.data() + (c++ % d.copies) * elems;
        const auto t0 = Clock::now();
        v.fn(pool, p, y.data());
        return std::chrono::duration<double>(Clock::now() - t0).count();
    };
    std::vector<std::vector<double>> t(nv);
    for (size_t j = 0; j < nv; ++j)
        if (runs_here(kVariants[j])) call(kVariants[j]);
    double spent = 0;
    for (int round = 0; round < 15 || (round < 2000 && spent < 0.2 * static_cast<double>(nv)); ++round) {
        for (size_t j = 0; j < nv; ++j) {
            if (!runs_here(kVariants[j])) continue;
            t[j].push_back(call(kVariants[j]));
            spent += t[j].back();
        }
    }
    std::vector<double> med(nv, 0);
    for (size_t j = 0; j < nv; ++j) {
        if (t[j].empty()) continue;
        std::sort(t[j].begin(), t[j].end());
        med[j] = t[j][t[j].size() / 2];
    }
    return med;
}

double bytes_of(const Shape& s) {
    return static_cast<double>(s.out * s.in) * 2 + static_cast<double>(s.in + s.out) * 4;
}

// An empty parallel_for over every thread: the floor of one matmul's split. Its cost depends on where the OS
// puts the workers: a worker on the caller's CPU runs only when the caller yields, and each call then costs a
// time slice instead of a cache line's round trip.
struct PoolCost {
    double p50_s = 0, p90_s = 0;
    int on_callers_cpu = 0, chunks = 0;  // chunks run by a worker on the CPU the caller ran on
};

PoolCost pool_call_cost(ThreadPool& pool) {
    std::vector<double> t;
    std::atomic<int> same{0}, chunks{0};
    for (int i = 0; i < 2000; ++i) {
#if defined(__linux__)
        const int caller = sched_getcpu();
#else
        const int caller = -1;
#endif
        const auto t0 = Clock::now();
        pool.parallel_for(pool.size(), [&](int64_t b, int64_t) {
            if (b == 0) return;
            chunks.fetch_add(1, std::memory_order_relaxed);
#if defined(__linux__)
            if (sched_getcpu() == caller) same.fetch_add(1, std::memory_order_relaxed);
#endif
        });
        t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    return {t[t.size() / 2], t[t.size() * 9 / 10], same.load(), chunks.load()};
}

// --pin: thread i of the pool (0 = the caller) is bound to CPU i. Chunk i of a parallel_for always runs on
// worker i, so binding inside one call binds the workers for good. The product does not pin; this shows what
// a worker sharing the caller's CPU costs.
void pin_pool(ThreadPool& pool) {
#if defined(__linux__)
    pool.parallel_for(pool.size(), [](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
            cpu_set_t set;
            CPU_ZERO(&set);
            CPU_SET(static_cast<int>(i), &set);
            if (sched_setaffinity(0, sizeof set, &set) != 0) std::perror("sched_setaffinity");
        }
    });
#endif
}

struct Options {
    bool gate_only = false, quick = false, pin = false;
    std::string only;
    int sweeps = 1;
    int64_t rotate_mb = 1024;
};

Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string_view a = argv[i];
        if (a == "--gate") {
            o.gate_only = true;
        } else if (a == "--pin") {
            o.pin = true;
        } else if (a == "--quick") {
            o.quick = true;
        } else if (a == "--only" && i + 1 < argc) {
            o.only = argv[++i];
        } else if (a == "--sweeps" && i + 1 < argc) {
            o.sweeps = std::max(1, std::atoi(argv[++i]));
        } else if (a == "--rotate-mb" && i + 1 < argc) {
            o.rotate_mb = std::max<int64_t>(1, std::atoll(argv[++i]));
        } else {
            std::fprintf(stderr,
                         "usage: markbase_cpu_gemv_lab [--gate] [--quick] [--pin] [--only SUBSTRING] "
                         "[--sweeps N] [--rotate-mb MB]\n");
            std::exit(2);
        }
    }
    return o;
}

bool selected(const Options& o, const Shape& s) {
    if (o.quick && s.out * s.in > (int64_t{1} << 26)) return false;  // lm_head: the slow reference
    return o.only.empty() || std::string_view(s.name).find(o.only) != std::string_view::npos;
}

void print_header(ThreadPool* pools[2], const double bw[2]) {
    std::printf("simd path (product): %s; avx512_bf16: %s\n", markbase::cpu::matmul_simd_path(),
#if defined(__x86_64__)
                __builtin_cpu_supports("avx512bf16") ? "yes" : "no"
#else
                "no"
#endif
    );
    for (int k = 0; k < 2; ++k) {
        const PoolCost c = pool_call_cost(*pools[k]);
        std::printf(
            "threads %d: read bandwidth %.2f GB/s (cpu::measure_read_bandwidth, 1 GiB); empty "
            "parallel_for p50 %.2f us, p90 %.2f us; worker chunks on the caller's CPU: %d of %d\n",
            pools[k]->size(), bw[k], c.p50_s * 1e6, c.p90_s * 1e6, c.on_callers_cpu, c.chunks);
    }
    for (const Variant& v : kVariants)
        std::printf("%s%s: %s%s\n", v.name, runs_here(v) ? "" : " (not on this CPU)", v.what,
                    v.drop_in ? " [drop-in]" : "");
}

// One sweep: a row per (shape, threads), a cell per variant (GB/s and % of that pool's read bandwidth),
// then the E2B decode step's matmuls per variant, each shape counted per_token times.
void sweep(const Options& o, ThreadPool* pools[2], const double bw[2]) {
    const size_t nv = std::size(kVariants);
    std::vector<double> token_s(2 * nv, 0), token_bytes(2, 0);
    std::printf("%-15s %6s %6s %5s %2s", "shape", "out", "in", "MB", "t");
    for (const Variant& v : kVariants) std::printf(" %12s", v.name);
    std::printf("   (GB/s, %% of rd: the same bytes' read time in the same rounds)\n");
    for (const Shape& s : kShapes) {
        if (!selected(o, s)) continue;
        const Data d = make_data(*pools[1], s, o.rotate_mb << 20);
        std::vector<float> y(static_cast<size_t>(s.out));
        for (int k = 0; k < 2; ++k) {
            std::printf("%-15s %6lld %6lld %5.1f %2d", s.name, static_cast<long long>(s.out),
                        static_cast<long long>(s.in), bytes_of(s) / 1e6, pools[k]->size());
            const std::vector<double> t = time_variants(*pools[k], s, d, y);
            for (size_t j = 0; j < nv; ++j) {
                if (!runs_here(kVariants[j])) {
                    std::printf(" %12s", "-");
                    continue;
                }
                const double gbs = bytes_of(s) / t[j] / 1e9;
                std::printf(" %6.1f %4.0f%%", gbs, 100 * t[nv - 1] / t[j]);
                token_s[k * nv + j] += s.per_token * t[j];
            }
            token_bytes[k] += s.per_token * bytes_of(s);
            std::printf("\n");
            std::fflush(stdout);
        }
    }
    for (int k = 0; k < 2; ++k) {
        std::printf("E2B step (%.0f MB of matmuls) t=%d:", token_bytes[k] / 1e6, pools[k]->size());
        for (size_t j = 0; j < nv; ++j) {
            if (!runs_here(kVariants[j])) continue;
            const double gbs = token_bytes[k] / token_s[k * nv + j] / 1e9;
            std::printf(" %s %.2f ms %.1f GB/s %.0f%% (%.0f%%);", kVariants[j].name,
                        token_s[k * nv + j] * 1e3, gbs, 100 * token_s[k * nv + nv - 1] / token_s[k * nv + j],
                        100 * gbs / bw[k]);
        }
        std::printf("\n");
    }
}

}  // namespace

int main(int argc, char** argv) {
    const Options o = parse(argc, argv);
    ThreadPool pool1(1), pool2(2);
    ThreadPool* pools[2] = {&pool1, &pool2};
    if (o.pin) {
        pin_pool(pool1);
        pin_pool(pool2);
    }
    bool ok = true;
    for (const Shape& s : kShapes) {
        if (!selected(o, s)) continue;
        const Data d = make_data(pool2, s, 0);  // one copy: the gate reads copy 0 only
        for (ThreadPool* p : pools) ok = gate(*p, s, d) && ok;
    }
    std::printf("gate: %s\n", ok ? "PASS" : "FAIL");
    if (!ok) return 1;
    if (o.gate_only) return 0;
    const double bw[2] = {markbase::cpu::measure_read_bandwidth(pool1).read_gbs,
                          markbase::cpu::measure_read_bandwidth(pool2).read_gbs};
    print_header(pools, bw);
    for (int i = 0; i < o.sweeps; ++i) {
        std::printf("sweep %d of %d (rotating over >= %lld MB of weight copies)\n", i + 1, o.sweeps,
                    static_cast<long long>(o.rotate_mb));
        sweep(o, pools, bw);
    }
    std::printf("read bandwidth after the sweeps: %.2f GB/s (1 thread), %.2f GB/s (2 threads)\n",
                markbase::cpu::measure_read_bandwidth(pool1).read_gbs,
                markbase::cpu::measure_read_bandwidth(pool2).read_gbs);
    return 0;
}
