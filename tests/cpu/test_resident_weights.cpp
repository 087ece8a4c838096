// The CPU backend's copy of its streamed weights (cpu/resident_weights.h): every tensor it streams points
// into the copy and holds the checkpoint's bytes, the per-layer embedding table (read by row) stays mapped,
// the values that are not pointers survive, and a copy larger than the memory is refused.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <limits>
#include <string>

#include "cpu/resident_weights.h"
#include "loading/random_checkpoint.h"
#include "model/tensor_plan.h"
#include "support/tiny_models.h"

using namespace markbase;

class ResidentWeightsFamilies : public ::testing::TestWithParam<std::string> {};

TEST_P(ResidentWeightsFamilies, StreamedTensorsPointIntoTheCopyWithTheCheckpointsBytes) {
    markbase::testing::TempDir dir("resident_" + markbase::testing::test_name(GetParam()));
    write_random_checkpoint(dir.path(), markbase::testing::tiny_config(GetParam()), 21);
    const auto ck = load_checkpoint(dir.path());
    cpu::ThreadPool pool(2);
    const cpu::ResidentWeights rw(*ck, pool);
    if (rw.bytes() == 0)
        GTEST_SKIP()
            << "this machine has under 1 GiB (or a tenth of its memory) free: the weights stay mapped";

    const Weights& w = rw.weights();
    ASSERT_EQ(w.layers.size(), ck->weights.layers.size());
    for (size_t i = 0; i < w.layers.size(); ++i)
        EXPECT_EQ(w.layers[i].layer_scalar, ck->weights.layers[i].layer_scalar) << "layer " << i;

    Weights probe;
    uint64_t copied = 0;
    for (const PlannedTensor& p : plan_tensors(ck->config, &probe)) {
        const TensorInfo& t = ck->files.get(ck->config.weight_prefix + p.name);
        // the same field of rw.weights(): its offset in probe, applied to w
        const bf16* got = nullptr;
        const auto* slot = reinterpret_cast<const uint8_t*>(p.slot);
        const auto* base = reinterpret_cast<const uint8_t*>(&probe);
        if (slot >= base && slot < base + sizeof(Weights)) {
            got = *reinterpret_cast<const bf16* const*>(reinterpret_cast<const uint8_t*>(&w) + (slot - base));
        } else {
            for (size_t i = 0; i < probe.layers.size(); ++i) {
                const auto* lb = reinterpret_cast<const uint8_t*>(&probe.layers[i]);
                if (slot >= lb && slot < lb + sizeof(LayerWeights))
                    got = *reinterpret_cast<const bf16* const*>(
                        reinterpret_cast<const uint8_t*>(&w.layers[i]) + (slot - lb));
            }
        }
        ASSERT_NE(got, nullptr) << p.name;
        EXPECT_EQ(std::memcmp(got, t.data, t.nbytes), 0) << p.name << ": the copy's bytes differ";
        if (p.name == "embed_tokens_per_layer.weight") {
            EXPECT_EQ(static_cast<const void*>(got), t.data)
                << "the per-layer embedding table is read by row";
        } else {
            EXPECT_NE(static_cast<const void*>(got), t.data) << p.name << " still points into the mapping";
            EXPECT_EQ(reinterpret_cast<uintptr_t>(got) % 64, 0u) << p.name;
            copied += t.nbytes;
        }
    }
    EXPECT_GE(rw.bytes(), copied);
    EXPECT_LT(rw.bytes(), copied + 64 * 400);  // padding to 64 bytes per tensor, no more
}

INSTANTIATE_TEST_SUITE_P(Families, ResidentWeightsFamilies, ::testing::Values("e2b", "26b-a4b", "31b"),
                         [](const auto& p) { return markbase::testing::test_name(p.param); });

TEST(ResidentWeights, ACopyLargerThanTheMemoryIsRefused) {
    EXPECT_FALSE(cpu::copy_fits_in_memory(std::numeric_limits<uint64_t>::max() / 2));
    if (cpu::available_memory_bytes() == 0) GTEST_SKIP() << "/proc/meminfo has no MemAvailable here";
    EXPECT_FALSE(cpu::copy_fits_in_memory(cpu::available_memory_bytes()));  // nothing left to spare
    EXPECT_TRUE(cpu::copy_fits_in_memory(0) || cpu::available_memory_bytes() < (uint64_t{2} << 30));
}

// A container's memory limit, which /proc/meminfo does not show: cgroup v2 and v1 layouts, the process's own
// path or the namespace's root, and "no limit" in both spellings.
TEST(ResidentWeights, TheCgroupsLimitCapsTheMemoryACopyMayTake) {
    markbase::testing::TempDir dir("cgroup");
    const auto root = dir.path();
    auto put = [](const std::filesystem::path& d, const char* file, const char* v) {
        std::filesystem::create_directories(d);
        std::ofstream(d / file) << v << "\n";
    };
    put(root / "a/b", "memory.max", "1000000000");
    put(root / "a/b", "memory.current", "250000000");
    cpu::CgroupMemory m = cpu::cgroup_memory(root, "0::/a/b\n");
    EXPECT_EQ(m.limit, 1000000000u);
    EXPECT_EQ(m.usage, 250000000u);
    put(root / "c", "memory.max", "max");
    EXPECT_EQ(cpu::cgroup_memory(root, "0::/c\n").limit, 0u);
    // v1: the memory controller's own hierarchy; a path the namespace hides falls back to its root
    put(root / "memory/x", "memory.limit_in_bytes", "2000000000");
    put(root / "memory/x", "memory.usage_in_bytes", "500000000");
    m = cpu::cgroup_memory(root, "4:memory:/x\n0::/\n");
    EXPECT_EQ(m.limit, 2000000000u);
    EXPECT_EQ(m.usage, 500000000u);
    put(root / "memory", "memory.limit_in_bytes", "9223372036854771712");  // v1's "unlimited"
    EXPECT_EQ(cpu::cgroup_memory(root, "4:memory:/hidden\n").limit, 0u);
    EXPECT_EQ(cpu::cgroup_memory(root / "nothing", "0::/\n").limit, 0u);
    EXPECT_EQ(cpu::cgroup_memory(root, "").limit, 0u);
}
