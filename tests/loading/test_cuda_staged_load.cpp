// The staged loader's CUDA sink (cuda/cuda_staged_load.cu) on a real device: the weights the backend holds
// after the staged load (the default; one device allocation) are byte-identical to the mapped checkpoint, the
// one-shot bench load moves every bound byte, and the free-memory query answers. Skips without a device
// (compiled everywhere CUDA is).
#include <gtest/gtest.h>

#ifdef MARKBASE_HAS_CUDA

#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_loader.h"
#include "loading/checkpoint.h"
#include "loading/random_checkpoint.h"
#include "model/error.h"
#include "model/tensor_plan.h"
#include "support/tiny_models.h"

using namespace markbase;

namespace {

// Sets an environment variable for the test's scope.
struct ScopedEnv {
    std::string name;
    ScopedEnv(const char* n, const char* v) : name(n) { ::setenv(n, v, 1); }
    ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

}  // namespace

TEST(CudaStagedLoad, WeightsAreByteExactAndFreeMemoryIsKnown) {
    const CudaDeviceInfo info = cuda_device_info();
    if (!info.available) GTEST_SKIP() << "no CUDA device: " << info.why_not;
    for (const char* family : {"e2b", "26b-a4b"}) {
        markbase::testing::TempDir dir("cuda_staged");
        write_random_checkpoint(dir.path(), markbase::testing::tiny_config(family), 5, 30000);
        const auto ck = load_checkpoint(dir.path());
        uint64_t free_b = 0, total_b = 0;
        ASSERT_TRUE(cuda_memory_info(&free_b, &total_b));
        EXPECT_GT(free_b, 0u);
        EXPECT_LE(free_b, total_b);

        ScopedEnv loader("MARKBASE_LOADER", "staged");
        ScopedEnv chunk("MARKBASE_LOAD_CHUNK_MIB", "1");  // many chunks even for a tiny model
        BackendOptions opt;
        opt.ctx_size = 64;
        opt.chunk = 16;
        const auto be = make_cuda_backend(*ck, opt);
        const auto host = copy_weights_to_host(*be);
        const std::vector<PlannedTensor> plan = plan_tensors(ck->config, nullptr);
        ASSERT_EQ(host->storage.size(), plan.size());
        for (size_t i = 0; i < plan.size(); ++i) {
            const TensorInfo& t = ck->files.get(ck->config.weight_prefix + plan[i].name);
            ASSERT_EQ(host->storage[i].size() * sizeof(bf16), t.nbytes) << plan[i].name;
            EXPECT_EQ(0, std::memcmp(host->storage[i].data(), t.data, t.nbytes))
                << family << " " << plan[i].name;
        }

        {
            ScopedEnv bad("MARKBASE_LOADER", "fast");
            try {
                make_cuda_backend(*ck, opt);
                ADD_FAILURE() << "MARKBASE_LOADER=fast was accepted";
            } catch (const Error& e) {
                EXPECT_NE(std::string(e.what()).find("MARKBASE_LOADER=fast"), std::string::npos) << e.what();
            }
        }

        StagedOptions o;
        o.threads = 3;
        o.chunk_bytes = 8192;
        const StagedStats st = cuda_staged_load_once(*ck, o);
        EXPECT_EQ(st.payload_bytes, ck->bound_bytes);
    }
}

#endif  // MARKBASE_HAS_CUDA
