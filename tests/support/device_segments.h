// The projection kernels' tests (stream_gemm, tile_gemm): random bf16 weight matrices of one input on the
// device as GemvSeg segments, their outputs poisoned with NaN (so every output must be written, at a row
// stride wider than any matrix), and each output checked against the fp64 product of the tokens' values.
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
    }
    DeviceSegments(const DeviceSegments&) = delete;
    DeviceSegments& operator=(const DeviceSegments&) = delete;

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
    std::vector<int> rows_;
    int K_, n_;
    std::vector<std::vector<uint16_t>> w_;
    std::vector<uint16_t*> d_w_;
    std::vector<float*> d_y_;
    std::vector<cuda::GemvSeg> segs_;
};

}  // namespace markbase::testing
#endif
