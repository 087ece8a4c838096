// The staging pipeline: plan (coalesce, chunk), reader threads, the ring, the sink hand-off, and teardown on
// every error path. See staged_reader.h for the contract.
#include "loading/staged_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>

#include "loading/checkpoint.h"
#include "model/error.h"
#include "model/tensor_plan.h"
#include "runtime/timing.h"

namespace markbase {

namespace {

// Block size for O_DIRECT (offsets, lengths and buffers aligned to it); harmless for buffered reads.
constexpr uint64_t kAlign = 4096;

uint64_t align_up(uint64_t x, uint64_t a) {
    return (x + a - 1) / a * a;
}
uint64_t align_down(uint64_t x, uint64_t a) {
    return x / a * a;
}

std::string errno_text(int err) {
    return std::error_code(err, std::generic_category()).message();
}

// Open file descriptors, closed on scope exit (any path).
struct Files {
    std::vector<int> fds;
    bool all_direct = true;
    Files(const std::vector<std::string>& paths, bool direct) {
        for (const std::string& p : paths) {
            int fd = -1;
            if (direct) fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
            if (fd < 0) {
                // tmpfs and some network file systems refuse O_DIRECT with EINVAL: read buffered instead.
                all_direct = false;
                fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
            }
            if (fd < 0) {
                const int err = errno;
                close_all();
                throw Error("cannot open " + p + ": " + errno_text(err));
            }
            fds.push_back(fd);
        }
    }
    ~Files() { close_all(); }
    void close_all() {
        for (int fd : fds) ::close(fd);
        fds.clear();
    }
};

// Reads file bytes [begin, begin + need) into buf (reading up to `want` >= need, the aligned length).
// A short read before `need` means the file ended early.
void read_range(int fd, const std::string& path, uint8_t* buf, uint64_t begin, uint64_t need, uint64_t want) {
    auto ends_early = [&](uint64_t got) {
        struct stat st {};
        const long long size = ::fstat(fd, &st) == 0 ? static_cast<long long>(st.st_size) : -1;
        return Error(path + ": file ends early: needed bytes up to offset " + std::to_string(begin + need) +
                     " but the read stopped at offset " + std::to_string(begin + got) + " (the file is now " +
                     std::to_string(size) + " bytes: truncated or replaced since it was opened?)");
    };
    uint64_t got = 0;
    while (got < need) {
        const uint64_t ask = want - got;
        const ssize_t r = ::pread(fd, buf + got, static_cast<size_t>(ask), static_cast<off_t>(begin + got));
        if (r < 0) {
            if (errno == EINTR) continue;
            const int err = errno;
            throw Error(path + ": read error at offset " + std::to_string(begin + got) + ": " +
                        errno_text(err));
        }
        if (r == 0) throw ends_early(got);
        got += static_cast<uint64_t>(r);
        // A short read is normally the end of the file; when it came before the bytes we need, the file is
        // shorter than its header said. (Checking the size here also keeps an unaligned O_DIRECT retry from
        // turning a truncation into a confusing EINVAL.)
        if (got < need && static_cast<uint64_t>(r) < ask) {
            struct stat st {};
            if (::fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_size) < begin + need)
                throw ends_early(got);
        }
    }
}

// A chunk as planned: which file range to read and which item bytes it carries.
struct PlannedChunk {
    uint32_t file = 0;
    uint64_t begin = 0, end = 0;  // begin aligned; end = last needed byte + 1
    uint64_t payload = 0;
    std::vector<StagedPiece> pieces;
};

std::vector<PlannedChunk> make_chunks(const LoadPlan& plan, uint64_t chunk, uint64_t gap) {
    std::vector<uint32_t> order;
    for (uint32_t i = 0; i < plan.items.size(); ++i)
        if (plan.items[i].bytes) order.push_back(i);
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
        const LoadItem &x = plan.items[a], &y = plan.items[b];
        return x.file != y.file ? x.file < y.file : x.offset < y.offset;
    });
    // Coalesce into extents (runs of items at most `gap` apart), then cut each extent into aligned chunks.
    std::vector<PlannedChunk> out;
    size_t i = 0;
    while (i < order.size()) {
        const uint32_t file = plan.items[order[i]].file;
        size_t j = i;
        uint64_t ext_end = plan.items[order[i]].offset + plan.items[order[i]].bytes;
        while (j + 1 < order.size() && plan.items[order[j + 1]].file == file &&
               plan.items[order[j + 1]].offset <= ext_end + gap) {
            ++j;
            ext_end = std::max(ext_end, plan.items[order[j]].offset + plan.items[order[j]].bytes);
        }
        uint64_t cs = align_down(plan.items[order[i]].offset, kAlign);
        size_t k = i;  // first item that may still overlap the current chunk
        while (cs < ext_end) {
            PlannedChunk c;
            c.file = file;
            c.begin = cs;
            c.end = std::min(cs + chunk, ext_end);
            for (size_t m = k; m <= j; ++m) {
                const LoadItem& it = plan.items[order[m]];
                const uint64_t lo = std::max(c.begin, it.offset), hi = std::min(c.end, it.offset + it.bytes);
                if (it.offset >= c.end) break;
                if (hi <= lo) continue;
                c.pieces.push_back({order[m], lo - it.offset, lo - c.begin, hi - lo});
                c.payload += hi - lo;
            }
            while (k <= j && plan.items[order[k]].offset + plan.items[order[k]].bytes <= c.end) ++k;
            if (!c.pieces.empty()) out.push_back(std::move(c));
            cs = c.end;
        }
        i = j + 1;
    }
    return out;
}

// The ring's memory, freed on scope exit; declared before the threads so they are joined first.
struct Ring {
    StagingAllocator& alloc;
    size_t bytes;
    std::vector<void*> bufs;
    Ring(StagingAllocator& a, size_t b, int n) : alloc(a), bytes(b) {
        for (int i = 0; i < n; ++i) bufs.push_back(alloc.allocate(bytes));
    }
    ~Ring() {
        for (void* p : bufs) alloc.deallocate(p, bytes);
    }
};

}  // namespace

void* HostStagingAllocator::allocate(size_t bytes) {
    void* p = std::aligned_alloc(kAlign, align_up(bytes, kAlign));
    if (!p) throw Error("cannot allocate a " + std::to_string(bytes >> 20) + " MiB staging buffer");
    return p;
}
void HostStagingAllocator::deallocate(void* p, size_t) noexcept {
    std::free(p);
}

void HostArenaSink::consume(const StagedChunk& c) {
    for (const StagedPiece& p : c.pieces)
        std::memcpy(arena_ + plan_.items[p.item].dst + p.item_offset, c.data + p.buf_offset, p.bytes);
}

LoadPlan plan_load(const SafetensorsSet& set, const std::vector<std::string>& names, uint64_t align) {
    LoadPlan plan;
    std::map<std::string, uint32_t> file_index;
    for (const std::string& f : set.files()) {
        file_index.emplace(f, static_cast<uint32_t>(plan.files.size()));
        plan.files.push_back(f);
    }
    for (const std::string& n : names) {
        const TensorInfo& t = set.get(n);
        LoadItem it;
        it.name = n;
        it.file = file_index.at(t.file);
        it.offset = t.file_offset;
        it.bytes = t.nbytes;
        it.dst = align_up(plan.arena_bytes, align);
        plan.arena_bytes = it.dst + it.bytes;
        plan.payload_bytes += it.bytes;
        plan.items.push_back(std::move(it));
    }
    return plan;
}

LoadPlan plan_checkpoint_load(const Checkpoint& ck, uint64_t align) {
    std::vector<std::string> names;
    for (const PlannedTensor& p : plan_tensors(ck.config, nullptr))
        names.push_back(ck.config.weight_prefix + p.name);
    return plan_load(ck.files, names, align);
}

StagedStats run_staged_load(const LoadPlan& plan, StagingAllocator& alloc, StagedSink& sink,
                            const StagedOptions& opt) {
    const double t0 = now_s();
    StagedStats st;
    st.chunk_bytes = align_up(std::max<uint64_t>(opt.chunk_bytes, kAlign), kAlign);
    const std::vector<PlannedChunk> chunks = make_chunks(plan, st.chunk_bytes, opt.coalesce_gap);
    st.chunks = chunks.size();
    st.threads =
        std::max(1, std::min<int>(opt.threads, static_cast<int>(std::max<size_t>(chunks.size(), 1))));
    st.buffers = opt.buffers > 0 ? std::max(opt.buffers, 1) : st.threads + 2;
    for (const PlannedChunk& c : chunks) st.payload_bytes += c.payload;
    if (chunks.empty()) {
        sink.finish();
        st.seconds = now_s() - t0;
        return st;
    }

    Files files(plan.files, opt.direct_io);
    st.direct_io = opt.direct_io && files.all_direct;
    // A chunk reads [begin, align_up(end)), at most chunk_bytes + one block when begin was aligned down.
    Ring ring(alloc, st.chunk_bytes + kAlign, st.buffers);

    std::mutex mu;
    std::condition_variable cv;
    std::deque<int> free_slots;
    for (int s = 0; s < st.buffers; ++s) free_slots.push_back(s);
    std::deque<std::pair<int, size_t>> filled;  // (slot, chunk) waiting for a non-concurrent sink
    size_t next = 0, done = 0;
    uint64_t done_payload = 0, read_bytes = 0;
    bool stop = false;
    std::exception_ptr error;
    const bool concurrent = sink.concurrent();

    auto fail = [&](std::exception_ptr e) {
        std::lock_guard<std::mutex> lk(mu);
        if (!error) error = e;
        stop = true;
        cv.notify_all();
    };
    auto cancelled = [&] { return opt.cancel && opt.cancel->load(std::memory_order_relaxed); };
    auto chunk_view = [&](int slot, size_t ci) {
        const PlannedChunk& pc = chunks[ci];
        StagedChunk c;
        c.slot = slot;
        c.data = static_cast<const uint8_t*>(ring.bufs[static_cast<size_t>(slot)]);
        c.file = pc.file;
        c.file_offset = pc.begin;
        c.payload = pc.payload;
        c.pieces = pc.pieces;
        return c;
    };

    auto reader = [&] {
        for (;;) {
            int slot = -1;
            size_t ci = 0;
            {
                std::unique_lock<std::mutex> lk(mu);
                cv.wait(lk, [&] {
                    return stop || (!free_slots.empty() && next < chunks.size()) || next >= chunks.size();
                });
                if (stop || next >= chunks.size()) return;
                ci = next++;
                slot = free_slots.front();
                free_slots.pop_front();
            }
            try {
                sink.wait_reusable(slot);
                if (cancelled()) throw Error("loading cancelled");
                const PlannedChunk& pc = chunks[ci];
                const uint64_t want = align_up(pc.end, kAlign) - pc.begin;
                read_range(files.fds[pc.file], plan.files[pc.file],
                           static_cast<uint8_t*>(ring.bufs[static_cast<size_t>(slot)]), pc.begin,
                           pc.end - pc.begin, want);
                if (concurrent) sink.consume(chunk_view(slot, ci));
            } catch (...) {
                fail(std::current_exception());
                return;
            }
            std::lock_guard<std::mutex> lk(mu);
            read_bytes += chunks[ci].end - chunks[ci].begin;
            if (concurrent) {
                free_slots.push_back(slot);
                ++done;
                done_payload += chunks[ci].payload;
            } else {
                filled.emplace_back(slot, ci);
            }
            cv.notify_all();
        }
    };

    std::vector<std::thread> threads;
    auto join_all = [&] {
        {
            std::lock_guard<std::mutex> lk(mu);
            if (done < chunks.size()) stop = true;
        }
        cv.notify_all();
        for (std::thread& t : threads)
            if (t.joinable()) t.join();
    };
    try {
        for (int t = 0; t < st.threads; ++t) threads.emplace_back(reader);
        uint64_t reported = ~uint64_t{0};
        for (;;) {
            std::unique_lock<std::mutex> lk(mu);
            cv.wait_for(lk, std::chrono::milliseconds(100),
                        [&] { return stop || !filled.empty() || done == chunks.size(); });
            if (error) std::rethrow_exception(error);
            if (cancelled()) throw Error("loading cancelled");
            while (!concurrent && !filled.empty()) {
                const auto [slot, ci] = filled.front();
                filled.pop_front();
                lk.unlock();
                sink.consume(chunk_view(slot, ci));  // the sink fences the slot before it is refilled
                lk.lock();
                free_slots.push_back(slot);
                ++done;
                done_payload += chunks[ci].payload;
                cv.notify_all();
            }
            const bool all = done == chunks.size();
            const uint64_t dp = done_payload;
            lk.unlock();
            if (opt.progress && dp != reported) {
                opt.progress(dp, st.payload_bytes);
                reported = dp;
            }
            if (all) break;
        }
        join_all();
        sink.finish();
    } catch (...) {
        join_all();
        sink.abort();  // before `ring` frees the buffers an async copy may still read
        throw;
    }
    st.read_bytes = read_bytes;
    st.seconds = now_s() - t0;
    return st;
}

RawReadResult measure_raw_read(const std::vector<std::string>& paths, int threads, uint64_t chunk_bytes,
                               bool direct_io) {
    // The same machinery over whole files: one item per file, dropped on arrival.
    LoadPlan plan;
    for (uint32_t i = 0; i < paths.size(); ++i) {
        struct stat s {};
        if (::stat(paths[i].c_str(), &s) != 0)
            throw Error("cannot stat " + paths[i] + ": " + errno_text(errno));
        plan.files.push_back(paths[i]);
        plan.items.push_back({paths[i], i, 0, static_cast<uint64_t>(s.st_size), plan.payload_bytes});
        plan.payload_bytes += static_cast<uint64_t>(s.st_size);
    }
    plan.arena_bytes = plan.payload_bytes;
    HostStagingAllocator alloc;
    DiscardSink sink;
    StagedOptions o;
    o.threads = threads;
    o.chunk_bytes = chunk_bytes;
    o.direct_io = direct_io;
    const StagedStats st = run_staged_load(plan, alloc, sink, o);
    return {st.read_bytes, st.seconds, st.direct_io};
}

}  // namespace markbase
