// gemv_quant.cu, the decode step's products over FP8 and int4 weights, against an fp64 host product of the
// same codes, scales and zero points: three segments in one launch (tiles that end where a segment ends),
// the input norm folded in, matrices large and small enough for every K split (KS 1..8) and for both
// launches of one block a SM (fewer tiles than SMs; 336 tiles, balanced), int4 symmetric and
// asymmetric (a zero point per row and group, rows g and g + 8 of a tile with different ones) with a short
// last group (K = 704), FP8's long buffers (GemvInput::fp8_long_buffers) and short, the GeGLU launch, and the
// MoE's expert launches with a slot of another rank's expert (zero rows). Outputs are poisoned with NaN
// first, so every row must be written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/error.h"
#include "model/fp8.h"
#include "model/int4.h"
#include "support/device_arrays.h"
#include "support/require_cuda.h"

#ifdef MARKBASE_HAS_CUDA
#include <cuda_runtime.h>

#include "cuda/kernels/kernels.h"
#endif

namespace markbase {
namespace {

#ifdef MARKBASE_HAS_CUDA
using testing::from_bf16;
using testing::to_bf16;
using testing::to_device;
using testing::to_host;

enum class Kind { kFp8, kInt4Sym, kInt4Asym };

const char* kind_name(Kind k) {
    return k == Kind::kFp8 ? "fp8" : k == Kind::kInt4Sym ? "int4 symmetric" : "int4 asymmetric";
}

// A random quantised matrix [rows, K] on the host and the device (WeightFormat's layouts: model/fp8.h,
// model/int4.h), and its weights as the fp64 reference reads them.
struct QuantRows {
    WeightFormat format;
    int64_t rows;
    int K;
    std::vector<uint8_t> q, zero;
    std::vector<float> scale;
    QuantMatrix dev{};

    QuantRows(Kind kind, int64_t r, int k, std::mt19937& rng) : rows(r), K(k) {
        std::uniform_real_distribution<float> u(0.5f, 1.5f);
        std::uniform_int_distribution<int> byte(0, 255);
        if (kind == Kind::kFp8) {
            format = WeightFormat::kFp8;
            q.resize(static_cast<size_t>(rows) * K);
            for (uint8_t& b : q) {
                b = static_cast<uint8_t>(byte(rng));
                if ((b & 0x7f) == 0x7f) b = 0;  // no NaN
            }
            scale.resize(rows);
            for (float& s : scale) s = u(rng) / 448.0f;
        } else {
            format = WeightFormat::kInt4;
            const int64_t G = int4_groups(K);
            q.resize(static_cast<size_t>(rows) * K / 2);
            for (uint8_t& b : q) b = static_cast<uint8_t>(byte(rng));
            scale.resize(rows * G);
            for (float& s : scale) s = u(rng) / 8.0f;
            if (kind == Kind::kInt4Asym) {
                zero.resize(rows * G);
                for (uint8_t& z : zero) z = static_cast<uint8_t>(byte(rng) & 15);
            }
        }
        dev.q = to_device(q);
        dev.scale = to_device(scale);
        dev.zero = zero.empty() ? nullptr : to_device(zero);
    }
    ~QuantRows() {
        cudaFree(const_cast<uint8_t*>(dev.q));
        cudaFree(const_cast<float*>(dev.scale));
        if (dev.zero) cudaFree(const_cast<uint8_t*>(dev.zero));
    }
    QuantRows(const QuantRows&) = delete;
    QuantRows& operator=(const QuantRows&) = delete;

    double w(int64_t r, int k) const {
        if (format == WeightFormat::kFp8)
            return double(fp8_e4m3_to_float(q[static_cast<size_t>(r) * K + k])) * scale[r];
        const int64_t G = int4_groups(K), g = k / kInt4Group;
        const int code = int4_at(q.data() + r * (K / 2), k);
        const int z = zero.empty() ? kInt4SymmetricZero : zero[r * G + g];
        return (code - z) * double(scale[r * G + g]);
    }
    // sum_k w(r, k) x[k] and sum_k |w(r, k) x[k]|
    void dot(int64_t r, const std::vector<double>& x, double& s, double& mag) const {
        s = mag = 0.0;
        for (int k = 0; k < K; ++k) {
            const double p = w(r, k) * x[k];
            s += p;
            mag += std::fabs(p);
        }
    }
};

double gelu_tanh(double v) {
    return 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
}

float* poisoned(size_t n) {
    float* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, sizeof(float) * n), cudaSuccess);
    EXPECT_EQ(cudaMemset(p, 0xff, sizeof(float) * n), cudaSuccess);
    return p;
}

// |got - want| / mag, NaN or Inf as 1e30
double rel(float got, double want, double mag) {
    return std::isfinite(got) ? std::fabs(got - want) / (mag + 1e-30) : 1e30;
}

std::vector<float> random_x(int K, std::mt19937& rng) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> x(K);
    for (float& v : x) v = u(rng);
    return x;
}

// Segments of `rows` over one input, norm folded in or not; the worst error of any output.
double segments_error(Kind kind, const std::vector<int>& rows, int K, bool norm, uint32_t seed,
                      bool long_buffers = false) {
    std::mt19937 rng(seed);
    const std::vector<float> x = random_x(K, rng);
    std::vector<uint16_t> nw(K);
    std::uniform_real_distribution<float> u(0.5f, 1.5f);
    for (uint16_t& v : nw) v = to_bf16(u(rng));
    constexpr float kScale = 0.75f, kEps = 1e-6f;
    // the input as the kernel sums it
    std::vector<double> xn(x.begin(), x.end());
    if (norm) {
        double ss = 0.0;
        for (float v : x) ss += double(v) * v;
        const double inv = 1.0 / std::sqrt(ss / K + kEps);
        for (int k = 0; k < K; ++k) xn[k] = x[k] * inv * from_bf16(nw[k]) * kScale;
    }
    float* dx = to_device(x);
    uint16_t* dnw = to_device(nw);
    std::vector<std::unique_ptr<QuantRows>> m;
    std::vector<float*> y;
    std::vector<cuda::GemvSeg> segs;
    for (int r : rows) {
        m.push_back(std::make_unique<QuantRows>(kind, r, K, rng));
        y.push_back(poisoned(r));
        cuda::GemvSeg s;
        s.y = y.back();
        s.rows = r;
        s.q = m.back()->dev;
        s.format = m.back()->format;
        segs.push_back(s);
    }
    cuda::GemvInput in;
    in.x = dx;
    in.K = K;
    in.norm = norm;
    in.norm_w = norm ? reinterpret_cast<const bf16*>(dnw) : nullptr;
    in.norm_scale = kScale;
    in.eps = kEps;
    in.fp8_long_buffers = long_buffers;
    cuda::gemv_quant(in, segs.data(), static_cast<int>(segs.size()), nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    double worst = 0.0;
    for (size_t i = 0; i < rows.size(); ++i) {
        const std::vector<float> got = to_host(y[i], rows[i]);
        for (int r = 0; r < rows[i]; ++r) {
            double want, mag;
            m[i]->dot(r, xn, want, mag);
            worst = std::max(worst, rel(got[r], want, mag));
        }
        cudaFree(y[i]);
    }
    cudaFree(dx);
    cudaFree(dnw);
    return worst;
}

constexpr double kBound = 1e-5;  // x as two f16 halves keeps ~22 bits; sums in fp32
const Kind kKinds[] = {Kind::kFp8, Kind::kInt4Sym, Kind::kInt4Asym};
#endif

TEST(GemvQuant, SegmentsMatchTheFp64Product) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    cuda::gemv_quant_prepare();
    // (q, k, v)-like segments whose tiles end at each segment's end; K 704 leaves int4 a short last group
    for (Kind k : kKinds)
        for (int K : {704, 2048, 4096})  // (21 tiles at 4096: one block a tile, both formats)
            for (bool norm : {false, true})
                for (bool long_buffers : {false, true}) {
                    const double e = segments_error(k, {48, 16, 272}, K, norm, 11 + K, long_buffers);
                    EXPECT_LT(e, kBound) << kind_name(k) << " K " << K << (norm ? " with" : " without")
                                         << " norm" << (long_buffers ? ", long buffers" : "");
                }
#endif
}

TEST(GemvQuant, EveryKSplit) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    cuda::gemv_quant_prepare();
    // 2 blocks of 8 warps a SM: a matrix of 16 * 2 * SMs * 8 rows gives every warp a tile (KS = 1); half,
    // a quarter and an eighth of that split K 2, 4 and 8 ways (int4 at this K 4 at most: a warp walks at
    // least two super-steps)
    int sms = 0;
    ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
    const int full = 16 * 2 * sms * 8;
    for (Kind k : kKinds)
        for (int div : {1, 2, 4, 8}) {
            const int rows = full / div;
            const double e = segments_error(k, {rows}, 1024, false, 5 + div, div % 2 == 0);
            EXPECT_LT(e, kBound) << kind_name(k) << " " << rows << " rows";
        }
    // 336 tiles (the 31B's down): two blocks a SM would give 36 SMs four tiles, one block a SM gives three
    // (FP8's long buffers take it; the others keep two blocks a SM)
    for (Kind k : kKinds)
        for (bool long_buffers : {false, true}) {
            const double e = segments_error(k, {5376}, 2048, true, 9, long_buffers);
            EXPECT_LT(e, kBound) << kind_name(k) << " 5376 rows" << (long_buffers ? ", long buffers" : "");
        }
#endif
}

TEST(GemvQuant, GegluMatchesTheFp64Product) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    cuda::gemv_quant_prepare();
    for (Kind kind : kKinds)
        for (int rows : {96, 4096}) {
            constexpr int K = 2048;  // (96 rows: a block a tile, both formats)
            std::mt19937 rng(23 + rows);
            const std::vector<float> x = random_x(K, rng);
            const std::vector<double> xd(x.begin(), x.end());
            QuantRows gate(kind, rows, K, rng), up(kind, rows, K, rng);
            float* dx = to_device(x);
            float* y = poisoned(rows);
            cuda::GemvInput in;
            in.x = dx;
            in.K = K;
            in.fp8_long_buffers = rows == 4096;
            cuda::gemv_quant_geglu(in, gate.format, gate.dev, up.dev, rows, y, nullptr);
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            const std::vector<float> got = to_host(y, rows);
            double worst = 0.0;
            for (int r = 0; r < rows; ++r) {
                double a, ma, b, mb;
                gate.dot(r, xd, a, ma);
                up.dot(r, xd, b, mb);
                // the error of gelu(a) b from a's and b's: |gelu'| <= 1.13
                const double mag = 1.13 * ma * std::fabs(b) + std::fabs(gelu_tanh(a)) * mb;
                worst = std::max(worst, rel(got[r], gelu_tanh(a) * b, mag));
            }
            EXPECT_LT(worst, kBound) << kind_name(kind) << " " << rows << " rows";
            cudaFree(dx);
            cudaFree(y);
        }
#endif
}

TEST(GemvQuant, ExpertsMatchTheFp64Product) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    cuda::gemv_quant_prepare();
    constexpr int E = 4, Ie = 192, H = 256, kSlots = 3;  // Ie: int4 groups of 128 and 64
    const std::vector<int> group_expert = {2, -1, 0};    // slot 1: another rank's expert
    for (Kind kind : kKinds) {
        std::mt19937 rng(41);
        const std::vector<float> x = random_x(H, rng);
        const std::vector<double> xd(x.begin(), x.end());
        QuantRows gate_up(kind, int64_t{E} * 2 * Ie, H, rng), down(kind, int64_t{E} * H, Ie, rng);
        float* dx = to_device(x);
        int* dge = to_device(group_expert);
        float* h = poisoned(kSlots * Ie);
        float* out = poisoned(kSlots * H);
        cuda::moe_gate_up_decode_quant(gate_up.format, dx, H, gate_up.dev, Ie, kSlots, dge, h, nullptr);
        cuda::moe_down_decode_quant(down.format, h, Ie, down.dev, H, kSlots, dge, out, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<float> gh = to_host(h, kSlots * Ie), go = to_host(out, kSlots * H);
        double worst_h = 0.0, worst_out = 0.0;
        for (int s = 0; s < kSlots; ++s) {
            const int e = group_expert[s];
            if (e < 0) {
                for (int j = 0; j < H; ++j) EXPECT_EQ(go[s * H + j], 0.0f) << "slot " << s << " row " << j;
                continue;
            }
            std::vector<double> hs(Ie);
            for (int i = 0; i < Ie; ++i) {
                double a, ma, b, mb;
                gate_up.dot(int64_t{e} * 2 * Ie + i, xd, a, ma);
                gate_up.dot(int64_t{e} * 2 * Ie + Ie + i, xd, b, mb);
                hs[i] = gelu_tanh(a) * b;
                const double mag = 1.13 * ma * std::fabs(b) + std::fabs(gelu_tanh(a)) * mb;
                worst_h = std::max(worst_h, rel(gh[s * Ie + i], hs[i], mag));
            }
            // down against the kernel's own h (its error is the gate/up check's)
            const std::vector<double> hk(gh.begin() + s * Ie, gh.begin() + (s + 1) * Ie);
            for (int j = 0; j < H; ++j) {
                double want, mag;
                down.dot(int64_t{e} * H + j, hk, want, mag);
                worst_out = std::max(worst_out, rel(go[s * H + j], want, mag));
            }
        }
        EXPECT_LT(worst_h, kBound) << kind_name(kind) << " gate/up";
        EXPECT_LT(worst_out, kBound) << kind_name(kind) << " down";
        cudaFree(dx);
        cudaFree(dge);
        cudaFree(h);
        cudaFree(out);
    }
#endif
}

TEST(GemvQuant, RowsOutsideItsTilesAreAnError) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    std::mt19937 rng(3);
    QuantRows m(Kind::kFp8, 24, 128, rng);
    const std::vector<float> x = random_x(128, rng);
    float* dx = to_device(x);
    float* y = poisoned(24);
    cuda::GemvSeg s;
    s.y = y;
    s.rows = 24;
    s.q = m.dev;
    s.format = m.format;
    cuda::GemvInput in;
    in.x = dx;
    in.K = 128;
    try {
        cuda::gemv_quant(in, &s, 1, nullptr);
        ADD_FAILURE() << "24 rows were taken";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("multiples of 16 rows, not 24"), std::string::npos) << e.what();
    }
    cudaFree(dx);
    cudaFree(y);
#endif
}

}  // namespace
}  // namespace markbase
