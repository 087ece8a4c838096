// moe_gemm (cuda/kernels/moe_gemm.cu), a prefill chunk's experts grouped on the device: the GeGLU halves it
// writes in entry order and the down products at each entry's (token, slot) row against fp64 host products
// of the same inputs and weights, over a routing that gives one expert more entries than two column tiles
// hold, leaves one empty and gives one to another rank (group_expert -1: zero rows); bf16 and FP8 rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "model/fp8.h"
#include "runtime/backend.h"
#include "runtime/tuning.h"
#include "support/device_arrays.h"
#include "support/exact_options.h"
#include "support/expert_rows.h"
#include "support/logits_compare.h"
#include "support/require_cuda.h"

#ifdef MARKBASE_HAS_CUDA
#include <cuda_runtime.h>

#include "cuda/backend.h"
#include "cuda/kernels/kernels.h"
#endif

namespace markbase {
namespace {

#ifdef MARKBASE_HAS_CUDA
using testing::from_bf16;
using testing::from_f16;
using testing::gelu_tanh;
using testing::to_bf16;
using testing::to_device;
using testing::to_host;

struct Errors {
    double h = 0.0, out = 0.0;  // the largest errors relative to the sums of |terms|
    int nonzero_foreign = 0;    // values of another rank's entries that are not 0
};

// Expert rows on the device as the kernels take them; quantised rows' bf16 slots hold NaN (their paths must
// not read them).
cuda::ExpertRows upload(const testing::ExpertRowsHost& r, std::vector<void*>& owned) {
    cuda::ExpertRows d;
    if (r.fp8 || r.is_int4) {
        QuantMatrix& m = r.fp8 ? d.fp8 : d.int4;
        m.q = to_device(r.q);
        m.scale = to_device(r.scale);
        m.zero = r.zero.empty() ? nullptr : to_device(r.zero);
        owned.push_back(const_cast<uint8_t*>(m.q));
        owned.push_back(const_cast<float*>(m.scale));
        if (m.zero) owned.push_back(const_cast<uint8_t*>(m.zero));
    }
    const size_t values = r.is_int4 ? 2 * r.q.size() : r.q.size();
    const std::vector<uint16_t> bf = r.fp8 || r.is_int4 ? std::vector<uint16_t>(values, 0x7fc0) : r.w;
    d.w = to_device(bf);
    owned.push_back(const_cast<uint16_t*>(d.w));
    return d;
}

// n tokens of K slots over E experts routed by expert_of; expert `foreign` belongs to another rank.
template <class Route>
Errors run_case(WeightFormat f, int n, int K, int E, int H, int Ie, int foreign, Route expert_of,
                uint32_t seed) {
    const bool fp8 = f == WeightFormat::kFp8, int4 = f == WeightFormat::kInt4, quant = fp8 || int4;
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<int> off(static_cast<size_t>(E) + 1, 0), entries, group_expert(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) {
        for (int i = 0; i < n * K; ++i)
            if (expert_of(i / K, i % K) == e) entries.push_back(i);
        off[static_cast<size_t>(e) + 1] = static_cast<int>(entries.size());
        group_expert[static_cast<size_t>(e)] = e == foreign ? -1 : e;
    }
    const int total = n * K;
    std::vector<float> x(static_cast<size_t>(n) * H);
    for (float& v : x) v = u(rng);
    using Rows = testing::ExpertRowsHost;
    const Rows gu = int4 ? Rows::int4(rng, static_cast<size_t>(E) * 2 * Ie, H, true)
                         : Rows(rng, fp8, static_cast<size_t>(E) * 2 * Ie, H);
    const Rows down = int4 ? Rows::int4(rng, static_cast<size_t>(E) * H, Ie, false)
                           : Rows(rng, fp8, static_cast<size_t>(E) * H, Ie);
    std::vector<void*> owned;
    const cuda::ExpertRows d_gu = upload(gu, owned), d_down = upload(down, owned);
    float* d_x = to_device(x);
    int *d_off = to_device(off), *d_ent = to_device(entries), *d_gexp = to_device(group_expert);
    uint16_t *d_xr = nullptr, *d_h = nullptr;
    float* d_out = nullptr;
    const size_t nh = static_cast<size_t>(total) * Ie, nout = static_cast<size_t>(total) * H;
    EXPECT_EQ(cudaMalloc(&d_xr, 2 * static_cast<size_t>(n) * H * sizeof(uint16_t)), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&d_h, 2 * nh * sizeof(uint16_t)), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&d_out, nout * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemset(d_h, 0xff, 2 * nh * sizeof(uint16_t)), cudaSuccess);  // NaN: every value written
    EXPECT_EQ(cudaMemset(d_out, 0xff, nout * sizeof(float)), cudaSuccess);
    cuda::moe_gemm_prepare();  // what a model's set-up does
    cuda::moe_gemm_experts(d_x, H, K, n, d_gu, d_down, Ie, d_gexp, d_off, d_ent, E, d_xr, d_h, d_out,
                           nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint16_t> h = to_host(d_h, 2 * nh);
    const std::vector<float> out = to_host(d_out, nout);
    // h as the kernel wrote it: bf16 hi + lo, or 16 f16(h / 16)
    auto hval = [&](size_t i) {
        return quant ? 16.0 * from_f16(h[i]) : double(from_bf16(h[i])) + double(from_bf16(h[nh + i]));
    };
    Errors err;
    for (int e = 0; e < E; ++e)
        for (int j = off[static_cast<size_t>(e)]; j < off[static_cast<size_t>(e) + 1]; ++j) {
            const int entry = entries[static_cast<size_t>(j)];
            const float* xr = &x[static_cast<size_t>(entry / K) * H];
            if (e == foreign) {
                for (int r = 0; r < H; ++r)
                    err.nonzero_foreign += out[static_cast<size_t>(entry) * H + r] != 0.0f;
                continue;
            }
            for (int c = 0; c < Ie; ++c) {  // GeGLU of the gate and up products (of x exactly)
                double g = 0, up = 0, mg = 0, mu = 0;
                const size_t row = static_cast<size_t>(e) * 2 * Ie + c;
                for (int k = 0; k < H; ++k) {
                    const double pg = xr[k] * gu.value(row, k), pu = xr[k] * gu.value(row + Ie, k);
                    g += pg, up += pu, mg += std::fabs(pg), mu += std::fabs(pu);
                }
                const double got = hval(static_cast<size_t>(j) * Ie + c);
                const double want = gelu_tanh(g) * up;
                err.h =
                    std::max(err.h, std::isfinite(got) ? std::fabs(got - want) / (mg * mu + 1e-12) : 1e30);
            }
            for (int r = 0; r < H; ++r) {  // the down product of the h the kernel wrote
                double want = 0, mag = 0;
                for (int c = 0; c < Ie; ++c) {
                    const double p =
                        hval(static_cast<size_t>(j) * Ie + c) * down.value(static_cast<size_t>(e) * H + r, c);
                    want += p, mag += std::fabs(p);
                }
                const float got = out[static_cast<size_t>(entry) * H + r];
                err.out =
                    std::max(err.out, std::isfinite(got) ? std::fabs(got - want) / (mag + 1e-12) : 1e30);
            }
        }
    for (void* p : owned) cudaFree(p);
    for (void* p : {static_cast<void*>(d_x), static_cast<void*>(d_off), static_cast<void*>(d_ent),
                    static_cast<void*>(d_gexp), static_cast<void*>(d_xr), static_cast<void*>(d_h),
                    static_cast<void*>(d_out)})
        cudaFree(p);
    return err;
}

// Every routing of the tests below for one format. The bound of h is the products' rounding: the inputs as
// bf16 halves keep ~2^-17 of each value, fp32 sums; quantised rows' inputs and h are one f16 (2^-11). The
// down pass reads h as written: 1e-5 for all. int4: Ie 192, so the down rows end in half a group (a group's
// sums folded after its one stage), zero points stored for gate/up, symmetric for down.
void check_format(WeightFormat fmt) {
    const bool quant = fmt != WeightFormat::kBf16;
    const int E = 12, K = 4, H = 256, Ie = fmt == WeightFormat::kInt4 ? 192 : 128, n = 70, foreign = 5;
    const double bound = quant ? 5e-4 : 1e-5;
    const char* f = fmt == WeightFormat::kFp8 ? "FP8" : quant ? "int4" : "bf16";
    auto route = [&](int t, int k) { return k == 0 ? 0 : 2 + (t * 7 + k * 5 + (t * k) % 3) % (E - 2); };
    const Errors e = run_case(fmt, n, K, E, H, Ie, foreign, route, 32);
    EXPECT_LT(e.h, bound) << f << ": GeGLU";
    EXPECT_LT(e.out, 1e-5) << f << ": down";
    EXPECT_EQ(e.nonzero_foreign, 0) << f << ": another rank's entries";
    // one token (one partial tile an expert), and every entry on one expert
    const Errors one = run_case(
        fmt, 1, K, E, H, Ie, -1, [](int, int k) { return 3 * k; }, 7);
    EXPECT_LT(one.h, bound) << f << ", one token";
    EXPECT_LT(one.out, 1e-5) << f << ", one token";
    const Errors busy = run_case(
        fmt, 40, K, E, H, Ie, -1, [](int, int) { return 11; }, 8);
    EXPECT_LT(busy.h, bound) << f << ", one busy expert";
    EXPECT_LT(busy.out, 1e-5) << f << ", one busy expert";
}
#endif

// H 256 (4 stages of 64 k: the ring wraps), Ie 128 (2 gate/up row tiles, down K of 2 stages). 70 tokens of 4
// slots: every token's first slot on expert 0 (70 entries: 3 tiles of 32, the last partial),
// expert 1 empty, expert 5 another rank's, the rest spread (check_format).
TEST(MoeGemm, GeGluAndDownMatchTheFp64Products) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    check_format(WeightFormat::kBf16);
#endif
}

TEST(MoeGemm, Fp8RowsMatchTheFp64ProductsOfTheirScaledCodes) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    check_format(WeightFormat::kFp8);
#endif
}

TEST(MoeGemm, Int4RowsMatchTheFp64ProductsOfTheirGroups) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    check_format(WeightFormat::kInt4);
#endif
}

// The 26B-A4B at real widths, two layers: a 300-token prompt (chunks of 256 and 44) with the prefill
// experts through moe_gemm against the grouped GEMV kernels (Tuning::moe_gemm=0, which CudaSynthetic
// checks against the CPU). Layer 0's experts feed layer 1's attention for every token, so every entry of
// layer 0 reaches the last logits. The two sum in different orders (~1e-6 apart); not identical, or
// moe_gemm did not run.
TEST(MoeGemm, PrefillGivesTheGemvKernelsLogits) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    BackendOptions o = testing::exact_options();
    o.ctx_size = 512;
    o.chunk = 256;
    std::vector<int> prompt;
    auto logits = [&](const char* tuning) {
        o.tuning = testing::exact_tuning(tuning);
        auto be = make_synthetic_cuda_backend("26b-a4b", 2, o, 31);
        const auto V = static_cast<size_t>(be->config().vocab_size);
        if (prompt.empty()) prompt = testing::random_ids(300, static_cast<int>(V), 5);
        std::vector<float> lg(V);
        be->eval(prompt.data(), static_cast<int64_t>(prompt.size()), lg.data(), false);
        return lg;
    };
    const std::vector<float> gemv = logits("moe_gemm=0"), got = logits("");
    const double e = testing::rel_err(gemv, got);
    std::printf("  moe_gemm against the grouped GEMV kernels: rel err %.2e\n", e);
    EXPECT_GT(e, 0.0) << "identical to the last bit: moe_gemm did not run";
    EXPECT_LT(e, 1e-4);
#endif
}

TEST(MoeGemm, TakesTheWidthsItTiles) {
#ifdef MARKBASE_HAS_CUDA
    EXPECT_TRUE(cuda::moe_gemm_fits(2816, 704, 128));  // the 26B-A4B
    EXPECT_FALSE(cuda::moe_gemm_fits(64, 24, 8));      // the tiny test models: the grouped GEMV kernels
    EXPECT_FALSE(cuda::moe_gemm_fits(2816, 704, 512));
#else
    GTEST_SKIP() << "built without CUDA";
#endif
}

}  // namespace
}  // namespace markbase
