// Which CPUs the CPU backend may use and how many threads it starts by default: one per physical core of the
// process's affinity mask, as llama.cpp does (a second hardware thread on a core shares its FMA units and its
// cache bandwidth, so it adds little to a memory- or FMA-bound matmul, and a `taskset` of two CPUs means two
// threads, not one per CPU of the machine).
#pragma once

#include <filesystem>
#include <vector>

namespace markbase::cpu {

// The CPUs of this process's affinity mask, in order (empty where it cannot be read).
std::vector<int> allowed_cpus();

// The physical cores among `cpus`: distinct (physical_package_id, core_id) pairs read from
// sys_cpu/cpuN/topology/ (sys_cpu is /sys/devices/system/cpu on Linux); 0 when any CPU's topology cannot be
// read.
int physical_cores(const std::filesystem::path& sys_cpu, const std::vector<int>& cpus);

// The default thread count: the physical cores of the affinity mask, else the mask's CPUs, else
// std::thread::hardware_concurrency(); at least 1.
int default_thread_count();

}  // namespace markbase::cpu
