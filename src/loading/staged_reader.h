// The staging pipeline that moves checkpoint bytes to wherever a backend wants them (issue 5).
// Several reader threads pread large aligned chunks of the shards (the union of the wanted tensors' byte
// ranges, coalesced) into a small ring of staging buffers; each filled buffer goes to a sink with the map of
// which bytes belong to which tensor, and comes back to the ring when the sink is done with it. The GPU is
// just one sink (cuda/staged_load.cu: pinned buffers, async copies on their own stream); the host-arena
// sink here serves tests and `markbase bench load --device cpu`. The CPU backend does not use this: it reads
// the mapped files in place.
//
// Validation stays single-pass: the headers were checked when the SafetensorsSet was opened, and here every
// byte of every wanted range must actually arrive (a shard truncated since it was opened is an Error naming
// the file and offset, never a SIGBUS as it would be through the mapping).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "loading/safetensors.h"

namespace markbase {

struct Checkpoint;

// One byte range to load (a tensor): where it is in which file, and where it goes in the destination.
struct LoadItem {
    std::string name;
    uint32_t file = 0;    // index into LoadPlan::files
    uint64_t offset = 0;  // byte offset in the file
    uint64_t bytes = 0;
    uint64_t dst = 0;  // offset in a single destination arena (each item `align`-aligned)
};

struct LoadPlan {
    std::vector<std::string> files;
    std::vector<LoadItem> items;  // destination order
    uint64_t arena_bytes = 0;     // one allocation holding every item, padding included
    uint64_t payload_bytes = 0;   // sum of the items' bytes
};

// The named tensors of `set`, laid out in the given order in one arena, each at an `align`-aligned offset
// (256: any GPU vector load or cuBLAS operand is aligned).
LoadPlan plan_load(const SafetensorsSet& set, const std::vector<std::string>& names, uint64_t align = 256);
// Every tensor the checkpoint bound, in plan_tensors order (the order the CUDA backend allocates them).
LoadPlan plan_checkpoint_load(const Checkpoint& ck, uint64_t align = 256);

// Where the bytes of one item sit in a staging buffer.
struct StagedPiece {
    uint32_t item = 0;
    uint64_t item_offset = 0;  // offset inside the item
    uint64_t buf_offset = 0;   // offset inside the buffer
    uint64_t bytes = 0;
};

// One filled staging buffer.
struct StagedChunk {
    int slot = 0;  // which ring buffer (a sink with async copies fences per slot)
    const uint8_t* data = nullptr;
    uint32_t file = 0;
    uint64_t file_offset = 0;  // file offset of data[0]
    uint64_t payload = 0;      // sum of the pieces' bytes
    std::vector<StagedPiece> pieces;
};

// Staging memory: plain aligned host memory on the CPU path, page-locked memory on the CUDA path (so the
// DMA engine reads it directly). Buffers are 4096-aligned so O_DIRECT can read into them.
class StagingAllocator {
  public:
    virtual ~StagingAllocator() = default;
    virtual void* allocate(size_t bytes) = 0;  // throws markbase::Error when it cannot
    virtual void deallocate(void* p, size_t bytes) noexcept = 0;
};
class HostStagingAllocator : public StagingAllocator {
  public:
    void* allocate(size_t bytes) override;
    void deallocate(void* p, size_t bytes) noexcept override;
};

class StagedSink {
  public:
    virtual ~StagedSink() = default;
    // true: consume() may run on the reader threads concurrently (pieces never overlap in the destination),
    // which saves a hand-off for sinks that copy synchronously. false: one thread (the caller's) consumes.
    virtual bool concurrent() const { return false; }
    // Takes the chunk's bytes. The buffer stays untouched until wait_reusable(chunk.slot) has returned.
    virtual void consume(const StagedChunk& chunk) = 0;
    // Called on a reader thread before it refills `slot`: block until the sink no longer reads that buffer
    // (its async copy finished). Thread-safe.
    virtual void wait_reusable(int slot) {}
    // After the last chunk: wait until everything is in its destination. May throw.
    virtual void finish() {}
    // On any error, before the staging buffers are freed: stop reading them. Must not throw.
    virtual void abort() noexcept {}
};

// Copies into a host arena laid out as the plan says (tests, the host-only bench).
class HostArenaSink : public StagedSink {
  public:
    HostArenaSink(const LoadPlan& plan, uint8_t* arena) : plan_(plan), arena_(arena) {}
    bool concurrent() const override { return true; }
    void consume(const StagedChunk& chunk) override;

  private:
    const LoadPlan& plan_;
    uint8_t* arena_;
};

// Reads and drops (raw pipeline throughput; `bench load` uses it to separate reading from copying).
class DiscardSink : public StagedSink {
  public:
    bool concurrent() const override { return true; }
    void consume(const StagedChunk&) override {}
};

struct StagedOptions {
    int threads = 4;                            // reader threads
    int buffers = 0;                            // ring size; 0: threads + 2 (one per reader, two in the sink)
    uint64_t chunk_bytes = uint64_t{64} << 20;  // rounded up to 4096
    bool direct_io = false;                     // O_DIRECT (falls back to buffered where the fs refuses it)
    uint64_t coalesce_gap = uint64_t{1} << 20;  // read through holes up to this size rather than split
    const std::atomic<bool>* cancel = nullptr;  // set from anywhere: the load stops with an Error
    // Called on the caller's thread as chunks complete (and at least every 100 ms).
    std::function<void(uint64_t done_payload, uint64_t total_payload)> progress;
};

struct StagedStats {
    uint64_t payload_bytes = 0;  // bytes delivered into items
    uint64_t read_bytes = 0;     // bytes read from files (payload + holes + alignment)
    double seconds = 0;
    size_t chunks = 0;
    int threads = 0, buffers = 0;
    uint64_t chunk_bytes = 0;
    bool direct_io = false;  // whether O_DIRECT was actually used for every file
};

// Runs the pipeline to completion. On any error (read error, short read, sink exception, cancellation) every
// thread is stopped and joined, the sink aborted, every staging buffer freed, and the first error rethrown
// (a markbase::Error naming the file and offset for I/O problems). Whatever the sink was filling is then
// the caller's to discard: nothing here hands out a half-loaded result.
StagedStats run_staged_load(const LoadPlan& plan, StagingAllocator& alloc, StagedSink& sink,
                            const StagedOptions& opt);

// The file system's own speed: `threads` threads pread the whole files in `chunk_bytes` pieces into
// throwaway buffers. Returns bytes read and seconds.
struct RawReadResult {
    uint64_t bytes = 0;
    double seconds = 0;
    bool direct_io = false;
};
RawReadResult measure_raw_read(const std::vector<std::string>& files, int threads, uint64_t chunk_bytes,
                               bool direct_io);

}  // namespace markbase
