// markbase bench load -m DIR [--device cpu|cuda] [-t THREADS] [--chunk-mib 64] [--buffers K] [--direct]
//                     [-r 3] [--no-cold] [--json-out FILE]
// How fast the checkpoint's weights reach their destination through the staged pipeline
// (loading/staged_reader.h), next to the file system's own sequential read speed measured in the same run,
// so the ratio is honest. Cold runs drop the page cache first (root only; the receipt says when it could
// not); warm runs read from the page cache. --device cpu copies into a host arena (allocated and touched
// outside the timing), --device cuda into one device allocation (allocation inside the timing).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "cli/commands/args.h"
#include "cli/commands/commands.h"
#include "cli/commands/model_options.h"
#include "loading/checkpoint.h"
#include "loading/memory_plan.h"
#include "loading/staged_reader.h"
#include "model/error.h"
#include "runtime/progress.h"
#include "runtime/timing.h"
#ifdef MARKBASE_HAS_CUDA
#include "cuda/backend.h"
#include "cuda/loader.h"
#endif

namespace markbase::cli {

namespace {

double gbs(uint64_t bytes, double s) {
    return s > 0 ? static_cast<double>(bytes) / s / 1e9 : 0.0;
}

// Empties the page cache so the next read comes from the device. Returns "" on success, else why not.
std::string drop_page_cache() {
    ::sync();
    const int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return "cannot open /proc/sys/vm/drop_caches: " +
               std::error_code(errno, std::generic_category()).message();
    const bool ok = ::write(fd, "3\n", 2) == 2;
    const int err = errno;
    ::close(fd);
    if (!ok)
        return "cannot write /proc/sys/vm/drop_caches: " +
               std::error_code(err, std::generic_category()).message();
    return "";
}

// Fraction of the files' pages resident in the page cache (mincore), so "warm" is a measured fact.
double cached_fraction(const std::vector<std::string>& files) {
    uint64_t pages = 0, resident = 0;
    const long page = ::sysconf(_SC_PAGESIZE);
    for (const std::string& f : files) {
        const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        struct stat st {};
        if (::fstat(fd, &st) == 0 && st.st_size > 0) {
            void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
            if (p != MAP_FAILED) {
                const size_t n = (static_cast<size_t>(st.st_size) + static_cast<size_t>(page) - 1) /
                                 static_cast<size_t>(page);
                std::vector<unsigned char> v(n);
                if (::mincore(p, static_cast<size_t>(st.st_size), v.data()) == 0) {
                    pages += n;
                    for (unsigned char c : v) resident += c & 1;
                }
                ::munmap(p, static_cast<size_t>(st.st_size));
            }
        }
        ::close(fd);
    }
    return pages ? static_cast<double>(resident) / static_cast<double>(pages) : 0.0;
}

// Anonymous host memory for the --device cpu destination, touched up front so page faults are not timed.
struct HostArena {
    uint8_t* p = nullptr;
    size_t bytes = 0;
    explicit HostArena(size_t n) : bytes(std::max<size_t>(n, 1)) {
        void* m =
            ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        if (m == MAP_FAILED) throw Error("bench load: cannot allocate a " + format_gb(bytes) + " host arena");
        p = static_cast<uint8_t*>(m);
    }
    ~HostArena() { ::munmap(p, bytes); }
};

}  // namespace

int cmd_bench_load(const Args& args) {
    ArgReader a("bench load", args);
    const std::string dir = a.value_or({"-m", "--model"}, "");
    const std::string device = resolve_device(a.value_or({"--device", "-dev"}, "cpu"));
    const int hw = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    StagedOptions opt;
    opt.threads = a.integer({"-t", "--threads"}, std::min(8, hw), 1, kMaxThreads);
    opt.chunk_bytes = static_cast<uint64_t>(a.integer({"--chunk-mib"}, 64, 1, 1 << 20)) << 20;
    opt.buffers = a.integer({"--buffers"}, 0, 0, 4096);
    opt.direct_io = a.flag({"--direct"});
    const int reps = a.integer({"-r", "--repetitions"}, 3, 1, kIntMax);
    const bool no_cold = a.flag({"--no-cold"});
    const std::string json_out = a.value_or({"--json-out"}, "");
    a.finish();
    if (dir.empty()) throw Error("bench load: -m DIR is required");
    if (opt.threads < 1 || reps < 1 || opt.chunk_bytes == 0)
        throw Error("bench load: -t, -r and --chunk-mib must be >= 1");
    if (device != "cpu" && device != "cuda") throw Error("bench load: --device must be cpu or cuda");
#ifndef MARKBASE_HAS_CUDA
    if (device == "cuda") throw Error("bench load --device cuda: this build has no CUDA backend");
#else
    if (device == "cuda" && !cuda_device_info().available)
        throw Error("bench load --device cuda: no usable CUDA device (" + cuda_device_info().why_not + ")");
#endif

    // Validation (headers, shapes, dtypes) happens once, here; the loads below only move bytes.
    const double tv = now_s();
    const std::unique_ptr<Checkpoint> ck = load_checkpoint(dir);
    const double validate_s = now_s() - tv;
    const LoadPlan plan = plan_checkpoint_load(*ck);
    uint64_t file_bytes = 0;
    for (const std::string& f : plan.files) file_bytes += std::filesystem::file_size(f);

    std::unique_ptr<HostArena> arena;
    if (device == "cpu") arena = std::make_unique<HostArena>(plan.arena_bytes);
    auto load_once = [&](const char* label) {
        ByteProgress progress(std::string("loaded (") + label + ")", plan.payload_bytes);
        StagedOptions o = opt;
        o.progress = [&](uint64_t done, uint64_t) { progress.update(done); };
        StagedStats st;
        if (device == "cpu") {
            HostStagingAllocator alloc;
            HostArenaSink sink(plan, arena->p);
            st = run_staged_load(plan, alloc, sink, o);
        } else {
#ifdef MARKBASE_HAS_CUDA
            st = cuda_staged_load_once(*ck, o);
#endif
        }
        progress.finish(plan.payload_bytes);
        return st;
    };
    auto raw_once = [&] { return measure_raw_read(plan.files, opt.threads, opt.chunk_bytes, opt.direct_io); };

    std::string cold_note;
    RawReadResult raw_cold, raw_cold2;  // the faster pass ends up in raw_cold
    StagedStats load_cold;
    bool cold = false;
    if (no_cold) {
        cold_note = "skipped (--no-cold)";
    } else if (std::string why = drop_page_cache(); !why.empty()) {
        cold_note = "not measured: " + why + " (needs root)";
    } else {
        // Raw before and after the load, each from a dropped cache: the better of the two is the ceiling
        // (a virtual disk's host-side cache can make either pass faster), so the ratio is not flattered.
        raw_cold = raw_once();
        drop_page_cache();
        load_cold = load_once("cold");
        drop_page_cache();
        raw_cold2 = raw_once();
        if (gbs(raw_cold2.bytes, raw_cold2.seconds) > gbs(raw_cold.bytes, raw_cold.seconds))
            std::swap(raw_cold, raw_cold2);
        cold = true;
    }
    // Warm: the first raw pass also pulls the files into the page cache (if they fit in RAM).
    const RawReadResult raw_warm = raw_once();
    const double resident = cached_fraction(plan.files);
    std::vector<double> warm_s;
    StagedStats last;
    for (int r = 0; r < reps; ++r) {
        last = load_once("warm");
        warm_s.push_back(last.seconds);
    }
    const double warm = median(warm_s);

    std::string dev_name = "host memory (" + std::to_string(hw) + " hw threads)";
#ifdef MARKBASE_HAS_CUDA
    if (device == "cuda") dev_name = cuda_device_info().name;
#endif
    std::printf("model     %s: %s of weights in %zu tensors, %zu files (%s); validated in %.3f s\n",
                dir.c_str(), format_gb(plan.payload_bytes).c_str(), plan.items.size(), plan.files.size(),
                format_gb(file_bytes).c_str(), validate_s);
    std::printf("pipeline  %s sink, %d reader threads, %d x %llu MiB staging buffers, %s, %zu chunks\n",
                device == "cpu" ? "host-arena" : "CUDA", last.threads, last.buffers,
                static_cast<unsigned long long>(last.chunk_bytes >> 20),
                last.direct_io ? "O_DIRECT" : "buffered pread", last.chunks);
    if (cold) {
        std::printf(
            "cold      raw read %.2f GB/s (%.2f s; other pass %.2f GB/s); load %.2f GB/s (%.2f s) = %.0f%% "
            "of raw\n",
            gbs(raw_cold.bytes, raw_cold.seconds), raw_cold.seconds, gbs(raw_cold2.bytes, raw_cold2.seconds),
            gbs(load_cold.payload_bytes, load_cold.seconds), load_cold.seconds,
            100.0 * gbs(load_cold.payload_bytes, load_cold.seconds) /
                std::max(1e-9, gbs(raw_cold.bytes, raw_cold.seconds)));
    } else {
        std::printf("cold      %s\n", cold_note.c_str());
    }
    std::printf(
        "warm      %.0f%% of the files in the page cache; raw read %.2f GB/s (%.2f s); load %.2f GB/s (%.3f "
        "s, "
        "median of %d) = %.0f%% of raw\n",
        100 * resident, gbs(raw_warm.bytes, raw_warm.seconds), raw_warm.seconds,
        gbs(plan.payload_bytes, warm), warm, reps,
        100.0 * gbs(plan.payload_bytes, warm) / std::max(1e-9, gbs(raw_warm.bytes, raw_warm.seconds)));
    double load_avg[1] = {0};
    ::getloadavg(load_avg, 1);  // other work on the machine makes every number here noisier
    std::printf("device    %s; load average %.2f during the run\n", dev_name.c_str(), load_avg[0]);

    if (!json_out.empty()) {
        std::time_t t = std::time(nullptr);
        char date[32];
        std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
        const char* commit = std::getenv("MARKBASE_COMMIT");
        nlohmann::json j = {
            {"kind", "bench-load"},
            {"model", dir},
            {"device", dev_name},
            {"sink", device == "cpu" ? "host-arena" : "cuda"},
            {"date", date},
            {"commit", commit ? commit : "unknown"},
            {"payload_bytes", plan.payload_bytes},
            {"file_bytes", file_bytes},
            {"tensors", plan.items.size()},
            {"files", plan.files.size()},
            {"validate_s", validate_s},
            {"threads", last.threads},
            {"buffers", last.buffers},
            {"chunk_bytes", last.chunk_bytes},
            {"direct_io", last.direct_io},
            {"cold_measured", cold},
            {"cold_note", cold_note},
            {"cold_raw_gb_s", cold ? gbs(raw_cold.bytes, raw_cold.seconds) : 0.0},
            {"cold_raw_s", raw_cold.seconds},
            {"cold_raw_other_pass_gb_s", cold ? gbs(raw_cold2.bytes, raw_cold2.seconds) : 0.0},
            {"cold_load_gb_s", cold ? gbs(load_cold.payload_bytes, load_cold.seconds) : 0.0},
            {"cold_load_s", load_cold.seconds},
            {"warm_resident_fraction", resident},
            {"warm_raw_gb_s", gbs(raw_warm.bytes, raw_warm.seconds)},
            {"warm_raw_s", raw_warm.seconds},
            {"warm_load_gb_s", gbs(plan.payload_bytes, warm)},
            {"warm_load_s_median", warm},
            {"warm_load_s_all", warm_s},
            {"load_average_1m", load_avg[0]}};
        std::ofstream f(json_out);
        f << j.dump(1) << "\n";
        if (!f) throw Error(json_out + ": cannot write");
    }
    return 0;
}

}  // namespace markbase::cli
