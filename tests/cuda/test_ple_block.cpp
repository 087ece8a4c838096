// ple_block (src/cuda/ple_block.cu), the end of a PLE layer as one thread-block cluster, against the same
// math on the host in double precision: the FFN's update, the gelu-gated PLE product, the projection, the PLE
// update and the next GEMV's normalised input, at E2B's and E4B's real widths (clusters of 16 on an H200) and
// at the tiny models' (72 and 88 wide: clusters of 8). Skips, saying why, without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "model/bf16.h"
#include "model/error.h"
#ifdef MARKBASE_HAS_CUDA
#include <cuda_runtime.h>

#include "cuda/cuda_backend.h"
#include "cuda/kernels.h"
#endif

namespace markbase {
namespace {

#ifdef MARKBASE_HAS_CUDA
template <class T>
struct DeviceBuf {
    T* p = nullptr;
    explicit DeviceBuf(const std::vector<T>& h) {
        EXPECT_EQ(cudaMalloc(&p, h.size() * sizeof(T)), cudaSuccess);
        EXPECT_EQ(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    }
    ~DeviceBuf() { cudaFree(p); }
    std::vector<T> get(size_t n) const {
        std::vector<T> h(n);
        EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
        return h;
    }
};

std::vector<bf16> random_bf16(size_t n, float scale, std::mt19937& rng) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<bf16> v(n);
    for (auto& x : v) x = float_to_bf16(d(rng));
    return v;
}
std::vector<float> random_f32(size_t n, float scale, std::mt19937& rng) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}

double inv_rms(const std::vector<double>& v, double eps) {
    double ss = 0;
    for (double x : v) ss += x * x;
    return 1.0 / std::sqrt(ss / static_cast<double>(v.size()) + eps);
}

double gelu_tanh(double x) {
    return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

void check_widths(int H, int P, int want_cluster, int mode = 0) {
    const int C = cuda::ple_block_cluster(H, P);
    ASSERT_EQ(C, want_cluster) << "cluster size at H " << H << ", P " << P;
    std::mt19937 rng(static_cast<unsigned>(H * 31 + P));
    const auto x = random_f32(H, 1.0f, rng), m = random_f32(H, 2.0f, rng), ple = random_f32(P, 1.0f, rng);
    const auto ffn_w = random_bf16(H, 1.0f, rng), post_w = random_bf16(H, 1.0f, rng);
    const auto next_w = random_bf16(H, 1.0f, rng);
    const auto gate = random_bf16(static_cast<size_t>(P) * H, 0.05f, rng);
    const auto proj = random_bf16(static_cast<size_t>(H) * P, 0.1f, rng);
    const float ffn_scale = 0.75f, layer_scale = 1.25f, eps = 1e-6f;

    DeviceBuf<float> dx(x), dm(m), dple(ple), dxn(std::vector<float>(H, NAN));
    DeviceBuf<bf16> dffn(ffn_w), dpost(post_w), dnext(next_w), dgate(gate), dproj(proj);
    cuda::PleBlockArgs a;
    a.x = dx.p;
    a.m = dm.p;
    a.ffn_w = dffn.p;
    a.ffn_scale = ffn_scale;
    a.gate = dgate.p;
    a.ple = dple.p;
    a.proj = dproj.p;
    a.post_w = dpost.p;
    a.layer_scale = layer_scale;
    a.next_w = dnext.p;
    a.xn = dxn.p;
    a.H = H;
    a.P = P;
    a.eps = eps;
    a.lab_mode = mode;
    cuda::ple_block(a, C, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto got_x = dx.get(H), got_xn = dxn.get(H);

    // the host's double-precision reference
    std::vector<double> mv(m.begin(), m.end()), x1(H), g(P), y(H), x2(H);
    const double rm = inv_rms(mv, eps);
    for (int k = 0; k < H; ++k) x1[k] = (x[k] + m[k] * rm * bf16_to_float(ffn_w[k])) * ffn_scale;
    for (int r = 0; r < P; ++r) {
        double s = 0;
        for (int k = 0; k < H; ++k) s += bf16_to_float(gate[static_cast<size_t>(r) * H + k]) * x1[k];
        g[r] = gelu_tanh(s) * ple[r];
    }
    for (int r = 0; r < H; ++r) {
        double s = 0;
        for (int k = 0; k < P; ++k) s += bf16_to_float(proj[static_cast<size_t>(r) * P + k]) * g[k];
        y[r] = s;
    }
    const double ry = inv_rms(y, eps);
    for (int k = 0; k < H; ++k) x2[k] = (x1[k] + y[k] * ry * bf16_to_float(post_w[k])) * layer_scale;
    const double rx = inv_rms(x2, eps);
    double err_x = 0, err_xn = 0, mag_x = 0, mag_xn = 0;
    for (int k = 0; k < H; ++k) {
        ASSERT_TRUE(std::isfinite(got_x[k]) && std::isfinite(got_xn[k])) << "element " << k;
        const double xn = x2[k] * rx * bf16_to_float(next_w[k]);
        err_x = std::max(err_x, std::abs(got_x[k] - x2[k]));
        err_xn = std::max(err_xn, std::abs(got_xn[k] - xn));
        mag_x = std::max(mag_x, std::abs(x2[k]));
        mag_xn = std::max(mag_xn, std::abs(xn));
    }
    std::printf("  H %d, P %d, cluster %d, copies %s: max rel err x %.2e, xn %.2e\n", H, P, C,
                mode == 2 ? "cp.async" : "bulk", err_x / mag_x, err_xn / mag_xn);
    EXPECT_LT(err_x / mag_x, 1e-5);
    EXPECT_LT(err_xn / mag_xn, 1e-5);
}
#endif

#define REQUIRE_GPU()                                                            \
    do {                                                                         \
        const CudaDeviceInfo info = cuda_device_info();                          \
        if (!info.available) GTEST_SKIP() << "no CUDA device: " << info.why_not; \
    } while (0)

TEST(CudaPleBlock, MatchesTheHostAtRealAndTinyWidths) {
#ifndef MARKBASE_HAS_CUDA
    GTEST_SKIP() << "no CUDA device: this build has no CUDA backend (MARKBASE_CUDA off or nvcc missing)";
#else
    REQUIRE_GPU();
    check_widths(1536, 256, 16);     // E2B
    check_widths(2560, 256, 16);     // E4B
    check_widths(72, 16, 8);         // the tiny E2B
    check_widths(88, 16, 8);         // the tiny E4B
    check_widths(1536, 256, 16, 2);  // the per-thread copies of the timeline's lab_mode 2
    check_widths(72, 16, 8, 2);
#endif
}

// Where a launch's time goes (not a check; run with --gtest_also_run_disabled_tests): each block's clock at
// the kernel's checkpoints, medians of 21 launches one at a time, and launches back to back; with the
// weights copied by cp.async.bulk (mode 0, the model's), not at all (1: wrong output, the chain alone) and by
// per-thread cp.async (2).
TEST(CudaPleBlock, DISABLED_Timeline) {
#ifdef MARKBASE_HAS_CUDA
    REQUIRE_GPU();
    int khz = 0;
    ASSERT_EQ(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0), cudaSuccess);
    const char* names[cuda::kPleTracePoints] = {"copies issued", "PDL wait",  "m, copies in", "x1",
                                                "gate pushed",   "barrier 1", "proj pushed",  "barrier 2",
                                                "x2 pushed",     "barrier 3", "stores"};
    for (const auto& [H, P] : {std::pair{1536, 256}, std::pair{2560, 256}}) {
        const int C = cuda::ple_block_cluster(H, P);
        ASSERT_GT(C, 0);
        std::mt19937 rng(3);
        DeviceBuf<float> dx(random_f32(H, 1.0f, rng)), dm(random_f32(H, 1.0f, rng)),
            dple(random_f32(P, 1.0f, rng));
        DeviceBuf<float> dxn(std::vector<float>(H, 0.0f));
        DeviceBuf<bf16> dw(random_bf16(H, 1.0f, rng)),
            dgate(random_bf16(static_cast<size_t>(P) * H, 0.05f, rng));
        DeviceBuf<bf16> dproj(random_bf16(static_cast<size_t>(H) * P, 0.05f, rng));
        DeviceBuf<long long> dtrace(
            std::vector<long long>(static_cast<size_t>(C) * cuda::kPleTracePoints, 0));
        for (int mode : {0, 1, 2}) {
            cuda::PleBlockArgs a;
            a.x = dx.p;
            a.m = dm.p;
            a.ffn_w = a.post_w = a.next_w = dw.p;
            a.gate = dgate.p;
            a.ple = dple.p;
            a.proj = dproj.p;
            a.xn = dxn.p;
            a.H = H;
            a.P = P;
            a.lab_mode = mode;
            a.lab_trace = dtrace.p;
            std::vector<std::vector<double>> b0(cuda::kPleTracePoints), mx(cuda::kPleTracePoints);
            for (int rep = 0; rep < 24; ++rep) {
                cuda::ple_block(a, C, nullptr);
                ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
                if (rep < 3) continue;
                const auto t = dtrace.get(static_cast<size_t>(C) * cuda::kPleTracePoints);
                for (int k = 0; k < cuda::kPleTracePoints; ++k) {
                    double m = 0;
                    for (int c = 0; c < C; ++c)
                        m = std::max(m, static_cast<double>(t[c * cuda::kPleTracePoints + k]));
                    b0[k].push_back(static_cast<double>(t[k]) / khz * 1e3);
                    mx[k].push_back(m / khz * 1e3);
                }
            }
            a.lab_trace = nullptr;
            cudaEvent_t e0, e1;
            cudaEventCreate(&e0);
            cudaEventCreate(&e1);
            cudaEventRecord(e0);
            for (int rep = 0; rep < 200; ++rep) cuda::ple_block(a, C, nullptr);
            cudaEventRecord(e1);
            ASSERT_EQ(cudaEventSynchronize(e1), cudaSuccess);
            float ms = 0;
            cudaEventElapsedTime(&ms, e0, e1);
            cudaEventDestroy(e0);
            cudaEventDestroy(e1);
            std::printf("  H %d, P %d, cluster %d, mode %d (%s): %.2f us per launch back to back\n", H, P, C,
                        mode,
                        mode == 0   ? "bulk"
                        : mode == 1 ? "no weights"
                                    : "cp.async",
                        ms * 1e3 / 200);
            auto median = [](std::vector<double> v) {
                std::sort(v.begin(), v.end());
                return v[v.size() / 2];
            };
            for (int k = 0; k < cuda::kPleTracePoints; ++k)
                std::printf("    %-14s block 0 %6.2f us, slowest block %6.2f us\n", names[k], median(b0[k]),
                            median(mx[k]));
        }
    }
#endif
}

TEST(CudaPleBlock, WidthsItCannotTakeAreRefused) {
#ifndef MARKBASE_HAS_CUDA
    GTEST_SKIP() << "no CUDA device: this build has no CUDA backend (MARKBASE_CUDA off or nvcc missing)";
#else
    REQUIRE_GPU();
    EXPECT_EQ(cuda::ple_block_cluster(100, 16), 0);     // 100 is not a multiple of 8
    EXPECT_EQ(cuda::ple_block_cluster(72, 12), 0);      // P not a multiple of 8
    EXPECT_EQ(cuda::ple_block_cluster(65536, 256), 0);  // over the kernel's width
    cuda::PleBlockArgs a;
    a.H = 72;
    a.P = 16;
    try {
        cuda::ple_block(a, 16, nullptr);  // 72 rows do not split over 16 blocks
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("cluster of 16"), std::string::npos) << e.what();
    }
#endif
}

}  // namespace
}  // namespace markbase
