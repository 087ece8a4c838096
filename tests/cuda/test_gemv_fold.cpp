// The residual update folded into its consumer GEMV (src/cuda/gemv_fold.cu, MARKBASE_CUDA_FOLD) against a
// double-precision host reference of the update followed by the product, at the widths the four models use
// (K = 1536, 2560, 5376: one, two and four warps per row) and a tiny one, with and without the consumer's
// input norm, plain (three segments, as q/k/v) and GELU-times-aux (the PLE gate). Outputs are poisoned with
// NaN first, so an element the kernel never writes fails. Skips without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
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

#define FOLD_CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

template <class T>
struct Dev {
    T* p = nullptr;
    explicit Dev(const std::vector<T>& h) {
        if (cudaMalloc(&p, h.size() * sizeof(T)) == cudaSuccess)
            cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
    }
    ~Dev() { cudaFree(p); }
    std::vector<T> get(size_t n) const {
        std::vector<T> h(n);
        cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
        return h;
    }
};

struct Case {
    int K;
    std::vector<int> rows;  // per output segment
    bool norm;              // the consumer's input norm (q/k/v); false: the PLE gate, GELU times aux
};

double gelu_tanh(double x) {
    return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

void run_case(const Case& c, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> ud(0.5f, 1.5f);
    const int K = c.K;
    int total = 0;
    for (int r : c.rows) total += r;
    std::vector<float> x(K), y(K), aux(total);
    std::vector<bf16> wres(K), wn(K), W(static_cast<size_t>(total) * K);
    for (int k = 0; k < K; ++k) {
        x[k] = 3.0f * nd(rng);
        y[k] = 0.2f * nd(rng);
        wres[k] = float_to_bf16(ud(rng));
        wn[k] = float_to_bf16(ud(rng));
    }
    for (auto& w : W) w = float_to_bf16(0.05f * nd(rng));
    for (auto& a : aux) a = nd(rng);
    const float eps = 1e-6f, scale = 0.75f;

    // the host reference, in double: the update, then the product
    double ssy = 0.0;
    for (int k = 0; k < K; ++k) ssy += double{y[k]} * y[k];
    const double inv_y = 1.0 / std::sqrt(ssy / K + eps);
    std::vector<double> xp(K), xin(K);
    double ssx = 0.0;
    for (int k = 0; k < K; ++k) {
        xp[k] = (x[k] + y[k] * inv_y * bf16_to_float(wres[k])) * scale;
        ssx += xp[k] * xp[k];
    }
    const double inv_x = 1.0 / std::sqrt(ssx / K + eps);
    for (int k = 0; k < K; ++k) xin[k] = c.norm ? xp[k] * inv_x * bf16_to_float(wn[k]) : xp[k];
    std::vector<double> ref(total);
    double ref_max = 0.0, xp_max = 0.0;
    for (int r = 0; r < total; ++r) {
        double s = 0.0;
        for (int k = 0; k < K; ++k) s += bf16_to_float(W[static_cast<size_t>(r) * K + k]) * xin[k];
        ref[r] = c.norm ? s : gelu_tanh(s) * aux[r];
        ref_max = std::max(ref_max, std::abs(ref[r]));
    }
    for (int k = 0; k < K; ++k) xp_max = std::max(xp_max, std::abs(xp[k]));

    const std::vector<float> poison_out(total, NAN), poison_x(K, NAN);
    Dev<float> dx(x), dy(y), daux(aux), dout(poison_out), dxo(poison_x);
    Dev<bf16> dwres(wres), dwn(wn), dW(W);
    ASSERT_TRUE(dx.p && dy.p && daux.p && dout.p && dxo.p && dwres.p && dwn.p && dW.p);
    cuda::GemvInput in;
    in.variant = cuda::kGemvVariantWarpK;
    in.x = dx.p;
    in.K = K;
    in.eps = eps;
    in.norm = c.norm;
    in.norm_w = c.norm ? dwn.p : nullptr;
    in.fold = {dy.p, dwres.p, scale, dxo.p};
    if (c.norm) {
        std::vector<cuda::GemvSeg> segs;
        int at = 0;
        for (int r : c.rows) {
            segs.push_back({dW.p + static_cast<size_t>(at) * K, dout.p + at, r, 0});
            at += r;
        }
        cuda::gemv(in, segs.data(), static_cast<int>(segs.size()), 1, nullptr);
    } else {
        cuda::gemv_gelu_mul(in, dW.p, total, daux.p, dout.p, nullptr);
    }
    FOLD_CUDA_OK(cudaDeviceSynchronize());
    const auto out = dout.get(total);
    const auto xo = dxo.get(K);
    double err = 0.0, xerr = 0.0;
    for (int r = 0; r < total; ++r) {
        ASSERT_TRUE(std::isfinite(out[r])) << "row " << r << " of K = " << K << " was not written or is not finite";
        err = std::max(err, std::abs(out[r] - ref[r]));
    }
    for (int k = 0; k < K; ++k) {
        ASSERT_TRUE(std::isfinite(xo[k])) << "x' element " << k << " of K = " << K << " was not written";
        xerr = std::max(xerr, std::abs(xo[k] - xp[k]));
    }
    std::printf("  fold K = %d, %d rows, %s: product rel err %.2e, x' rel err %.2e\n", K, total,
                c.norm ? "normed" : "gelu*aux", err / ref_max, xerr / xp_max);
    EXPECT_LT(err / ref_max, 2e-5) << "K = " << K;
    EXPECT_LT(xerr / xp_max, 1e-6) << "K = " << K;
}

TEST(CudaGemvFold, MatchesTheUpdateThenTheProduct) {
    const CudaDeviceInfo info = cuda_device_info();
    if (!info.available) GTEST_SKIP() << "no CUDA device: " << info.why_not;
    const Case cases[] = {
        {1536, {2048, 256, 256}, true},  // E2B's q/k/v (one warp per row)
        {1536, {256}, false},            // E2B's PLE gate
        {2560, {2048, 512, 512}, true},  // E4B (two warps per row)
        {2560, {256}, false},
        {5376, {4096, 1024, 1024}, true},  // 31B (four warps per row)
        {72, {20, 4, 4}, true},            // a tiny model's width: fewer chunks than lanes
        {72, {8}, false},
    };
    uint32_t seed = 1;
    for (const Case& c : cases) run_case(c, seed++);
}

TEST(CudaGemvFold, RefusesToWriteTheStreamItReads) {
    const CudaDeviceInfo info = cuda_device_info();
    if (!info.available) GTEST_SKIP() << "no CUDA device: " << info.why_not;
    std::vector<float> v(64, 1.0f);
    std::vector<bf16> w(64 * 8, float_to_bf16(1.0f));
    Dev<float> dx(v), dy(v), dout(v);
    Dev<bf16> dw(w);
    cuda::GemvInput in;
    in.variant = cuda::kGemvVariantWarpK;
    in.x = dx.p;
    in.K = 64;
    in.fold = {dy.p, dw.p, 1.0f, dx.p};  // x' over x, which other blocks are still reading
    const cuda::GemvSeg seg{dw.p, dout.p, 8, 0};
    try {
        cuda::gemv(in, &seg, 1, 1, nullptr);
        ADD_FAILURE() << "a fold writing x' over x was launched";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("writes x' to a buffer it does not read"), std::string::npos)
            << e.what();
    }
}

#else

TEST(CudaGemvFold, MatchesTheUpdateThenTheProduct) {
    GTEST_SKIP() << "built without CUDA";
}

#endif

}  // namespace
}  // namespace markbase
