// The ISA-neutral half of the CPU matmul: the run-time choice of a kernel table (matmul_kernels.h) and the
// split of the work over the thread pool. The scalar kernels are compiled here; the SIMD ones in their own
// TUs (matmul_avx2.cpp, matmul_avx512.cpp).
#include "cpu/matmul.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "cpu/matmul_kernels.h"
#include "model/error.h"

namespace markbase::cpu {
namespace {

// Decode and short batches take the direct path: each tile of weight rows is read straight from bf16 and
// swept by every token, whose x stays in L2. Up to 4 tokens that reads every weight once from memory; up to
// ~32 tokens (while all of x fits in a core's L2) re-reading a tile from L1 beats widening it into a panel
// (measured). Longer batches take the blocked path (rows_blocked in matmul_kernels.h).
constexpr int64_t kDirectMaxTokens = 4;
constexpr int64_t kDirectMaxXBytes = 256 << 10;
// Below this many multiply-adds the work runs on the calling thread: waking the pool would cost more.
// Below ~256K multiply-adds (tens of microseconds on one core) waking a second thread costs more than it
// saves.
constexpr int64_t kMinParallelMacs = 1 << 18;
// Runs of rows per thread (see matmul_impl). Each prefill run re-reads its tokens' x, so not too many.
constexpr int64_t kRunsPerThread = 4;

constinit const MatmulKernels kScalarKernels = make_matmul_kernels<ScalarOps>("scalar");

constexpr SimdPath kAllPaths[] = {SimdPath::Scalar, SimdPath::Avx2, SimdPath::Avx512};

// The kernels this build compiled for path, or null.
const MatmulKernels* compiled_kernels(SimdPath path) {
    switch (path) {
        case SimdPath::Scalar:
            return &kScalarKernels;
#if defined(MARKBASE_MATMUL_X86)
        case SimdPath::Avx2:
            return &kMatmulKernelsAvx2;
        case SimdPath::Avx512:
            return &kMatmulKernelsAvx512;
#endif
        default:
            return nullptr;
    }
}

// Whether this CPU (and its OS, which must save the wider registers: libgcc's check includes that) runs path.
bool cpu_runs(SimdPath path) {
#if defined(MARKBASE_MATMUL_X86)
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    switch (path) {
        case SimdPath::Scalar:
            return true;
        case SimdPath::Avx2:
            return avx2;
        case SimdPath::Avx512:
            return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512vl");
    }
    return false;
#else
    return path == SimdPath::Scalar;
#endif
}

const MatmulKernels& kernels_on(SimdPath path) {
    const MatmulKernels* k = compiled_kernels(path);
    if (k == nullptr) {
        throw Error(std::string("matmul: the ") + simd_path_name(path) +
                    " kernels are not compiled into this build");
    }
    if (!cpu_runs(path)) {
        throw Error(std::string("matmul: this CPU cannot run the ") + simd_path_name(path) + " kernels");
    }
    return *k;
}

const MatmulKernels& best_kernels() {
    static const MatmulKernels& k = kernels_on(best_simd_path());
    return k;
}

// Whether the bf16 products' units run here: vdpbf16ps needs AVX-512-BF16; the AMX tile unit AMX-TILE and
// AMX-BF16 (and AVX-512-BF16 for the packing) and the kernel's grant of the tile data state to the process
// (Linux's ARCH_REQ_XCOMP_PERM), asked once.
bool pair_path_runs(PairPath path) {
    if (path == PairPath::kAmxModel) return true;
#if defined(MARKBASE_MATMUL_X86)
    const bool dot = cpu_runs(SimdPath::Avx512) && __builtin_cpu_supports("avx512bf16");
    if (path == PairPath::kDot) return dot;
    static const bool amx = [dot] {
        // CPUID leaf 7: EDX bit 22 AMX-BF16, bit 24 AMX-TILE (asked directly: clang 14's
        // __builtin_cpu_supports does not know the AMX names)
        unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
        if (!dot || !__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
        if (!(edx & (1u << 22)) || !(edx & (1u << 24))) return false;
#if defined(__linux__)
        constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
        return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
#else
        return false;
#endif
    }();
    return amx;
#else
    return false;
#endif
}

const PairKernels* pair_kernels_of(PairPath path) {
    switch (path) {
#if defined(MARKBASE_MATMUL_X86)
        case PairPath::kDot:
            return &kPairKernelsAvx512Bf16;
        case PairPath::kAmx:
            return &kPairKernelsAmx;
#endif
        case PairPath::kAmxModel:
            return &kPairKernelsAmxModel;
        default:
            return nullptr;
    }
}

// The bf16 prompt products' kernels: the AMX unit's where it runs, else vdpbf16ps's, else null.
const PairKernels* pair_kernels() {
    static const PairKernels* k = pair_path_runs(PairPath::kAmx)   ? pair_kernels_of(PairPath::kAmx)
                                  : pair_path_runs(PairPath::kDot) ? pair_kernels_of(PairPath::kDot)
                                                                   : nullptr;
    return k;
}

// The fp32 scratch of the blocked kernels; one per thread, since a thread runs one matmul at a time.
float* blocked_panel(int64_t floats) {
    thread_local std::vector<float> panel;
    if (panel.size() < static_cast<size_t>(floats)) panel.resize(static_cast<size_t>(floats));
    return panel.data();
}

// x [n][in] transposed into the calling thread's scratch for the blocked kernels (matmul_kernels.h): tile by
// tile of `tt` tokens, x^T[tile][in][tt], the last tile's padding zero. Written once per matmul for every
// thread, over the pool.
const float* transposed_x(ThreadPool& pool, const float* x, int64_t n, int64_t in, int64_t tt) {
    const int64_t tiles = (n + tt - 1) / tt;
    thread_local std::vector<float> xt;
    if (xt.size() < static_cast<size_t>(tiles * in * tt)) xt.resize(static_cast<size_t>(tiles * in * tt));
    float* d = xt.data();
    constexpr int64_t kStrip = 64;  // inputs per work item
    const int64_t strips = (in + kStrip - 1) / kStrip;
    auto fill = [&](int64_t s0, int64_t s1) {
        const int64_t i0 = s0 * kStrip, i1 = std::min(in, s1 * kStrip);
        for (int64_t tile = 0; tile < tiles; ++tile) {
            float* dt = d + tile * in * tt;
            const int64_t t0 = tile * tt, nt = std::min(tt, n - t0);
            for (int64_t i = i0; i < i1; ++i) std::fill(dt + i * tt + nt, dt + (i + 1) * tt, 0.0f);
            for (int64_t t = 0; t < nt; ++t) {
                const float* xr = x + (t0 + t) * in;
                for (int64_t i = i0; i < i1; ++i) dt[i * tt + t] = xr[i];
            }
        }
    };
    if (n * in < kMinParallelMacs / 8)
        fill(0, strips);
    else
        pool.parallel_for(strips, fill);
    return d;
}

// x [n][in] rounded to bf16 and packed in pairs (PairKernels) into the calling thread's scratch, over the
// pool.
const uint32_t* packed_pairs(const PairKernels& k, ThreadPool& pool, const float* x, int64_t n, int64_t in) {
    constexpr int64_t kTokens = 64;  // a packed tile's tokens (matmul_pairs.h kPairTokens)
    const int64_t tiles = (n + kTokens - 1) / kTokens, pairs = in / 2;
    thread_local std::vector<uint32_t> xp;
    if (xp.size() < static_cast<size_t>(tiles * pairs * kTokens))
        xp.resize(static_cast<size_t>(tiles * pairs * kTokens));
    uint32_t* d = xp.data();
    constexpr int64_t kStrip = 64;  // pairs per work item
    const int64_t strips = (pairs + kStrip - 1) / kStrip;
    pool.parallel_for(strips, [&](int64_t s0, int64_t s1) {
        k.pack(x, n, in, s0 * kStrip, std::min(pairs, s1 * kStrip), d);
    });
    return d;
}

template <class WT>
RowsKernel<WT> rows_kernel(const MatmulKernels& k, bool direct) {
    if constexpr (std::is_same_v<WT, float>) {
        return direct ? k.direct_f32 : k.blocked_f32;
    } else {
        return direct ? k.direct_bf16 : k.blocked_bf16;
    }
}

// Rows [0, out) in whole groups of `unit` over the pool, run(r0, r1) for each run. Work is handed out in
// contiguous runs of whole row tiles, so each run streams one contiguous slice of the weight. There are a few
// runs per thread, taken from a shared counter: a thread slowed down by another process (or a slower core)
// takes fewer runs instead of holding everyone up at the end.
template <class Run>
void split_rows(ThreadPool& pool, int64_t macs, int64_t out, int64_t unit, const Run& run_rows) {
    const int64_t groups = (out + unit - 1) / unit;
    auto run = [&](int64_t g0, int64_t g1) { run_rows(g0 * unit, std::min(out, g1 * unit)); };
    const int threads = pool.size();
    if (threads == 1 || macs < kMinParallelMacs) {
        run(0, groups);
        return;
    }
    const int64_t runs = std::min<int64_t>(groups, int64_t{threads} * kRunsPerThread);
    const int64_t per_run = (groups + runs - 1) / runs;
    std::atomic<int64_t> next{0};
    pool.parallel_for(threads, [&](int64_t, int64_t) {
        for (;;) {
            const int64_t g = next.fetch_add(per_run, std::memory_order_relaxed);
            if (g >= groups) break;
            run(g, std::min(groups, g + per_run));
        }
    });
}

// The bf16 products on k (in a multiple of k.in_multiple).
void run_pairs(const PairKernels& k, ThreadPool& pool, const float* x, int64_t n, int64_t in, const bf16* w,
               int64_t out, float* y) {
    const uint32_t* xp = packed_pairs(k, pool, x, n, in);
    split_rows(pool, n * in * out, out, k.rows, [&](int64_t r0, int64_t r1) {
        k.rows_pairs(xp, n, in, w, out, y, r0, r1,
                     blocked_panel(k.scratch_floats + k.scratch_per_input * in));
    });
}

// rowwise: the direct kernel whatever the shape (matmul_bf16_rowwise).
template <class WT>
void matmul_impl(const MatmulKernels& k, ThreadPool& pool, const float* x, int64_t n, int64_t in, const WT* w,
                 int64_t out, float* y, bool rowwise = false,
                 PromptProducts products = PromptProducts::kExact) {
    if (n <= 0 || out <= 0) return;
    if (in <= 0) {
        std::fill(y, y + n * out, 0.0f);
        return;
    }
    // The blocked kernel computes whole tiles of outer_tokens (64 on AVX-512): below 3/4 of one, the padding
    // costs more than the direct kernel loses (measured at 8..32 tokens: direct 1.3-1.7x faster).
    const bool direct = rowwise || n <= kDirectMaxTokens ||
                        n * in * int64_t{sizeof(float)} <= kDirectMaxXBytes || 4 * n < 3 * k.outer_tokens;
    if constexpr (std::is_same_v<WT, bf16>) {
        const PairKernels* pk = pair_kernels();
        if (!direct && products == PromptProducts::kBf16 && pk != nullptr && in % pk->in_multiple == 0) {
            run_pairs(*pk, pool, x, n, in, w, out, y);
            return;
        }
    }
    const RowsKernel<WT> rows = rows_kernel<WT>(k, direct);
    const float* xs = direct ? x : transposed_x(pool, x, n, in, k.outer_tokens);
    split_rows(pool, n * in * out, out, direct ? k.tile_rows : k.outer_rows, [&](int64_t r0, int64_t r1) {
        rows(xs, n, in, w, out, y, r0, r1, direct ? nullptr : blocked_panel(k.panel_floats));
    });
}

}  // namespace

const char* simd_path_name(SimdPath path) {
    switch (path) {
        case SimdPath::Scalar:
            return "scalar";
        case SimdPath::Avx2:
            return "avx2";
        case SimdPath::Avx512:
            return "avx512";
    }
    return "unknown";
}

std::vector<SimdPath> supported_simd_paths() {
    std::vector<SimdPath> paths;
    for (SimdPath p : kAllPaths) {
        if (compiled_kernels(p) != nullptr && cpu_runs(p)) paths.push_back(p);
    }
    return paths;
}

SimdPath best_simd_path() {
    static const SimdPath best = supported_simd_paths().back();
    return best;
}

const char* matmul_simd_path() {
    return best_kernels().name;
}

const char* matmul_kernels_name(SimdPath path) {
    return kernels_on(path).name;
}

void matmul_bf16(ThreadPool& pool, const float* x, int64_t n, int64_t in, const bf16* w, int64_t out,
                 float* y, PromptProducts products) {
    matmul_impl(best_kernels(), pool, x, n, in, w, out, y, false, products);
}

bool bf16_products_supported() {
    return pair_kernels() != nullptr;
}

bool bf16_products_faster() {
    static const bool faster = [] {
        if (!bf16_products_supported()) return false;
        // three alternating pairs of ~0.1-0.3 ms loops; the best rate of each
        auto rate = [](double (*loop)(int64_t)) {
            const auto t0 = std::chrono::steady_clock::now();
            const double flops = loop(int64_t{1} << 14);
            return flops / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        };
        double fma = 0, unit = 0;
        for (int i = 0; i < 3; ++i) {
            fma = std::max(fma, rate(&fma_peak_rounds));
            unit = std::max(unit, rate(&bf16_peak_rounds));
        }
        return unit >= 1.5 * fma;
    }();
    return faster;
}

double bf16_peak_rounds(int64_t rounds) {
    const PairKernels* k = pair_kernels();
    return k != nullptr ? k->peak(rounds) : 0.0;
}

const char* bf16_products_unit() {
    const PairKernels* k = pair_kernels();
    return k != nullptr ? k->name : "none";
}

const char* pair_path_name(PairPath path) {
    switch (path) {
        case PairPath::kDot:
            return "avx512bf16";
        case PairPath::kAmx:
            return "amx";
        case PairPath::kAmxModel:
            return "amx-model";
    }
    return "unknown";
}

std::vector<PairPath> supported_pair_paths() {
    std::vector<PairPath> paths;
    for (PairPath p : {PairPath::kAmxModel, PairPath::kDot, PairPath::kAmx})
        if (pair_kernels_of(p) != nullptr && pair_path_runs(p)) paths.push_back(p);
    return paths;
}

void matmul_bf16_pairs_on(PairPath path, ThreadPool& pool, const float* x, int64_t n, int64_t in,
                          const bf16* w, int64_t out, float* y) {
    const PairKernels* k = pair_kernels_of(path);
    if (k == nullptr || !pair_path_runs(path))
        throw Error(std::string("matmul: the bf16 products on ") + pair_path_name(path) + " do not run here");
    if (in % k->in_multiple != 0)
        throw Error(std::string("matmul: the bf16 products on ") + pair_path_name(path) + " take inputs in " +
                    "multiples of " + std::to_string(k->in_multiple) + ", found " + std::to_string(in));
    if (n > 0 && out > 0) run_pairs(*k, pool, x, n, in, w, out, y);
}

void matmul_bf16_rowwise(ThreadPool& pool, const float* x, int64_t n, int64_t in, const bf16* w, int64_t out,
                         float* y) {
    matmul_impl(best_kernels(), pool, x, n, in, w, out, y, true);
}

void matmul_f32(ThreadPool& pool, const float* x, int64_t n, int64_t in, const float* w, int64_t out,
                float* y) {
    matmul_impl(best_kernels(), pool, x, n, in, w, out, y);
}

void attn_scores(const float* q, int64_t ldq, int m, const float* const* k, int nk, int64_t d, float* s,
                 int64_t lds) {
    best_kernels().attn_scores(q, ldq, m, k, nk, d, s, lds);
}

void attn_values(const float* p, int64_t ldp, int m, const float* const* v, int nk, int64_t d, float* out,
                 int64_t ldo) {
    best_kernels().attn_values(p, ldp, m, v, nk, d, out, ldo);
}

double fma_peak_rounds(int64_t rounds) {
    return best_kernels().fma_peak(rounds);
}

void matmul_bf16_on(SimdPath path, ThreadPool& pool, const float* x, int64_t n, int64_t in, const bf16* w,
                    int64_t out, float* y) {
    matmul_impl(kernels_on(path), pool, x, n, in, w, out, y);
}

void matmul_bf16_rowwise_on(SimdPath path, ThreadPool& pool, const float* x, int64_t n, int64_t in,
                            const bf16* w, int64_t out, float* y) {
    matmul_impl(kernels_on(path), pool, x, n, in, w, out, y, true);
}

void matmul_f32_on(SimdPath path, ThreadPool& pool, const float* x, int64_t n, int64_t in, const float* w,
                   int64_t out, float* y) {
    matmul_impl(kernels_on(path), pool, x, n, in, w, out, y);
}

void attn_scores_on(SimdPath path, const float* q, int64_t ldq, int m, const float* const* k, int nk,
                    int64_t d, float* s, int64_t lds) {
    kernels_on(path).attn_scores(q, ldq, m, k, nk, d, s, lds);
}

void attn_values_on(SimdPath path, const float* p, int64_t ldp, int m, const float* const* v, int nk,
                    int64_t d, float* out, int64_t ldo) {
    kernels_on(path).attn_values(p, ldp, m, v, nk, d, out, ldo);
}

}  // namespace markbase::cpu
