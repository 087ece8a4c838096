// The GPU as a sink of the staging pipeline (loading/staged_reader.h): staging buffers are page-locked, so
// each filled buffer goes to the device with cudaMemcpyAsync on the loader's own stream while the reader
// threads fill the others; an event per buffer tells a reader when it may refill it. Experts need no
// transform: the MoE kernels read the checkpoint's [E][rows][cols] layout as it is.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "cuda/check.h"
#include "cuda/loader.h"
#include "cuda/model.h"
#include "loading/memory_plan.h"
#include "model/tensor_plan.h"
#include "runtime/progress.h"

namespace markbase {

namespace {

class PinnedStagingAllocator : public StagingAllocator {
  public:
    void* allocate(size_t bytes) override {
        void* p = nullptr;
        const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
        if (e != cudaSuccess) {
            cudaGetLastError();
            throw Error("cannot allocate " + std::to_string(bytes >> 20) + " MiB of pinned staging memory (" +
                        cudaGetErrorString(e) + "): lower --tuning load_chunk_mib or load_threads");
        }
        return p;
    }
    void deallocate(void* p, size_t) noexcept override { cudaFreeHost(p); }
};

// Copies each chunk's pieces to dst[item] + offset. One stream: a single H2D copy engine is what PCIe gives
// a pinned host buffer anyway, and one stream keeps the fencing to one event per slot.
class CudaSink : public StagedSink {
  public:
    CudaSink(std::vector<uint8_t*> dst, int slots) : dst_(std::move(dst)) {
        CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        events_.resize(static_cast<size_t>(slots), nullptr);
        for (cudaEvent_t& e : events_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    ~CudaSink() override {
        abort();
        for (cudaEvent_t e : events_)
            if (e) cudaEventDestroy(e);
        if (stream_) cudaStreamDestroy(stream_);
    }
    void consume(const StagedChunk& c) override {
        // Pieces of neighbouring tensors whose destinations also touch go as one copy.
        size_t i = 0;
        while (i < c.pieces.size()) {
            const StagedPiece& a = c.pieces[i];
            uint8_t* to = dst_[a.item] + a.item_offset;
            uint64_t len = a.bytes;
            size_t j = i + 1;
            for (; j < c.pieces.size(); ++j) {
                const StagedPiece& b = c.pieces[j];
                if (b.buf_offset != a.buf_offset + len || dst_[b.item] + b.item_offset != to + len) break;
                len += b.bytes;
            }
            CUDA_CHECK(cudaMemcpyAsync(to, c.data + a.buf_offset, len, cudaMemcpyHostToDevice, stream_));
            i = j;
        }
        CUDA_CHECK(cudaEventRecord(events_[static_cast<size_t>(c.slot)], stream_));
    }
    void wait_reusable(int slot) override {
        CUDA_CHECK(cudaEventSynchronize(events_[static_cast<size_t>(slot)]));
    }
    void finish() override { CUDA_CHECK(cudaStreamSynchronize(stream_)); }
    void abort() noexcept override {
        if (stream_) cudaStreamSynchronize(stream_);
        cudaGetLastError();  // an error here must not surface at some later, unrelated launch check
    }

  private:
    std::vector<uint8_t*> dst_;
    cudaStream_t stream_ = nullptr;
    std::vector<cudaEvent_t> events_;
};

struct DeviceBuffer {
    void* p = nullptr;
    ~DeviceBuffer() {
        if (p) cudaFree(p);
    }
};

}  // namespace

bool cuda_memory_info(uint64_t* free_bytes, uint64_t* total_bytes) {
    if (!cuda_device_info().available) return false;
    size_t f = 0, t = 0;
    if (cudaSetDevice(0) != cudaSuccess || cudaMemGetInfo(&f, &t) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    *free_bytes = f;
    *total_bytes = t;
    return true;
}

StagedOptions cuda_staged_options(const Tuning& tuning) {
    StagedOptions o;
    // 16 readers by default: the setting `bench load` measured at 24 GB/s warm on the 16-core H200 host
    o.threads = tuning.load_threads > 0
                    ? tuning.load_threads
                    : std::min(16, std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
    o.chunk_bytes = static_cast<uint64_t>(tuning.load_chunk_mib) << 20;
    o.direct_io = tuning.load_direct;
    return o;
}

StagedStats cuda_staged_load_once(const Checkpoint& ck, const StagedOptions& opt) {
    CUDA_CHECK(cudaSetDevice(0));
    const LoadPlan plan = plan_checkpoint_load(ck);
    const auto t0 = std::chrono::steady_clock::now();
    DeviceBuffer arena;
    const cudaError_t e = cudaMalloc(&arena.p, std::max<uint64_t>(plan.arena_bytes, 1));
    if (e != cudaSuccess) {
        cudaGetLastError();
        throw Error("cannot allocate " + format_gb(plan.arena_bytes) + " on the GPU for the weights");
    }
    std::vector<uint8_t*> dst;
    for (const LoadItem& it : plan.items) dst.push_back(static_cast<uint8_t*>(arena.p) + it.dst);
    PinnedStagingAllocator alloc;
    StagedOptions o = opt;
    const int slots = o.buffers > 0 ? o.buffers : std::max(1, o.threads) + 2;
    o.buffers = slots;
    CudaSink sink(std::move(dst), slots);
    StagedStats st = run_staged_load(plan, alloc, sink, o);
    st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return st;
}

namespace cuda {

std::unique_ptr<DeviceWeights> upload_weights_staged(const Checkpoint& ck, const StagedOptions& opt) {
    CUDA_CHECK(cudaSetDevice(0));
    auto dw = std::make_unique<DeviceWeights>();  // frees whatever it holds if anything below throws
    dw->config = ck.config;
    const std::vector<PlannedTensor> plan_t = plan_tensors(dw->config, &dw->w);
    const LoadPlan plan = plan_checkpoint_load(ck);
    if (plan.items.size() != plan_t.size()) throw Error("internal: load plan and tensor plan disagree");
    // One allocation for the whole model, tensors as aligned views into it: no per-tensor allocator calls,
    // and a copy that spans neighbouring tensors stays inside one allocation (cudaMemcpyAsync refuses a
    // range that crosses two).
    const cudaError_t e = cudaMalloc(&dw->arena, std::max<uint64_t>(plan.arena_bytes, 1));
    if (e != cudaSuccess) {
        cudaGetLastError();
        dw->arena = nullptr;
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        throw Error("out of GPU memory allocating " + format_gb(plan.arena_bytes) + " for the weights (" +
                    format_gb(free_b) + " free of " + format_gb(total_b) + ")");
    }
    std::vector<uint8_t*> dst;
    for (size_t i = 0; i < plan_t.size(); ++i) {
        if (plan.items[i].name != dw->config.weight_prefix + plan_t[i].name)
            throw Error("internal: load plan and tensor plan disagree at " + plan_t[i].name);
        uint8_t* p = static_cast<uint8_t*>(dw->arena) + plan.items[i].dst;
        const uint64_t bytes = plan.items[i].bytes;
        dw->tensors.push_back({plan_t[i].name, plan_t[i].shape, reinterpret_cast<const bf16*>(p), bytes});
        *plan_t[i].slot = reinterpret_cast<const bf16*>(p);
        dw->bytes += bytes;
        dst.push_back(p);
    }
    StagedOptions o = opt;
    o.buffers = std::max(1, o.threads) + 2;
    ByteProgress progress("loaded", plan.payload_bytes);
    o.progress = [&](uint64_t done, uint64_t) { progress.update(done); };
    PinnedStagingAllocator alloc;
    {
        CudaSink sink(std::move(dst), o.buffers);
        run_staged_load(plan, alloc, sink, o);
    }
    progress.finish(plan.payload_bytes);
    for (size_t i = 0; i < dw->w.layers.size(); ++i)
        dw->w.layers[i].layer_scalar = ck.weights.layers[i].layer_scalar;
    return dw;
}

}  // namespace cuda

}  // namespace markbase
