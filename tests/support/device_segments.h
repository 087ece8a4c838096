// The projection kernels' tests (stream_gemm, tile_gemm): random bf16 weight matrices of one input on the
// device as GemvSeg segments (or as FP8 or int4 rows), their outputs poisoned with NaN (so every output must
// be written, at a row stride wider than any matrix), and each output checked against the fp64 product of the
// tokens' values.
#pragma once

#ifdef MARKBASE_HAS_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cuda/kernels/kernels.h"
#include "support/device_arrays.h"

namespace markbase::testing {

class DeviceSegments {
  public:
    static constexpr int64_t kLdy = 4096;  // wider than any row count in these tests: the stride is honoured

    DeviceSegments(const std::vector<int>& rows, int K, int n, std::mt19937& rng)
        : rows_(rows), K_(K), n_(n) {
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        for (int r : rows) {
            w_.emplace_back(static_cast<size_t>(r) * K);
            for (uint16_t& v : w_.back()) v = to_bf16(0.05f * u(rng));
            d_w_.push_back(to_device(w_.back()));
            d_y_.push_back(nullptr);
            EXPECT_EQ(cudaMalloc(&d_y_.back(), sizeof(float) * kLdy * n), cudaSuccess);
            EXPECT_EQ(cudaMemset(d_y_.back(), 0xff, sizeof(float) * kLdy * n), cudaSuccess);
            segs_.push_back({d_w_.back(), d_y_.back(), r, kLdy, {}, {}});
        }
    }
    ~DeviceSegments() {
        for (uint16_t* p : d_w_) cudaFree(p);
        for (float* p : d_y_) cudaFree(p);
        for (void* p : d_quant_) cudaFree(p);
    }
    DeviceSegments(const DeviceSegments&) = delete;
    DeviceSegments& operator=(const DeviceSegments&) = delete;

    // The segments read FP8 rows from here on: each matrix quantised on the device (quantize_rows_fp8: e4m3
    // with a scale per row, the bf16 rows rewritten as the values those hold, and copied back here), so
    // worst_error's fp64 products are the FP8 values'.
    void quantize_fp8() {
        for (size_t s = 0; s < segs_.size(); ++s) {
            uint8_t* q = device_bytes<uint8_t>(static_cast<size_t>(rows_[s]) * K_);
            float* scale = device_bytes<float>(static_cast<size_t>(rows_[s]));
            cuda::quantize_rows_fp8(d_w_[s], rows_[s], K_, q, scale, nullptr);
            w_[s] = to_host(d_w_[s], w_[s].size());
            read_quantised(s, {q, scale, nullptr}, WeightFormat::kFp8);
        }
    }

    // The segments read int4 rows from here on: random nibbles, a scale in [0.004, 0.01) and (with
    // zero_points) a zero point 0..15 per group of 128 along K, else the symmetric 8; the bf16 weights
    // rewritten as (nibble - zero) x scale in fp32 rounded to bf16 (quantize_rows.cu's rule).
    void quantize_int4(std::mt19937& rng, bool zero_points) {
        const int G = (K_ + 127) / 128;
        std::uniform_int_distribution<int> nib(0, 15);
        std::uniform_real_distribution<float> sc(0.004f, 0.01f);
        for (size_t s = 0; s < segs_.size(); ++s) {
            const size_t R = static_cast<size_t>(rows_[s]);
            std::vector<uint8_t> q(R * K_ / 2), zero(R * G);
            std::vector<float> scale(R * G);
            for (float& v : scale) v = sc(rng);
            for (uint8_t& z : zero) z = static_cast<uint8_t>(zero_points ? nib(rng) : 8);
            for (size_t r = 0; r < R; ++r)
                for (int k = 0; k < K_; ++k) {
                    const int n = nib(rng), g = k / 128;
                    q[r * K_ / 2 + k / 2] |= static_cast<uint8_t>(n << (4 * (k & 1)));
                    const float v = static_cast<float>(n - zero[r * G + g]) * scale[r * G + g];
                    w_[s][r * K_ + k] = to_bf16(v);
                }
            uint8_t* d_q = device_bytes<uint8_t>(q.size());
            float* d_scale = device_bytes<float>(scale.size());
            uint8_t* d_zero = zero_points ? device_bytes<uint8_t>(zero.size()) : nullptr;
            EXPECT_EQ(cudaMemcpy(d_q, q.data(), q.size(), cudaMemcpyHostToDevice), cudaSuccess);
            EXPECT_EQ(cudaMemcpy(d_scale, scale.data(), sizeof(float) * scale.size(), cudaMemcpyHostToDevice),
                      cudaSuccess);
            if (d_zero) {
                EXPECT_EQ(cudaMemcpy(d_zero, zero.data(), zero.size(), cudaMemcpyHostToDevice), cudaSuccess);
            }
            read_quantised(s, {d_q, d_scale, d_zero}, WeightFormat::kInt4);
        }
    }

    const cuda::GemvSeg* segs() const { return segs_.data(); }
    int count() const { return static_cast<int>(segs_.size()); }

    // The largest |got - want| / sum_k |x w| over every output after a launch (synchronised here), x the
    // tokens' values as the kernel sums them ([n][K]); NaN or Inf counts as 1e30.
    double worst_error(const std::vector<double>& x) {
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        double worst = 0.0;
        for (size_t s = 0; s < segs_.size(); ++s) {
            const std::vector<float> y = to_host(d_y_[s], static_cast<size_t>(kLdy) * n_);
            for (int t = 0; t < n_; ++t)
                for (int r = 0; r < rows_[s]; ++r) {
                    double want = 0.0, mag = 0.0;
                    for (int k = 0; k < K_; ++k) {
                        const double p = x[static_cast<size_t>(t) * K_ + k] *
                                         double(from_bf16(w_[s][static_cast<size_t>(r) * K_ + k]));
                        want += p;
                        mag += std::fabs(p);
                    }
                    const float got = y[static_cast<size_t>(t) * kLdy + r];
                    worst = std::max(worst, std::isfinite(got) ? std::fabs(got - want) / mag : 1e30);
                }
        }
        return worst;
    }

  private:
    template <class T>
    T* device_bytes(size_t n) {
        T* p = nullptr;
        EXPECT_EQ(cudaMalloc(&p, sizeof(T) * n), cudaSuccess);
        d_quant_.push_back(p);
        return p;
    }
    void read_quantised(size_t s, QuantMatrix q, WeightFormat f) {
        segs_[s].w = nullptr;
        segs_[s].q = q;
        segs_[s].format = f;
    }

    std::vector<int> rows_;
    int K_, n_;
    std::vector<std::vector<uint16_t>> w_;
    std::vector<uint16_t*> d_w_;
    std::vector<float*> d_y_;
    std::vector<void*> d_quant_;  // the quantised rows, scales and zero points
    std::vector<cuda::GemvSeg> segs_;
};

}  // namespace markbase::testing
#endif
