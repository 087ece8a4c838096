// Weights on the GPU: uploaded from a mapped checkpoint, or drawn at random directly in device memory for
// benchmarks at real widths without files (one allocation per tensor), in the checkpoint's layout.
#include <algorithm>
#include <cmath>
#include <string>

#include "cuda/check.h"
#include "cuda/loader.h"
#include "cuda/model.h"
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
    if (quant_arena) cudaFree(quant_arena);
    if (dequant_scratch) cudaFree(dequant_scratch);
    if (arena) {
        cudaFree(arena);
        return;
    }
    for (const Tensor& t : tensors) cudaFree(const_cast<bf16*>(t.ptr));
}

std::unique_ptr<DeviceWeights> upload_weights(const Checkpoint& ck, const Tuning& tuning) {
    // The staged pipeline (staged_load.cu): one device allocation, reader threads and async copies
    // (26B-A4B warm: 24.8 GB/s on the H200).
    return upload_weights_staged(ck, cuda_staged_options(tuning));
}

std::unique_ptr<DeviceWeights> upload_weights_from_host(const Checkpoint& ck, CopyDrop skip) {
    auto dw = std::make_unique<DeviceWeights>();
    dw->config = ck.config;
    // the host pointers, through the plan's slots (in plan order), and the rows the device will hold
    Weights src = ck.weights.quant.empty() ? ck.weights : rows_on_device(ck.config, ck.weights, ck.format);
    const std::vector<PlannedTensor> from = plan_bound_tensors(dw->config, src);
    const std::vector<PlannedTensor> plan = plan_tensors(dw->config, &dw->w);
    for (size_t i = 0; i < plan.size(); ++i) {
        const PlannedTensor& p = plan[i];
        if (copy_dropped(src, from[i], skip)) {
            dw->tensors.push_back({p.name, p.shape, nullptr, 0});
            *p.slot = kDroppedBf16;
            continue;
        }
        const uint64_t bytes = 2 * numel(p.shape);
        bf16* d = device_alloc(bytes, p.name);
        dw->tensors.push_back({p.name, p.shape, d, bytes});
        CUDA_CHECK(cudaMemcpy(d, *from[i].slot, bytes, cudaMemcpyHostToDevice));
        *p.slot = d;
        dw->bytes += bytes;
    }
    for (size_t l = 0; l < dw->w.layers.size(); ++l)
        dw->w.layers[l].layer_scalar = ck.weights.layers[l].layer_scalar;
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
