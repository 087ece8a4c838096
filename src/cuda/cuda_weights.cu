// Weights on the GPU: uploaded from a mapped checkpoint, or drawn at random directly in device memory for
// benchmarks at real widths without files. One allocation per tensor, in the checkpoint's layout.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "cpu/thread_pool.h"
#include "cuda/check.h"
#include "cuda/cuda_loader.h"
#include "cuda/cuda_model.h"
#include "model/tensor_plan.h"

namespace markbase::cuda {

namespace {

// splitmix64 as loading/random_checkpoint.cpp's Rng: the k-th draw of a stream seeded s is mix(s +
// (k+1)*golden), so every element can be drawn independently.
// out[q] for q < rows * cols is draw k = k0 + (q / cols) * ld + q % cols: a whole tensor (k0 0, cols = ld)
// or a rank's block of rows or columns of it, with the very values the whole tensor has there.
__global__ void fill_kernel(uint16_t* out, int64_t rows, int64_t cols, int64_t ld, int64_t k0, uint64_t seed,
                            float lo, float span) {
    const int64_t n = rows * cols;
    for (int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; q < n;
         q += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t k = cols == ld ? k0 + q : k0 + (q / cols) * ld + q % cols;
        uint64_t z = seed + static_cast<uint64_t>(k + 1) * 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
        uint32_t b = __float_as_uint(fmaf(span, u, lo));
        b += 0x7fffu + ((b >> 16) & 1u);
        out[q] = static_cast<uint16_t>(b >> 16);
    }
}

uint64_t numel(const std::vector<int64_t>& shape) {
    uint64_t n = 1;
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    return n;
}

}  // namespace

bf16* device_alloc(uint64_t bytes, const std::string& what) {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        size_t free_b = 0, total_b = 0;
        cudaGetLastError();
        cudaMemGetInfo(&free_b, &total_b);
        throw Error("out of GPU memory allocating " + std::to_string(bytes >> 20) + " MiB for " + what +
                    " (" + std::to_string(free_b >> 20) + " MiB free of " + std::to_string(total_b >> 20) +
                    " MiB)");
    }
    return static_cast<bf16*>(p);
}

void fill_random_bf16_block(bf16* out, int64_t rows, int64_t cols, int64_t ld, int64_t k0, uint64_t seed,
                            float lo, float hi, cudaStream_t s) {
    const int threads = 256;
    const int64_t n = rows * cols;
    if (n <= 0) return;
    const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 65536);
    fill_kernel<<<static_cast<int>(blocks), threads, 0, s>>>(out, rows, cols, ld, k0, seed, lo, hi - lo);
    CUDA_CHECK_LAUNCH();
}

void fill_random_bf16(bf16* out, int64_t n, uint64_t seed, float lo, float hi, cudaStream_t s) {
    fill_random_bf16_block(out, 1, n, n, 0, seed, lo, hi, s);
}

DeviceWeights::~DeviceWeights() {
    if (arena) {
        cudaFree(arena);
        return;
    }
    for (const Tensor& t : tensors) cudaFree(const_cast<bf16*>(t.ptr));
}

namespace {

// Host -> device through two pinned staging buffers: while the GPU copies one, a pool of threads fills the
// other from the mapped checkpoint (taking its page faults in parallel), so the transfer runs at pinned-copy
// speed instead of the driver's single-threaded pageable path.
class Uploader {
  public:
    Uploader() : pool_(std::min(8, std::max(1, static_cast<int>(std::thread::hardware_concurrency())))) {
        CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        for (int b = 0; b < 2; ++b) {
            CUDA_CHECK(cudaMallocHost(&buf_[b], kChunk));
            CUDA_CHECK(cudaEventCreateWithFlags(&done_[b], cudaEventDisableTiming));
        }
    }
    ~Uploader() {
        cudaStreamSynchronize(stream_);
        for (int b = 0; b < 2; ++b) {
            cudaFreeHost(buf_[b]);
            cudaEventDestroy(done_[b]);
        }
        cudaStreamDestroy(stream_);
    }
    void copy(void* dst, const uint8_t* src, uint64_t bytes) {
        for (uint64_t off = 0; off < bytes; off += kChunk) {
            const uint64_t len = std::min<uint64_t>(kChunk, bytes - off);
            const int b = next_++ & 1;
            CUDA_CHECK(cudaEventSynchronize(done_[b]));  // the GPU is done with this buffer
            uint8_t* stage = static_cast<uint8_t*>(buf_[b]);
            const uint8_t* from = src + off;
            pool_.parallel_for(static_cast<int64_t>(len), [&](int64_t lo, int64_t hi) {
                std::memcpy(stage + lo, from + lo, static_cast<size_t>(hi - lo));
            });
            CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(dst) + off, stage, len, cudaMemcpyHostToDevice,
                                       stream_));
            CUDA_CHECK(cudaEventRecord(done_[b], stream_));
        }
    }
    void finish() { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  private:
    static constexpr size_t kChunk = size_t{64} << 20;
    cpu::ThreadPool pool_;
    cudaStream_t stream_ = nullptr;
    void* buf_[2] = {nullptr, nullptr};
    cudaEvent_t done_[2] = {nullptr, nullptr};
    unsigned next_ = 0;
};

}  // namespace

std::unique_ptr<DeviceWeights> upload_weights(const Checkpoint& ck) {
    // The staged pipeline (cuda_staged_load.cu) is the default: one device allocation, reader threads and
    // async copies (26B-A4B warm: 24.8 GB/s on the H200). MARKBASE_LOADER=simple keeps the older
    // tensor-by-tensor upload for comparison.
    const char* l = std::getenv("MARKBASE_LOADER");
    if (l && *l && std::string(l) != "simple" && std::string(l) != "staged")
        throw Error(std::string("MARKBASE_LOADER=") + l + ": expected staged (the default) or simple");
    if (!l || std::string(l) != "simple") return upload_weights_staged(ck);
    auto dw = std::make_unique<DeviceWeights>();
    dw->config = ck.config;
    Uploader up;
    for (const PlannedTensor& p : plan_tensors(dw->config, &dw->w)) {
        const TensorInfo& info = ck.files.get(dw->config.weight_prefix + p.name);
        bf16* d = device_alloc(info.nbytes, p.name);
        dw->tensors.push_back({p.name, p.shape, d, info.nbytes});
        up.copy(d, info.data, info.nbytes);
        *p.slot = d;
        dw->bytes += info.nbytes;
    }
    up.finish();
    for (size_t i = 0; i < dw->w.layers.size(); ++i)
        dw->w.layers[i].layer_scalar = ck.weights.layers[i].layer_scalar;
    return dw;
}

std::unique_ptr<DeviceWeights> synthetic_weights(const ModelConfig& c, uint64_t seed) {
    auto dw = std::make_unique<DeviceWeights>();
    dw->config = c;
    const std::vector<PlannedTensor> plan = plan_tensors(dw->config, &dw->w);
    for (size_t i = 0; i < plan.size(); ++i) {
        const PlannedTensor& p = plan[i];
        const uint64_t n = numel(p.shape);
        bf16* d = device_alloc(2 * n, p.name);
        dw->tensors.push_back({p.name, p.shape, d, 2 * n});
        float lo = 0, hi = 0;
        random_init_bounds(p, lo, hi);
        fill_random_bf16(d, static_cast<int64_t>(n), seed * 1000003ull + i, lo, hi, nullptr);
        *p.slot = d;
        dw->bytes += 2 * n;
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    for (LayerWeights& l : dw->w.layers) {
        bf16 raw = 0;
        CUDA_CHECK(cudaMemcpy(&raw, l.layer_scalar_raw, sizeof raw, cudaMemcpyDeviceToHost));
        l.layer_scalar = bf16_to_float(raw);
    }
    return dw;
}

}  // namespace markbase::cuda
