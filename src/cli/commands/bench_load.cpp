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

// What the command line asks for.
struct LoadArgs {
    std::string dir, device, json_out;
    StagedOptions opt;
    int reps = 3;
    bool no_cold = false;
    int hw = 1;  // hardware threads
};

LoadArgs parse_load_args(const Args& args) {
    ArgReader a("bench load", args);
    LoadArgs l;
    l.dir = a.value_or({"-m", "--model"}, "");
    l.device = resolve_device(a.value_or({"--device", "-dev"}, "cpu"));
    l.hw = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    l.opt.threads = a.integer({"-t", "--threads"}, std::min(8, l.hw), 1, kMaxThreads);
    l.opt.chunk_bytes = static_cast<uint64_t>(a.integer({"--chunk-mib"}, 64, 1, 1 << 20)) << 20;
    l.opt.buffers = a.integer({"--buffers"}, 0, 0, 4096);
    l.opt.direct_io = a.flag({"--direct"});
    l.reps = a.integer({"-r", "--repetitions"}, 3, 1, kIntMax);
    l.no_cold = a.flag({"--no-cold"});
    l.json_out = a.value_or({"--json-out"}, "");
    a.finish();
    if (l.dir.empty()) throw Error("bench load: -m DIR is required");
    if (l.opt.threads < 1 || l.reps < 1 || l.opt.chunk_bytes == 0)
        throw Error("bench load: -t, -r and --chunk-mib must be >= 1");
    if (l.device != "cpu" && l.device != "cuda") throw Error("bench load: --device must be cpu or cuda");
#ifndef MARKBASE_HAS_CUDA
    if (l.device == "cuda") throw Error("bench load --device cuda: this build has no CUDA backend");
#else
    if (l.device == "cuda" && !cuda_device_info().available)
        throw Error("bench load --device cuda: no usable CUDA device (" + cuda_device_info().why_not + ")");
#endif
    return l;
}

// What one run of the command measured.
struct LoadRuns {
    double validate_s = 0;
    uint64_t file_bytes = 0;
    std::string cold_note, dev_name;
    RawReadResult raw_cold, raw_cold2;  // the faster cold pass ends up in raw_cold
    StagedStats load_cold, last;
    bool cold = false;
    RawReadResult raw_warm;
    double resident = 0;  // fraction of the files in the page cache before the warm loads
    std::vector<double> warm_s;
    double warm = 0;  // median of warm_s
};

// The cold pass: raw before and after the load, each from a dropped cache; the better of the two is the
// ceiling (a virtual disk's host-side cache can make either pass faster), so the ratio is not flattered.
template <class Load, class Raw>
void measure_cold(const LoadArgs& l, Load&& load_once, Raw&& raw_once, LoadRuns* r) {
    if (l.no_cold) {
        r->cold_note = "skipped (--no-cold)";
        return;
    }
    if (std::string why = drop_page_cache(); !why.empty()) {
        r->cold_note = "not measured: " + why + " (needs root)";
        return;
    }
    r->raw_cold = raw_once();
    drop_page_cache();
    r->load_cold = load_once("cold");
    drop_page_cache();
    r->raw_cold2 = raw_once();
    if (gbs(r->raw_cold2.bytes, r->raw_cold2.seconds) > gbs(r->raw_cold.bytes, r->raw_cold.seconds))
        std::swap(r->raw_cold, r->raw_cold2);
    r->cold = true;
}

void print_load(const LoadArgs& l, const LoadPlan& plan, const LoadRuns& r, double load_avg) {
    std::printf("model     %s: %s of weights in %zu tensors, %zu files (%s); validated in %.3f s\n",
                l.dir.c_str(), format_gb(plan.payload_bytes).c_str(), plan.items.size(), plan.files.size(),
                format_gb(r.file_bytes).c_str(), r.validate_s);
    std::printf("pipeline  %s sink, %d reader threads, %d x %llu MiB staging buffers, %s, %zu chunks\n",
                l.device == "cpu" ? "host-arena" : "CUDA", r.last.threads, r.last.buffers,
                static_cast<unsigned long long>(r.last.chunk_bytes >> 20),
                r.last.direct_io ? "O_DIRECT" : "buffered pread", r.last.chunks);
    if (r.cold) {
        const double raw = gbs(r.raw_cold.bytes, r.raw_cold.seconds);
        const double load = gbs(r.load_cold.payload_bytes, r.load_cold.seconds);
        std::printf(
            "cold      raw read %.2f GB/s (%.2f s; other pass %.2f GB/s); load %.2f GB/s (%.2f s) = %.0f%% "
            "of raw\n",
            raw, r.raw_cold.seconds, gbs(r.raw_cold2.bytes, r.raw_cold2.seconds), load, r.load_cold.seconds,
            100.0 * load / std::max(1e-9, raw));
    } else {
        std::printf("cold      %s\n", r.cold_note.c_str());
    }
    const double raw = gbs(r.raw_warm.bytes, r.raw_warm.seconds), load = gbs(plan.payload_bytes, r.warm);
    std::printf(
        "warm      %.0f%% of the files in the page cache; raw read %.2f GB/s (%.2f s); load %.2f GB/s (%.3f "
        "s, median of %d) = %.0f%% of raw\n",
        100 * r.resident, raw, r.raw_warm.seconds, load, r.warm, l.reps, 100.0 * load / std::max(1e-9, raw));
    std::printf("device    %s; load average %.2f during the run\n", r.dev_name.c_str(), load_avg);
}

void write_load_receipt(const LoadArgs& l, const LoadPlan& plan, const LoadRuns& r, double load_avg) {
    std::time_t t = std::time(nullptr);
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
    const char* commit = std::getenv("MARKBASE_COMMIT");
    const bool c = r.cold;
    nlohmann::json j = {{"kind", "bench-load"},
                        {"model", l.dir},
                        {"device", r.dev_name},
                        {"sink", l.device == "cpu" ? "host-arena" : "cuda"},
                        {"date", date},
                        {"commit", commit ? commit : "unknown"},
                        {"payload_bytes", plan.payload_bytes},
                        {"file_bytes", r.file_bytes},
                        {"tensors", plan.items.size()},
                        {"files", plan.files.size()},
                        {"validate_s", r.validate_s},
                        {"threads", r.last.threads},
                        {"buffers", r.last.buffers},
                        {"chunk_bytes", r.last.chunk_bytes},
                        {"direct_io", r.last.direct_io},
                        {"cold_measured", c},
                        {"cold_note", r.cold_note},
                        {"cold_raw_gb_s", c ? gbs(r.raw_cold.bytes, r.raw_cold.seconds) : 0.0},
                        {"cold_raw_s", r.raw_cold.seconds},
                        {"cold_raw_other_pass_gb_s", c ? gbs(r.raw_cold2.bytes, r.raw_cold2.seconds) : 0.0},
                        {"cold_load_gb_s", c ? gbs(r.load_cold.payload_bytes, r.load_cold.seconds) : 0.0},
                        {"cold_load_s", r.load_cold.seconds},
                        {"warm_resident_fraction", r.resident},
                        {"warm_raw_gb_s", gbs(r.raw_warm.bytes, r.raw_warm.seconds)},
                        {"warm_raw_s", r.raw_warm.seconds},
                        {"warm_load_gb_s", gbs(plan.payload_bytes, r.warm)},
                        {"warm_load_s_median", r.warm},
                        {"warm_load_s_all", r.warm_s},
                        {"load_average_1m", load_avg}};
    std::ofstream f(l.json_out);
    f << j.dump(1) << "\n";
    if (!f) throw Error(l.json_out + ": cannot write");
}

}  // namespace

int cmd_bench_load(const Args& args) {
    const LoadArgs l = parse_load_args(args);
    LoadRuns r;
    // Validation (headers, shapes, dtypes) happens once, here; the loads below only move bytes.
    const double tv = now_s();
    const std::unique_ptr<Checkpoint> ck = load_checkpoint(l.dir);
    r.validate_s = now_s() - tv;
    const LoadPlan plan = plan_checkpoint_load(*ck);
    for (const std::string& f : plan.files) r.file_bytes += std::filesystem::file_size(f);

    std::unique_ptr<HostArena> arena;
    if (l.device == "cpu") arena = std::make_unique<HostArena>(plan.arena_bytes);
    auto load_once = [&](const char* label) {
        ByteProgress progress(std::string("loaded (") + label + ")", plan.payload_bytes);
        StagedOptions o = l.opt;
        o.progress = [&](uint64_t done, uint64_t) { progress.update(done); };
        StagedStats st;
        if (l.device == "cpu") {
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
    auto raw_once = [&] {
        return measure_raw_read(plan.files, l.opt.threads, l.opt.chunk_bytes, l.opt.direct_io);
    };
    measure_cold(l, load_once, raw_once, &r);
    // Warm: the first raw pass also pulls the files into the page cache (if they fit in RAM).
    r.raw_warm = raw_once();
    r.resident = cached_fraction(plan.files);
    for (int i = 0; i < l.reps; ++i) {
        r.last = load_once("warm");
        r.warm_s.push_back(r.last.seconds);
    }
    r.warm = median(r.warm_s);

    r.dev_name = "host memory (" + std::to_string(l.hw) + " hw threads)";
#ifdef MARKBASE_HAS_CUDA
    if (l.device == "cuda") r.dev_name = cuda_device_info().name;
#endif
    double load_avg[1] = {0};
    ::getloadavg(load_avg, 1);  // other work on the machine makes every number here noisier
    print_load(l, plan, r, load_avg[0]);
    if (!l.json_out.empty()) write_load_receipt(l, plan, r, load_avg[0]);
    return 0;
}

}  // namespace markbase::cli
