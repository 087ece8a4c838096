// The staged loader's CUDA sink (cuda/staged_load.cu) on a real device: the weights the backend holds
// after the staged load (the default; one device allocation) are byte-identical to the mapped checkpoint, the
// one-shot bench load moves every bound byte, and the free-memory query answers. Skips without a device
// (compiled everywhere CUDA is).
#include <gtest/gtest.h>

#ifdef MARKBASE_HAS_CUDA

#include <cstring>
#include <string>

#include "cuda/backend.h"
#include "cuda/loader.h"
#include "loading/checkpoint.h"
#include "loading/random_checkpoint.h"
#include "model/error.h"
#include "model/tensor_plan.h"
#include "support/tiny_models.h"

using namespace markbase;

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

        BackendOptions opt;
        opt.ctx_size = 64;
        opt.chunk = 16;
        opt.tuning = parse_tuning("load_chunk_mib=1,load_threads=3");  // many chunks even for a tiny model
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

        StagedOptions o;
        o.threads = 3;
        o.chunk_bytes = 8192;
        const StagedStats st = cuda_staged_load_once(*ck, o);
        EXPECT_EQ(st.payload_bytes, ck->bound_bytes);
    }
}

#endif  // MARKBASE_HAS_CUDA
