// The default thread count's topology reading (cpu/cpu_topology.h): one thread per physical core of the CPUs
// the process may use, counted from sysfs; an unreadable topology counts as unknown, not as one core.
#include <gtest/gtest.h>

#include <fstream>
#include <thread>

#include "cpu/cpu_topology.h"
#include "support/tiny_models.h"

using namespace markbase;

namespace {

// A fake /sys/devices/system/cpu: cpu i in package packages[i], core cores[i].
void write_topology(const std::filesystem::path& root, const std::vector<int>& packages,
                    const std::vector<int>& cores) {
    for (size_t i = 0; i < cores.size(); ++i) {
        const auto topo = root / ("cpu" + std::to_string(i)) / "topology";
        std::filesystem::create_directories(topo);
        std::ofstream(topo / "physical_package_id") << packages[i] << "\n";
        std::ofstream(topo / "core_id") << cores[i] << "\n";
    }
}

}  // namespace

TEST(CpuTopology, CountsPhysicalCoresOfTheAllowedCpus) {
    markbase::testing::TempDir dir("topology");
    // two packages of two cores, two hardware threads each: cpus 0-3 package 0, cpus 4-7 package 1
    write_topology(dir.path(), {0, 0, 0, 0, 1, 1, 1, 1}, {0, 1, 0, 1, 0, 1, 0, 1});
    EXPECT_EQ(cpu::physical_cores(dir.path(), {0, 1, 2, 3, 4, 5, 6, 7}), 4);
    EXPECT_EQ(cpu::physical_cores(dir.path(), {0, 2}), 1);  // siblings of one core
    EXPECT_EQ(cpu::physical_cores(dir.path(), {0, 1}), 2);  // a taskset of two cores
    EXPECT_EQ(cpu::physical_cores(dir.path(), {0, 4}), 2);  // core 0 of each package
    EXPECT_EQ(cpu::physical_cores(dir.path(), {0, 9}), 0);  // cpu9 has no topology: unknown
    std::ofstream(dir.path() / "cpu1" / "topology" / "core_id") << "x\n";
    EXPECT_EQ(cpu::physical_cores(dir.path(), {0, 1}), 0);  // unreadable: unknown
}

TEST(CpuTopology, TheDefaultIsAtLeastOneAndAtMostTheAllowedCpus) {
    const int n = cpu::default_thread_count();
    EXPECT_GE(n, 1);
    const auto cpus = cpu::allowed_cpus();
    if (!cpus.empty()) {
        EXPECT_LE(n, static_cast<int>(cpus.size()));
    }
}
