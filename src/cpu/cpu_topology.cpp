#include "cpu/cpu_topology.h"

#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <utility>

#if defined(__linux__)
#include <sched.h>
#endif

namespace markbase::cpu {
namespace {

// The integer in a one-line sysfs file, or -1 when it cannot be read.
long read_number(const std::filesystem::path& p) {
    std::ifstream f(p);
    long v = -1;
    if (!(f >> v)) return -1;
    return v;
}

}  // namespace

std::vector<int> allowed_cpus() {
    std::vector<int> out;
#if defined(__linux__)
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) return out;
    for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &set)) out.push_back(c);
#endif
    return out;
}

int physical_cores(const std::filesystem::path& sys_cpu, const std::vector<int>& cpus) {
    std::set<std::pair<long, long>> cores;
    for (int c : cpus) {
        const std::filesystem::path topo = sys_cpu / ("cpu" + std::to_string(c)) / "topology";
        const long package = read_number(topo / "physical_package_id"), core = read_number(topo / "core_id");
        if (package < 0 || core < 0) return 0;
        cores.insert({package, core});
    }
    return static_cast<int>(cores.size());
}

int default_thread_count() {
    const std::vector<int> cpus = allowed_cpus();
    if (const int cores = physical_cores("/sys/devices/system/cpu", cpus); cores > 0) return cores;
    if (!cpus.empty()) return static_cast<int>(cpus.size());
    const unsigned hw = std::thread::hardware_concurrency();
    return hw > 0 ? static_cast<int>(hw) : 1;
}

}  // namespace markbase::cpu
