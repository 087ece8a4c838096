// NCCL over every GPU of the host, one process driving all of them: the sum all-reduce the tensor-parallel
// decode step needs. Skips, saying why, without two GPUs (CI and single-GPU machines).
#include <gtest/gtest.h>

#include <vector>

#include "model/error.h"
#include "parallel/nccl_comm.h"

#if defined(MARKBASE_HAS_NCCL)
#include <cuda_runtime.h>
#endif

namespace markbase {
namespace {

TEST(Nccl, AllReduceSumsOverEveryGpu) {
#if !defined(MARKBASE_HAS_NCCL)
    GTEST_SKIP() << "this build has no NCCL (CUDA backend off or nccl.h not found)";
#else
    const int n_dev = NcclGroup::device_count();
    if (n_dev < 2) GTEST_SKIP() << "needs 2 or more GPUs, found " << n_dev;
    std::vector<int> devices(n_dev);
    for (int i = 0; i < n_dev; ++i) devices[i] = i;
    NcclGroup g(devices);
    const size_t n = 5376;  // the 31B hidden size: one all-reduce after o_proj
    std::vector<float*> bufs(n_dev);
    std::vector<void*> streams(n_dev, nullptr);
    for (int i = 0; i < n_dev; ++i) {
        ASSERT_EQ(cudaSetDevice(i), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&bufs[i], n * sizeof(float)), cudaSuccess);
        std::vector<float> h(n);
        for (size_t j = 0; j < n; ++j) h[j] = static_cast<float>((i + 1) * 0.5 + j * 1e-3);
        ASSERT_EQ(cudaMemcpy(bufs[i], h.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    }
    g.all_reduce_sum(bufs, n, streams);
    for (int i = 0; i < n_dev; ++i) {
        ASSERT_EQ(cudaSetDevice(i), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<float> h(n);
        ASSERT_EQ(cudaMemcpy(h.data(), bufs[i], n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
        for (size_t j = 0; j < n; j += 97) {
            double want = 0;
            for (int r = 0; r < n_dev; ++r) want += (r + 1) * 0.5 + j * 1e-3;
            ASSERT_NEAR(h[j], want, 1e-3) << "rank " << i << " element " << j;
        }
        cudaFree(bufs[i]);
    }
#endif
}

TEST(Nccl, WithoutNcclOrGpusItSaysSo) {
#if defined(MARKBASE_HAS_NCCL)
    if (NcclGroup::device_count() > 0)
        GTEST_SKIP() << "a GPU is present: the error path is for builds without NCCL";
    EXPECT_THROW(NcclGroup({0, 1}), Error);
#else
    try {
        NcclGroup g({0, 1});
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("no NCCL"), std::string::npos) << e.what();
    }
#endif
}

}  // namespace
}  // namespace markbase
