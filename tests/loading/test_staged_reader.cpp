// The staging pipeline (loading/staged_reader.h): byte-exact against the mapped view for small and odd-sized
// tensors (1 byte, sizes off the chunk and block sizes, tensors spanning chunks and shards), one thread and
// many, both sink modes; a shard truncated after it was validated; a sink that fails midway and a cancelled
// load (every thread joined, every staging buffer freed, the error propagated, nothing half-built). Run the
// suite under AddressSanitizer (build-asan, -DMARKBASE_SANITIZE=ON) to check the teardown paths.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "loading/checkpoint.h"
#include "loading/random_checkpoint.h"
#include "loading/staged_reader.h"
#include "model/error.h"
#include "runtime/progress.h"
#include "support/tiny_models.h"

namespace fs = std::filesystem;
using namespace markbase;

namespace {

// Two shards of U8 tensors (any byte count is a valid size) with sizes chosen to land on and off every
// boundary the pipeline has: 1 byte, the 4096-byte block, the 8192-byte test chunk, and empty tensors.
struct ShardedFixture {
    markbase::testing::TempDir dir{"staged"};
    std::vector<std::string> names;
    std::vector<std::vector<uint8_t>> data;

    ShardedFixture() {
        const std::vector<std::vector<uint64_t>> sizes = {
            {1, 3, 4095, 4096, 4097, 8191, 0, 8193, 20000, 1},
            {65537, 2, 12288, 1, 7, 30001},
        };
        std::mt19937 rng(7);
        nlohmann::json index = {{"metadata", nlohmann::json::object()},
                                {"weight_map", nlohmann::json::object()}};
        for (size_t s = 0; s < sizes.size(); ++s) {
            const std::string shard = "model-0000" + std::to_string(s + 1) + "-of-00002.safetensors";
            std::vector<TensorToWrite> tw;
            const size_t first = names.size();
            for (size_t i = 0; i < sizes[s].size(); ++i) {
                names.push_back("t" + std::to_string(s) + "_" + std::to_string(i));
                std::vector<uint8_t> d(sizes[s][i]);
                for (auto& b : d) b = static_cast<uint8_t>(rng());
                data.push_back(std::move(d));
            }
            for (size_t i = first; i < names.size(); ++i) {
                tw.push_back({names[i], DType::U8, {static_cast<int64_t>(data[i].size())}, data[i].data()});
                index["weight_map"][names[i]] = shard;
            }
            write_safetensors(dir.path() / shard, tw);
        }
        std::ofstream(dir.path() / "model.safetensors.index.json") << index.dump();
    }
};

// Counts live staging buffers, so a test can see that every one came back on every path.
struct CountingAllocator : HostStagingAllocator {
    std::atomic<int> live{0}, total{0};
    void* allocate(size_t bytes) override {
        ++live;
        ++total;
        return HostStagingAllocator::allocate(bytes);
    }
    void deallocate(void* p, size_t bytes) noexcept override {
        --live;
        HostStagingAllocator::deallocate(p, bytes);
    }
};

// The host-arena sink in single-consumer mode, recording which threads consumed and which slots were fenced.
struct SerialSink : HostArenaSink {
    using HostArenaSink::HostArenaSink;
    bool concurrent() const override { return false; }
    void consume(const StagedChunk& c) override {
        {
            std::lock_guard<std::mutex> lk(mu);
            consumers.insert(std::this_thread::get_id());
        }
        HostArenaSink::consume(c);
    }
    void wait_reusable(int) override { ++fences; }
    void abort() noexcept override { aborted = true; }
    std::mutex mu;
    std::set<std::thread::id> consumers;
    std::atomic<int> fences{0};
    bool aborted = false;
};

// Throws from the n-th consume: a device copy failing half-way.
struct FailingSink : HostArenaSink {
    FailingSink(const LoadPlan& p, uint8_t* a, int fail_at, bool conc)
        : HostArenaSink(p, a), fail_at_(fail_at), conc_(conc) {}
    bool concurrent() const override { return conc_; }
    void consume(const StagedChunk& c) override {
        if (++calls_ == fail_at_) throw Error("sink failed on purpose");
        HostArenaSink::consume(c);
    }
    void abort() noexcept override { aborted = true; }
    std::atomic<bool> aborted{false};

  private:
    std::atomic<int> calls_{0};
    int fail_at_;
    bool conc_;
};

void expect_arena_matches(const LoadPlan& plan, const SafetensorsSet& set,
                          const std::vector<uint8_t>& arena) {
    for (const LoadItem& it : plan.items) {
        const TensorInfo& t = set.get(it.name);
        ASSERT_EQ(it.bytes, t.nbytes) << it.name;
        if (it.bytes) {
            EXPECT_EQ(0, std::memcmp(arena.data() + it.dst, t.data, it.bytes)) << it.name;
        }
    }
}

// What a real loader does with the pipeline: the result exists only if every byte arrived.
std::unique_ptr<std::vector<uint8_t>> load_or_nothing(const LoadPlan& plan, StagingAllocator& alloc,
                                                      HostArenaSink& sink, std::vector<uint8_t>& arena,
                                                      const StagedOptions& o) {
    run_staged_load(plan, alloc, sink, o);
    return std::make_unique<std::vector<uint8_t>>(arena);
}

}  // namespace

TEST(StagedReader, PlanAlignsItemsAndCountsPayload) {
    ShardedFixture f;
    const SafetensorsSet set = SafetensorsSet::open(f.dir.path());
    const LoadPlan plan = plan_load(set, f.names, 256);
    ASSERT_EQ(plan.items.size(), f.names.size());
    uint64_t payload = 0;
    for (size_t i = 0; i < plan.items.size(); ++i) {
        EXPECT_EQ(plan.items[i].dst % 256, 0u);
        if (i) {
            EXPECT_GE(plan.items[i].dst, plan.items[i - 1].dst + plan.items[i - 1].bytes);
        }
        payload += f.data[i].size();
        EXPECT_EQ(set.get(f.names[i]).data, set.get(f.names[i]).data);  // views stay valid
    }
    EXPECT_EQ(plan.payload_bytes, payload);
    EXPECT_EQ(plan.files.size(), 2u);
}

TEST(StagedReader, ByteExactForOddSizesAcrossChunksShardsAndThreadCounts) {
    ShardedFixture f;
    const SafetensorsSet set = SafetensorsSet::open(f.dir.path());
    const LoadPlan plan = plan_load(set, f.names);
    for (int threads : {1, 2, 7}) {
        for (uint64_t chunk : {uint64_t{4096}, uint64_t{8192}, uint64_t{1} << 20}) {
            for (int buffers : {0, 1, 3}) {
                std::vector<uint8_t> arena(plan.arena_bytes, 0xAB);
                CountingAllocator alloc;
                HostArenaSink sink(plan, arena.data());
                StagedOptions o;
                o.threads = threads;
                o.chunk_bytes = chunk;
                o.buffers = buffers;
                uint64_t last = 0;
                o.progress = [&](uint64_t done, uint64_t total) {
                    EXPECT_GE(done, last);
                    EXPECT_EQ(total, plan.payload_bytes);
                    last = done;
                };
                const StagedStats st = run_staged_load(plan, alloc, sink, o);
                EXPECT_EQ(st.payload_bytes, plan.payload_bytes);
                EXPECT_EQ(last, plan.payload_bytes);
                EXPECT_EQ(alloc.live.load(), 0);
                expect_arena_matches(plan, set, arena);
            }
        }
    }
}

TEST(StagedReader, SingleConsumerModeUsesTheCallerThreadAndFencesSlots) {
    ShardedFixture f;
    const SafetensorsSet set = SafetensorsSet::open(f.dir.path());
    const LoadPlan plan = plan_load(set, f.names);
    std::vector<uint8_t> arena(plan.arena_bytes);
    CountingAllocator alloc;
    SerialSink sink(plan, arena.data());
    StagedOptions o;
    o.threads = 4;
    o.chunk_bytes = 4096;
    o.buffers = 2;  // fewer buffers than readers: backpressure
    const StagedStats st = run_staged_load(plan, alloc, sink, o);
    EXPECT_EQ(sink.consumers.size(), 1u);
    EXPECT_EQ(*sink.consumers.begin(), std::this_thread::get_id());
    EXPECT_EQ(sink.fences.load(), static_cast<int>(st.chunks));
    EXPECT_FALSE(sink.aborted);
    EXPECT_EQ(alloc.live.load(), 0);
    EXPECT_EQ(alloc.total.load(), 2);
    expect_arena_matches(plan, set, arena);
}

TEST(StagedReader, SubsetWithHolesAndReverseOrder) {
    ShardedFixture f;
    const SafetensorsSet set = SafetensorsSet::open(f.dir.path());
    std::vector<std::string> some;
    for (size_t i = f.names.size(); i-- > 0;)
        if (i % 3 != 1) some.push_back(f.names[i]);
    const LoadPlan plan = plan_load(set, some);
    for (uint64_t gap : {uint64_t{0}, uint64_t{1} << 20}) {
        std::vector<uint8_t> arena(plan.arena_bytes);
        HostStagingAllocator alloc;
        HostArenaSink sink(plan, arena.data());
        StagedOptions o;
        o.threads = 3;
        o.chunk_bytes = 8192;
        o.coalesce_gap = gap;
        const StagedStats st = run_staged_load(plan, alloc, sink, o);
        EXPECT_EQ(st.payload_bytes, plan.payload_bytes);
        if (gap == 0) {
            EXPECT_LT(st.read_bytes, plan.payload_bytes + 8 * 4096 * plan.items.size());
        }
        expect_arena_matches(plan, set, arena);
    }
}

TEST(StagedReader, CheckpointPlanMatchesTheBoundWeights) {
    markbase::testing::TempDir dir("staged_ck");
    write_random_checkpoint(dir.path(), markbase::testing::tiny_config("26b-a4b"), 11,
                            40000);  // several shards
    const auto ck = load_checkpoint(dir.path());
    const LoadPlan plan = plan_checkpoint_load(*ck);
    EXPECT_EQ(plan.payload_bytes, ck->bound_bytes);
    EXPECT_GT(plan.files.size(), 1u);
    std::vector<uint8_t> arena(plan.arena_bytes);
    HostStagingAllocator alloc;
    HostArenaSink sink(plan, arena.data());
    StagedOptions o;
    o.threads = 3;
    o.chunk_bytes = 16384;
    run_staged_load(plan, alloc, sink, o);
    expect_arena_matches(plan, ck->files, arena);
}

TEST(StagedReader, ShardTruncatedAfterValidationIsAnErrorNamingFileAndOffset) {
    ShardedFixture f;
    const SafetensorsSet set = SafetensorsSet::open(f.dir.path());  // validated against the full files
    const LoadPlan plan = plan_load(set, f.names);
    const fs::path shard = f.dir.path() / "model-00002-of-00002.safetensors";
    const uint64_t size = fs::file_size(shard);
    fs::resize_file(shard, size - 20000);  // cuts into the last tensor
    for (int threads : {1, 4}) {
        std::vector<uint8_t> arena(plan.arena_bytes);
        CountingAllocator alloc;
        HostArenaSink sink(plan, arena.data());
        StagedOptions o;
        o.threads = threads;
        o.chunk_bytes = 4096;
        std::unique_ptr<std::vector<uint8_t>> model;
        try {
            model = load_or_nothing(plan, alloc, sink, arena, o);
            FAIL() << "a truncated shard loaded";
        } catch (const Error& e) {
            const std::string m = e.what();
            EXPECT_NE(m.find(shard.string()), std::string::npos) << m;
            EXPECT_NE(m.find("ends early"), std::string::npos) << m;
            EXPECT_NE(m.find("offset"), std::string::npos) << m;
        }
        EXPECT_FALSE(model);
        EXPECT_EQ(alloc.live.load(), 0);
    }
}

TEST(StagedReader, SinkFailingMidwayReleasesEverythingAndPropagates) {
    ShardedFixture f;
    const SafetensorsSet set = SafetensorsSet::open(f.dir.path());
    const LoadPlan plan = plan_load(set, f.names);
    for (bool concurrent : {false, true}) {
        for (int fail_at : {1, 3, 9}) {
            std::vector<uint8_t> arena(plan.arena_bytes);
            CountingAllocator alloc;
            FailingSink sink(plan, arena.data(), fail_at, concurrent);
            StagedOptions o;
            o.threads = 4;
            o.chunk_bytes = 4096;
            std::unique_ptr<std::vector<uint8_t>> model;
            EXPECT_THROW(model = load_or_nothing(plan, alloc, sink, arena, o), Error);
            EXPECT_FALSE(model);
            EXPECT_TRUE(sink.aborted);
            EXPECT_EQ(alloc.live.load(), 0);
            EXPECT_GT(alloc.total.load(), 0);
        }
    }
}

// Sets the cancel flag from inside the first consume, so the stop lands mid-load deterministically.
struct CancellingSink : HostArenaSink {
    CancellingSink(const LoadPlan& p, uint8_t* a, std::atomic<bool>& c) : HostArenaSink(p, a), cancel(c) {}
    void consume(const StagedChunk& c) override {
        cancel = true;
        HostArenaSink::consume(c);
    }
    std::atomic<bool>& cancel;
};

TEST(StagedReader, CancelStopsTheLoad) {
    ShardedFixture f;
    const SafetensorsSet set = SafetensorsSet::open(f.dir.path());
    const LoadPlan plan = plan_load(set, f.names);
    std::vector<uint8_t> arena(plan.arena_bytes);
    CountingAllocator alloc;
    std::atomic<bool> cancel{false};
    CancellingSink sink(plan, arena.data(), cancel);
    StagedOptions o;
    o.threads = 2;
    o.chunk_bytes = 4096;
    o.cancel = &cancel;
    try {
        run_staged_load(plan, alloc, sink, o);
        FAIL() << "cancelled load completed";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("cancelled"), std::string::npos);
    }
    EXPECT_EQ(alloc.live.load(), 0);
}

TEST(StagedReader, EmptyPlanAndRawRead) {
    ShardedFixture f;
    const SafetensorsSet set = SafetensorsSet::open(f.dir.path());
    const LoadPlan empty = plan_load(set, {});
    HostStagingAllocator alloc;
    DiscardSink sink;
    EXPECT_EQ(run_staged_load(empty, alloc, sink, StagedOptions{}).payload_bytes, 0u);
    const LoadPlan zero = plan_load(set, {"t0_6"});  // a 0-byte tensor: nothing to read
    EXPECT_EQ(run_staged_load(zero, alloc, sink, StagedOptions{}).chunks, 0u);

    const RawReadResult raw = measure_raw_read(set.files(), 3, 4096, false);
    uint64_t size = 0;
    for (const std::string& p : set.files()) size += fs::file_size(p);
    EXPECT_GE(raw.bytes, size);
    EXPECT_LT(raw.bytes, size + 2 * 4096);
}

TEST(StagedReader, DirectIoFallsBackOrReadsTheSameBytes) {
    ShardedFixture f;
    const SafetensorsSet set = SafetensorsSet::open(f.dir.path());
    const LoadPlan plan = plan_load(set, f.names);
    std::vector<uint8_t> arena(plan.arena_bytes);
    HostStagingAllocator alloc;
    HostArenaSink sink(plan, arena.data());
    StagedOptions o;
    o.direct_io = true;  // tmpfs refuses O_DIRECT: the pipeline reads buffered and says so in the stats
    o.chunk_bytes = 8192;
    run_staged_load(plan, alloc, sink, o);
    expect_arena_matches(plan, set, arena);
}

TEST(LoadProgress, SummaryAndBarLines) {
    EXPECT_EQ(ByteProgress::summary_line("loaded", 50'500'000'000ull, 2.3),
              "loaded 50.5 GB in 2.30 s, 22.0 GB/s");
    const std::string bar = ByteProgress::bar_line(25'000'000'000ull, 50'000'000'000ull, 1.0, 10);
    EXPECT_EQ(bar.substr(0, 12), "[#####.....]");
    EXPECT_NE(bar.find("25.00 GB/s"), std::string::npos) << bar;
    EXPECT_NE(bar.find("ETA"), std::string::npos) << bar;

    // Not a TTY: no bar, only the summary.
    std::FILE* tmp = std::tmpfile();
    ASSERT_NE(tmp, nullptr);
    {
        ByteProgress p("loaded", 100, tmp);
        p.update(50);
        p.finish(100);
    }
    std::rewind(tmp);
    char buf[256] = {};
    const size_t n = std::fread(buf, 1, sizeof buf - 1, tmp);
    std::fclose(tmp);
    const std::string out(buf, n);
    EXPECT_EQ(out.find('\r'), std::string::npos) << out;
    EXPECT_EQ(out.rfind("loaded 0.0 GB in ", 0), 0u) << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1);
}
