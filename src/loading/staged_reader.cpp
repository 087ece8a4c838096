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
    // The plan reads the files; the bf16 values of FP8 weights are made at load and are in none of them.
    if (ck.format != WeightFormat::kBf16 || !ck.owned.dequantized.empty())
        throw Error(ck.dir.string() +
                    ": FP8 weights (published, or --quantize fp8) cannot be uploaded yet: the staged upload "
                    "reads bf16 tensors from the checkpoint's files; use --device cpu");
    std::vector<std::string> names;
    for (const PlannedTensor& p : plan_tensors(ck.config, nullptr))
        names.push_back(ck.config.weight_prefix + p.name);
    return plan_load(ck.files, names, align);
}

namespace {

// One staged load in flight: reader threads fill ring slots with chunks, and the sink consumes them, on the
// readers when it is concurrent, else on the thread that called run(). The threads are declared last, so
// they are gone before the ring is freed and the files are closed.
class StagedRun {
  public:
    StagedRun(const LoadPlan& plan, const std::vector<PlannedChunk>& chunks, StagingAllocator& alloc,
              StagedSink& sink, const StagedOptions& opt, const StagedStats& st)
        : plan_(plan),
          chunks_(chunks),
          sink_(sink),
          opt_(opt),
          n_threads_(st.threads),
          payload_bytes_(st.payload_bytes),
          files_(plan.files, opt.direct_io),
          // A chunk reads [begin, align_up(end)): at most chunk_bytes plus one block (begin aligned down).
          ring_(alloc, st.chunk_bytes + kAlign, st.buffers),
          concurrent_(sink.concurrent()) {
        for (int s = 0; s < st.buffers; ++s) free_slots_.push_back(s);
    }

    bool direct_io() const { return files_.all_direct; }

    // Reads every chunk into the sink, then finishes it; on any error (or cancellation) stops the readers,
    // aborts the sink and rethrows. Returns the bytes read.
    uint64_t run() {
        try {
            for (int t = 0; t < n_threads_; ++t) threads_.emplace_back([this] { reader(); });
            wait_done();
            join_all();
            sink_.finish();
        } catch (...) {
            join_all();
            sink_.abort();  // before `ring_` frees the buffers an async copy may still read
            throw;
        }
        return read_bytes_;
    }

  private:
    void fail(std::exception_ptr e) {
        std::lock_guard<std::mutex> lk(mu_);
        if (!error_) error_ = e;
        stop_ = true;
        cv_.notify_all();
    }

    bool cancelled() const { return opt_.cancel && opt_.cancel->load(std::memory_order_relaxed); }

    StagedChunk chunk_view(int slot, size_t ci) const {
        const PlannedChunk& pc = chunks_[ci];
        StagedChunk c;
        c.slot = slot;
        c.data = static_cast<const uint8_t*>(ring_.bufs[static_cast<size_t>(slot)]);
        c.file = pc.file;
        c.file_offset = pc.begin;
        c.payload = pc.payload;
        c.pieces = pc.pieces;
        return c;
    }

    // Takes the next chunk and a free slot for it; false when stopped or every chunk is taken.
    bool claim(int& slot, size_t& ci) {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] {
            return stop_ || (!free_slots_.empty() && next_ < chunks_.size()) || next_ >= chunks_.size();
        });
        if (stop_ || next_ >= chunks_.size()) return false;
        ci = next_++;
        slot = free_slots_.front();
        free_slots_.pop_front();
        return true;
    }

    // Reads chunk ci into the slot, and hands it to a concurrent sink.
    void read_chunk(int slot, size_t ci) {
        sink_.wait_reusable(slot);
        if (cancelled()) throw Error("loading cancelled");
        const PlannedChunk& pc = chunks_[ci];
        const uint64_t want = align_up(pc.end, kAlign) - pc.begin;
        read_range(files_.fds[pc.file], plan_.files[pc.file],
                   static_cast<uint8_t*>(ring_.bufs[static_cast<size_t>(slot)]), pc.begin, pc.end - pc.begin,
                   want);
        if (concurrent_) sink_.consume(chunk_view(slot, ci));
    }

    void reader() {
        int slot = -1;
        size_t ci = 0;
        while (claim(slot, ci)) {
            try {
                read_chunk(slot, ci);
            } catch (...) {
                fail(std::current_exception());
                return;
            }
            std::lock_guard<std::mutex> lk(mu_);
            read_bytes_ += chunks_[ci].end - chunks_[ci].begin;
            if (concurrent_) {
                free_slots_.push_back(slot);
                ++done_;
                done_payload_ += chunks_[ci].payload;
            } else {
                filled_.emplace_back(slot, ci);
            }
            cv_.notify_all();
        }
    }

    // A non-concurrent sink's turn: consumes the filled slots (lock released meanwhile) and frees them.
    void consume_filled(std::unique_lock<std::mutex>& lk) {
        while (!concurrent_ && !filled_.empty()) {
            const auto [slot, ci] = filled_.front();
            filled_.pop_front();
            lk.unlock();
            sink_.consume(chunk_view(slot, ci));  // the sink fences the slot before it is refilled
            lk.lock();
            free_slots_.push_back(slot);
            ++done_;
            done_payload_ += chunks_[ci].payload;
            cv_.notify_all();
        }
    }

    // Waits for every chunk to be consumed, reporting progress and rethrowing a reader's error.
    void wait_done() {
        uint64_t reported = ~uint64_t{0};
        for (;;) {
            std::unique_lock<std::mutex> lk(mu_);
            cv_.wait_for(lk, std::chrono::milliseconds(100),
                         [&] { return stop_ || !filled_.empty() || done_ == chunks_.size(); });
            if (error_) std::rethrow_exception(error_);
            if (cancelled()) throw Error("loading cancelled");
            consume_filled(lk);
            const bool all = done_ == chunks_.size();
            const uint64_t dp = done_payload_;
            lk.unlock();
            if (opt_.progress && dp != reported) {
                opt_.progress(dp, payload_bytes_);
                reported = dp;
            }
            if (all) break;
        }
    }

    void join_all() {
        {
            std::lock_guard<std::mutex> lk(mu_);
            if (done_ < chunks_.size()) stop_ = true;
        }
        cv_.notify_all();
        for (std::thread& t : threads_)
            if (t.joinable()) t.join();
    }

    const LoadPlan& plan_;
    const std::vector<PlannedChunk>& chunks_;
    StagedSink& sink_;
    const StagedOptions& opt_;
    const int n_threads_;
    const uint64_t payload_bytes_;
    Files files_;
    Ring ring_;
    const bool concurrent_;

    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<int> free_slots_;
    std::deque<std::pair<int, size_t>> filled_;  // (slot, chunk) waiting for a non-concurrent sink
    size_t next_ = 0, done_ = 0;
    uint64_t done_payload_ = 0, read_bytes_ = 0;
    bool stop_ = false;
    std::exception_ptr error_;
    std::vector<std::thread> threads_;
};

}  // namespace

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
    StagedRun run(plan, chunks, alloc, sink, opt, st);
    st.direct_io = opt.direct_io && run.direct_io();
    st.read_bytes = run.run();
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
