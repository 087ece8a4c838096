#include "cpu/resident_weights.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "model/error.h"
#include "model/tensor_plan.h"

namespace markbase::cpu {
namespace {

constexpr uint64_t kHugePage = uint64_t{2} << 20;
constexpr uint64_t kAlign = 64;                      // every tensor starts on a cache line
constexpr uint64_t kCopyPiece = uint64_t{16} << 20;  // the copy's unit of work for the pool

// A /proc/meminfo line's value ("MemTotal", "MemAvailable") in bytes, 0 when absent.
uint64_t meminfo_bytes(const std::string& key) {
    std::ifstream f("/proc/meminfo");
    std::string line;
    while (std::getline(f, line)) {
        std::istringstream in(line);
        std::string name;
        uint64_t kib = 0;
        if (in >> name >> kib && name == key + ":") return kib << 10;
    }
    return 0;
}

struct Piece {
    const uint8_t* src;
    uint8_t* dst;
    uint64_t bytes;
};

// Unmaps the whole pages inside [p, p + bytes) of the read-only file mapping: the copy replaces them, and the
// process no longer holds them (they stay in the page cache, where the kernel may reclaim them; a later read
// of the range would fault them back in from there).
void drop_mapped_pages(const uint8_t* p, uint64_t bytes) {
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    const uint64_t lo = (reinterpret_cast<uint64_t>(p) + page - 1) / page * page;
    const uint64_t hi = (reinterpret_cast<uint64_t>(p) + bytes) / page * page;
    if (hi > lo) (void)::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

}  // namespace

CgroupMemory cgroup_memory(const std::filesystem::path& cgroup_root, const std::string& self_cgroup) {
    std::string v2_path, v1_path;  // from lines "0::PATH" and "N:...memory...:PATH"
    std::istringstream lines(self_cgroup);
    for (std::string line; std::getline(lines, line);) {
        const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
        if (b == std::string::npos) continue;
        const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
        if (line.compare(0, a, "0") == 0 && controllers.empty()) v2_path = path;
        if (("," + controllers + ",").find(",memory,") != std::string::npos) v1_path = path;
    }
    // The first of dirs that holds `file`, as a number ("max" and v1's near-2^63 "unlimited" read as none).
    auto read = [](const std::vector<std::filesystem::path>& dirs, const char* file) -> uint64_t {
        for (const auto& d : dirs) {
            std::ifstream f(d / file);
            std::string v;
            if (!(f >> v)) continue;
            if (v == "max") return 0;
            try {
                const uint64_t n = std::stoull(v);
                return n >= (uint64_t{1} << 62) ? 0 : n;
            } catch (const std::exception&) {
                return 0;
            }
        }
        return 0;
    };
    auto under = [&](const std::filesystem::path& base, const std::string& path) {
        return std::vector<std::filesystem::path>{base / std::filesystem::path(path).relative_path(), base};
    };
    CgroupMemory m;
    if (!v2_path.empty() && (m.limit = read(under(cgroup_root, v2_path), "memory.max")) > 0) {
        m.usage = read(under(cgroup_root, v2_path), "memory.current");
    } else if (!v1_path.empty()) {
        const auto dirs = under(cgroup_root / "memory", v1_path);
        m.limit = read(dirs, "memory.limit_in_bytes");
        m.usage = m.limit > 0 ? read(dirs, "memory.usage_in_bytes") : 0;
    }
    return m;
}

namespace {

CgroupMemory own_cgroup_memory() {
    std::ifstream f("/proc/self/cgroup");
    std::stringstream text;
    text << f.rdbuf();
    return cgroup_memory("/sys/fs/cgroup", text.str());
}

}  // namespace

uint64_t available_memory_bytes() {
    uint64_t avail = meminfo_bytes("MemAvailable");
    if (const CgroupMemory cg = own_cgroup_memory(); cg.limit > 0)
        avail = std::min(avail, cg.limit > cg.usage ? cg.limit - cg.usage : 0);
    return avail;
}

bool copy_fits_in_memory(uint64_t bytes) {
    const uint64_t avail = available_memory_bytes();
    uint64_t total = meminfo_bytes("MemTotal");
    if (const CgroupMemory cg = own_cgroup_memory(); cg.limit > 0) total = std::min(total, cg.limit);
    const uint64_t spare = std::max<uint64_t>(uint64_t{1} << 30, total / 10);
    return avail > spare && bytes <= avail - spare;
}

ResidentWeights::ResidentWeights(const Checkpoint& ck, ThreadPool& pool) : w_(ck.weights) {
    // Every planned tensor is bound (load_checkpoint refused the checkpoint otherwise): lay out the copy of
    // those in the mapping. The ones the loader made (FP8 weights dequantised to bf16) are private memory
    // already, and the page dropping below would zero them.
    const std::vector<PlannedTensor> plan = plan_bound_tensors(ck.config, w_);
    std::vector<std::pair<const PlannedTensor*, uint64_t>> streamed;  // and its bytes
    uint64_t total = 0;
    for (const PlannedTensor& p : plan) {
        if (p.slot == &w_.ple_embed || ck.owned.holds(*p.slot))
            continue;  // PLE: gathered by row, stays mapped
        uint64_t bytes = sizeof(bf16);
        for (int64_t d : p.shape) bytes *= static_cast<uint64_t>(d);
        streamed.push_back({&p, bytes});
        total += (bytes + kAlign - 1) / kAlign * kAlign;
    }
    if (total == 0 || !copy_fits_in_memory(total)) return;
    const uint64_t block_bytes = (total + kHugePage - 1) / kHugePage * kHugePage;
    void* block = ::mmap(nullptr, block_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (block == MAP_FAILED) return;  // stays mapped: slower, not wrong
    // Fewer TLB misses on the per-token stream where the kernel grants huge pages only on request (advice
    // only: a refusal changes nothing we rely on).
    (void)::madvise(block, block_bytes, MADV_HUGEPAGE);
    block_ = static_cast<uint8_t*>(block);
    block_bytes_ = block_bytes;
    bytes_ = total;

    std::vector<Piece> pieces;
    uint64_t off = 0;
    for (const auto& [p, bytes] : streamed) {
        uint8_t* dst = block_ + off;
        const auto* src = reinterpret_cast<const uint8_t*>(*p->slot);
        for (uint64_t b = 0; b < bytes; b += kCopyPiece)
            pieces.push_back({src + b, dst + b, std::min(kCopyPiece, bytes - b)});
        *p->slot = reinterpret_cast<const bf16*>(dst);
        off += (bytes + kAlign - 1) / kAlign * kAlign;
    }
    pool.parallel_for(static_cast<int64_t>(pieces.size()), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
            std::memcpy(pieces[i].dst, pieces[i].src, pieces[i].bytes);
            drop_mapped_pages(pieces[i].src, pieces[i].bytes);
        }
    });
    (void)::mprotect(block_, block_bytes_, PROT_READ);  // a stray write faults, as it did in the mapping
}

ResidentWeights::~ResidentWeights() {
    if (block_) ::munmap(block_, block_bytes_);
}

}  // namespace markbase::cpu
