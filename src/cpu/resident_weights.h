// The weights the CPU backend streams every token, copied at load out of the checkpoint's page-cache mapping
// into one block of anonymous memory. On a 2-core Zen 5 VM the E2B decoded 1.37x faster from the copy
// (130.5 -> 95.1 ms/token at 2 threads, medians of 3 interleaved pairs; prefill of 64 43.4 -> 51.0 tok/s):
// streaming a mapped file page by page costs more than streaming private memory. The per-layer embedding
// table, read only at the prompt's token rows, stays mapped. Where the copy would not leave the machine
// memory to spare, every weight stays mapped: a model larger than the memory still runs, at the storage's
// speed.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "cpu/thread_pool.h"
#include "loading/checkpoint.h"

namespace markbase::cpu {

// The memory limit and usage of this process's cgroup: v2's memory.max and memory.current, else v1's
// memory.limit_in_bytes and memory.usage_in_bytes, under `cgroup_root` (/sys/fs/cgroup) at the path that
// `self_cgroup` (the text of /proc/self/cgroup) names, or at the root where that path is not visible (a
// container's namespace). limit 0: no limit, or none could be read. A container's limit is not in
// /proc/meminfo, which shows the host's memory.
struct CgroupMemory {
    uint64_t limit = 0, usage = 0;
};
CgroupMemory cgroup_memory(const std::filesystem::path& cgroup_root, const std::string& self_cgroup);

// The memory a new allocation can take without swapping or meeting the cgroup's limit (/proc/meminfo
// MemAvailable, capped by the cgroup's limit less its usage), 0 where unreadable.
uint64_t available_memory_bytes();

// Whether `bytes` more leave at least 1 GiB or a tenth of the memory (the machine's, or the cgroup's limit
// where lower) free, whichever is larger (false where /proc/meminfo cannot be read).
bool copy_fits_in_memory(uint64_t bytes);

class ResidentWeights {
  public:
    ResidentWeights(const Checkpoint& ck, ThreadPool& pool);
    ~ResidentWeights();
    ResidentWeights(const ResidentWeights&) = delete;
    ResidentWeights& operator=(const ResidentWeights&) = delete;

    // ck.weights with every streamed tensor pointing into the copy (or all into the mapping: bytes() == 0);
    // the tensors the loader made (FP8 weights' bf16 values, ck.owned) are not copied again
    const Weights& weights() const { return w_; }
    uint64_t bytes() const { return bytes_; }  // the copy's size, 0 when the weights stay mapped

  private:
    Weights w_;
    uint8_t* block_ = nullptr;
    uint64_t bytes_ = 0, block_bytes_ = 0;
};

}  // namespace markbase::cpu
