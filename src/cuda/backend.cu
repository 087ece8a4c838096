// CudaModel behind the runtime's Backend interface, the factories, and device discovery.
#include <algorithm>
#include <mutex>

#include "cuda/loader.h"
#include "cuda/model.h"
#include "loading/config_json.h"
#include "model/tensor_plan.h"
#include "model/variants.h"

namespace markbase {

namespace {

// The paged KV pool (slots > 1): opt.kv_blocks, or what opt.gpu_memory_utilization of the GPU leaves once
// the weights (already resident) and the buffers are counted; 0: every slot's whole context.
int64_t paged_pool_blocks(const ModelConfig& c, const BackendOptions& opt) {
    if (opt.slots < 2 || opt.kv_blocks > 0) return opt.slots < 2 ? 0 : opt.kv_blocks;
    if (opt.gpu_memory_utilization <= 0) return 0;
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    const double share = std::min(opt.gpu_memory_utilization, 1.0) * static_cast<double>(total_b);
    const double used = static_cast<double>(total_b - free_b);
    const uint64_t budget = share > used ? static_cast<uint64_t>(share - used) : 0;
    const int elem = gpu_kv_bytes(opt.kv_dtype, opt.slots);
    const int64_t blocks = fit_kv_blocks(c, 0, opt.ctx_size, std::max(1, opt.chunk), opt.slots, elem, budget);
    if (blocks > 0) return blocks;
    const CudaMemoryPlan p = plan_cuda_memory(c, 0, opt.ctx_size, std::max(1, opt.chunk), opt.slots, elem,
                                              kv_blocks_per_slot(opt.ctx_size));
    char share_s[32];
    std::snprintf(share_s, sizeof share_s, "%g", opt.gpu_memory_utilization);
    throw Error(std::string("--gpu-memory-utilization ") + share_s + ": " + format_gb(budget) +
                " of the GPU's " + format_gb(total_b) + " is left for the KV cache and " + "buffers (" +
                format_gb(static_cast<uint64_t>(used)) + " in use, the weights included), less " + "than " +
                std::to_string(opt.slots) + " sequences with room for one context of " +
                std::to_string(opt.ctx_size) + " positions need (" + format_gb(p.total()) +
                "): raise it, or lower --ctx-size, --parallel or --batch-size");
}

class CudaBackendImpl final : public CudaBackend {
  public:
    // (dw is moved only inside CudaModel's constructor, after paged_pool_blocks has read its config)
    CudaBackendImpl(std::unique_ptr<cuda::DeviceWeights> dw, const BackendOptions& opt)
        : model_(std::move(dw), opt.ctx_size, std::max(1, opt.chunk), opt.tuning, opt.kv_dtype, nullptr,
                 opt.slots, paged_pool_blocks(dw->config, opt)),
          device_select_(opt.tuning.device_sampling) {}

    const ModelConfig& config() const override { return model_.config(); }
    std::string name() const override { return "cuda (" + cuda_device_info().name + ")"; }
    int64_t n_past() const override { return model_.n_past; }
    int64_t ctx_size() const override { return model_.ctx(); }
    void reset() override { model_.n_past = 0; }
    bool truncate(int64_t n_keep) override { return model_.truncate(n_keep); }
    uint64_t cache_bytes() const override { return model_.cache_bytes(); }

    void eval(const int* ids, int64_t n, float* logits, bool all_logits) override {
        cuda::eval_model(model_, config(), ids, n, logits, all_logits);
    }

    int max_select_k() const override { return device_select_ && model_.can_select() ? cuda::kTopKMax : 0; }
    int max_select_penalty_ids() const override { return cuda::CudaModel::kMaxPenaltyIds; }
    bool eval_select(int id, const DeviceSelect& req, DeviceSelection* out, float* logits) override {
        cuda::check_token_ids(config(), &id, 1);
        const int n_pen = static_cast<int>(req.pen_ids.size());
        pen_.assign(req.pen_ids.begin(), req.pen_ids.end());
        pen_.insert(pen_.end(), req.pen_counts.begin(), req.pen_counts.end());
        return model_.decode_select(id, pen_.data(), n_pen, req.repeat_penalty, req.presence_penalty,
                                    req.frequency_penalty, req.k, &out->top, &out->n_finite, logits);
    }

    int batch_select_rows() const override { return device_select_ ? model_.batch_select_rows() : 0; }
    void batch_row_logits(int row, float* out) override { model_.batch_row_logits(row, out); }
    void batch_select(BatchRowSelect* rows, int m) override { model_.batch_select(rows, m); }

    std::vector<int> decode_greedy(int steps, float* last_logits) override {
        if (model_.n_past == 0) throw Error("decode_greedy: evaluate a prompt first");
        return model_.decode_greedy(steps, last_logits);
    }
    std::vector<CudaProfileEntry> profile_step() override {
        if (model_.n_past == 0) throw Error("profile_step: evaluate a prompt first");
        return model_.profile_step();
    }
    bool profile_gated() const override { return model_.profile_gated(); }
    GraphTimeline decode_timeline(int replays) override {
        if (model_.n_past == 0) {
            GraphTimeline t;
            t.why_not = "decode_timeline: evaluate a prompt first";
            return t;
        }
        return model_.decode_timeline(replays);
    }
    GraphTimeline batch_timeline(const int* slots, const int* ids, int n, int replays) override {
        try {
            cuda::check_token_ids(config(), ids, n);
        } catch (const std::exception& e) {
            GraphTimeline t;
            t.why_not = e.what();
            return t;
        }
        return model_.batch_timeline(slots, ids, n, replays);
    }
    std::vector<CudaProfileEntry> profile_prefill(const int* ids, int n) override {
        if (n < 1 || n > model_.chunk())
            throw Error("profile_prefill: " + std::to_string(n) + " tokens; at most the chunk of " +
                        std::to_string(model_.chunk()) + " (-b)");
        cuda::check_token_ids(config(), ids, n);
        model_.n_past = 0;
        return model_.profile_prefill(ids, n);
    }
    CudaDeviceInfo device() const override { return cuda_device_info(); }
    int slots() const override { return model_.slots(); }
    void slot_reset(int slot) override { model_.reset_slot(slot); }
    void slot_eval(int slot, const int* ids, int64_t n) override {
        cuda::check_token_ids(config(), ids, n);
        if (slot >= 0 && slot < model_.slots() && model_.slot_past(slot) + n > model_.ctx())
            throw Error("context full: sequence slot " + std::to_string(slot) + " holds " +
                        std::to_string(model_.slot_past(slot)) + " + " + std::to_string(n) +
                        " new tokens, more than the context size " + std::to_string(model_.ctx()));
        for (int64_t b = 0; b < n; b += model_.chunk())
            model_.prefill_slot(slot, ids + b, static_cast<int>(std::min<int64_t>(model_.chunk(), n - b)));
    }
    std::vector<int> decode_batch(const int* slots, const int* ids, int n, float* logits) override {
        cuda::check_token_ids(config(), ids, n);
        return model_.decode_batch(slots, ids, n, logits);
    }
    std::vector<CudaProfileEntry> profile_batch(const int* slots, const int* ids, int n) override {
        cuda::check_token_ids(config(), ids, n);
        return model_.profile_batch(slots, ids, n);
    }
    int batch_rows() const override { return model_.chunk(); }
    int mixed_rows() const override { return model_.chunk(); }
    std::vector<int> mixed_batch(const SlotItem* items, int n, float* logits) override {
        for (int t = 0; t < n; ++t) cuda::check_token_ids(config(), items[t].ids, items[t].n);
        return model_.mixed_batch(items, n, logits);
    }
    std::vector<CudaProfileEntry> profile_mixed(const SlotItem* items, int n) override {
        for (int t = 0; t < n; ++t) cuda::check_token_ids(config(), items[t].ids, items[t].n);
        return model_.profile_mixed(items, n);
    }
    double batch_expert_weight_bytes(int n) const override { return model_.batch_expert_weight_bytes(n); }
    int64_t kv_pool_blocks() const override { return model_.kv_pool_blocks(); }
    void slot_set_blocks(int slot, const int* blocks, int64_t n) override {
        model_.set_slot_blocks(slot, blocks, n);
    }
    std::string prefill_note() const override {
        if (!config().moe) return {};
        const cuda::CudaModel::MoePrefillStats& m = model_.moe_prefill_stats();
        return "MoE experts: " + std::to_string(m.moe_gemm_layers) +
               " layers through moe_gemm (grouped on the device), " + std::to_string(m.moe_gemm_fp8_layers) +
               " with FP8 rows, " + std::to_string(m.moe_gemm_int4_layers) + " with int4; " +
               std::to_string(m.gemv_layers) + " as grouped GEMVs; " + std::to_string(m.stream_layers) +
               " batched-step layers recorded with their experts on the device (" +
               std::to_string(m.stream_fp8_layers) + " of them FP8, " + std::to_string(m.stream_int4_layers) +
               " int4; since the model was built; a step's graph counts once, when captured)";
    }
    uint64_t weight_bytes() const override {
        const cuda::DeviceWeights& w = model_.weights();
        return w.bytes + w.quant_bytes + w.dequant_scratch_bytes;
    }
    const cuda::DeviceWeights& weights() const { return model_.weights(); }

  private:
    cuda::CudaModel model_;
    bool device_select_;    // Tuning::device_sampling
    std::vector<int> pen_;  // eval_select's ids then counts
};

}  // namespace

namespace cuda {

void check_token_ids(const ModelConfig& c, const int* ids, int64_t n) {
    const int64_t limit = c.ple_dim ? std::min<int64_t>(c.vocab_size, c.ple_vocab) : c.vocab_size;
    for (int64_t t = 0; t < n; ++t)
        if (ids[t] < 0 || ids[t] >= limit)
            throw Error("token id " + std::to_string(ids[t]) + " at position " + std::to_string(t) +
                        " is outside the vocabulary [0, " + std::to_string(limit) + ")");
}

void eval_model(CudaModel& m, const ModelConfig& whole, const int* ids, int64_t n, float* logits,
                bool all_logits) {
    if (n <= 0) return;
    if (m.n_past + n > m.ctx())
        throw Error("context full: " + std::to_string(m.n_past) + " cached + " + std::to_string(n) +
                    " new tokens exceed the context size " + std::to_string(m.ctx()) +
                    " (set --ctx-size, at most " + std::to_string(m.config().max_positions) + ")");
    check_token_ids(whole, ids, n);
    const int64_t host_vocab = whole.vocab_size;
    if (n == 1 && !all_logits) {
        m.decode(ids[0], logits);
        return;
    }
    const int64_t chunk = m.chunk();
    for (int64_t b = 0; b < n; b += chunk) {
        const int k = static_cast<int>(std::min<int64_t>(chunk, n - b));
        float* out = nullptr;
        if (logits && all_logits)
            out = logits + b * host_vocab;
        else if (logits && b + k == n)
            out = logits;
        m.prefill(ids + b, k, out, all_logits);
    }
}

}  // namespace cuda

namespace {

void require_device() {
    const CudaDeviceInfo info = cuda_device_info();
    if (!info.available) throw Error("--device cuda: no usable CUDA device (" + info.why_not + ")");
    CUDA_CHECK(cudaSetDevice(0));
}

BackendOptions clamp(const ModelConfig& c, BackendOptions opt) {
    if (opt.ctx_size <= 0) throw Error("--ctx-size must be positive, found " + std::to_string(opt.ctx_size));
    opt.ctx_size = std::min<int64_t>(opt.ctx_size, c.max_positions);
    opt.chunk = std::max(1, std::min<int>(opt.chunk, static_cast<int>(opt.ctx_size)));
    if (opt.slots < 1) throw Error("--parallel must be >= 1, found " + std::to_string(opt.slots));
    if (opt.tensor_parallel < 1)
        throw Error("--tensor-parallel-size must be >= 1, found " + std::to_string(opt.tensor_parallel));
    return opt;
}

}  // namespace

CudaDeviceInfo cuda_device_info() {
    static std::once_flag once;
    static CudaDeviceInfo info;
    std::call_once(once, [] {
        int n = 0;
        const cudaError_t e = cudaGetDeviceCount(&n);
        if (e != cudaSuccess) {
            info.why_not = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
            cudaGetLastError();
            return;
        }
        if (n == 0) {
            info.why_not = "the CUDA runtime reports no devices";
            return;
        }
        cudaDeviceProp prop{};
        const cudaError_t e2 = cudaGetDeviceProperties(&prop, 0);
        if (e2 != cudaSuccess) {
            info.why_not = std::string(cudaGetErrorName(e2)) + ": " + cudaGetErrorString(e2);
            cudaGetLastError();
            return;
        }
        info.available = true;
        info.name = prop.name;
        info.sm_count = prop.multiProcessorCount;
        info.cc_major = prop.major;
        info.cc_minor = prop.minor;
        info.memory_gib = static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0);
    });
    return info;
}

namespace {
// --bf16-copy auto where no fit check resolved it (load_model's does): keep the copy
Bf16Copy kept(Bf16Copy c) {
    return c == Bf16Copy::kAuto ? Bf16Copy::kKeep : c;
}
}  // namespace

std::unique_ptr<CudaBackend> make_cuda_backend(const Checkpoint& ck, const BackendOptions& opt) {
    require_device();
    const BackendOptions o = clamp(ck.config, opt);
    const bool quant = !ck.weights.quant.empty();
    // tensors the loader made, in none of the files
    const bool made = quant || !ck.owned.dequantized.empty();
    if (made && o.tensor_parallel > 1)
        throw Error("quantised weights over several GPUs (--tensor-parallel-size " +
                    std::to_string(o.tensor_parallel) +
                    ") are not supported yet: run them on one GPU, or the bf16 checkpoint split");
    if (o.tensor_parallel > 1) return cuda::make_tp_backend(ck.config, &ck, 0, o);
    // quantised: the bf16 slots (the dequantised values, for the prefill's and the batched step's dense
    // products) from the host but the copies the model does without (loader.h CopyDrop), then the bytes,
    // scales and zero points the decode step reads
    const cuda::CopyDrop drop =
        quant ? cuda::copy_drop(ck.config, ck.format, o.tuning, kept(o.bf16_copy)) : cuda::CopyDrop{};
    auto dw = made ? cuda::upload_weights_from_host(ck, drop) : cuda::upload_weights(ck, o.tuning);
    if (quant) {
        cuda::attach_quant_weights(*dw, ck.format, &ck.weights);
        cuda::drop_copies(*dw, drop);  // (the scratch; the copies themselves were not uploaded)
    }
    return std::make_unique<CudaBackendImpl>(std::move(dw), o);
}

std::unique_ptr<CudaBackend> make_synthetic_cuda_backend(const std::string& variant, int layers,
                                                         const BackendOptions& opt, uint64_t seed) {
    const ModelConfig c = parse_config_text(variant_config(variant, layers).dump(), "synthetic " + variant);
    require_device();
    const BackendOptions o = clamp(c, opt);
    const bool quant = o.weights != WeightFormat::kBf16;
    if (quant && o.tensor_parallel > 1)
        throw Error("quantised weights over several GPUs are not supported yet");
    if (o.tensor_parallel > 1) return cuda::make_tp_backend(c, nullptr, seed, o);
    auto dw = cuda::synthetic_weights(c, seed);
    if (quant) cuda::attach_quant_weights(*dw, o.weights, nullptr);
    // the copies the model does without (loader.h CopyDrop) freed before the KV pool is sized from what is
    // left
    if (quant) cuda::drop_copies(*dw, cuda::copy_drop(c, o.weights, o.tuning, kept(o.bf16_copy)));
    return std::make_unique<CudaBackendImpl>(std::move(dw), o);
}

namespace {
// A bf16 copy the device does not keep (loader.h CopyDrop), made again from its rows on the
// device by quantize_rows.cu's expressions (the values the copy held before it was freed), for the host.
// p: the device weights' plan entry.
void remake_copy(const PlannedTensor& p, WeightFormat f, bf16* out) {
    if (!p.quant || !p.quant->q) throw Error("internal: " + p.name + " has neither its bf16 copy nor rows");
    int64_t rows = 1;
    for (size_t d = 0; d + 1 < p.shape.size(); ++d) rows *= p.shape[d];
    const int K = static_cast<int>(p.shape.back());
    const uint64_t bytes = 2 * static_cast<uint64_t>(rows) * static_cast<uint64_t>(K);
    bf16* d = cuda::device_alloc(bytes, "the host copy of " + p.name);
    const QuantMatrix& q = *p.quant;
    cuda::dequantize_rows(q.q, q.scale, q.zero, rows, K, f == WeightFormat::kInt4, d, nullptr);
    const cudaError_t e = cudaMemcpy(out, d, bytes, cudaMemcpyDeviceToHost);
    cudaFree(d);
    CUDA_CHECK(e);
}
}  // namespace

std::unique_ptr<HostWeights> copy_weights_to_host(const CudaBackend& be) {
    const auto* impl = dynamic_cast<const CudaBackendImpl*>(&be);
    if (!impl) throw Error("copy_weights_to_host: not a CUDA backend");
    const cuda::DeviceWeights& dw = impl->weights();
    auto hw = std::make_unique<HostWeights>();
    Checkpoint& ck = hw->checkpoint;
    ck.dir = "(device copy)";
    ck.config = dw.config;
    const std::vector<PlannedTensor> plan = plan_tensors(ck.config, &ck.weights);
    Weights dev = dw.w;  // the device's pointers and rows, in plan order
    const std::vector<PlannedTensor> dplan = plan_bound_tensors(dw.config, dev);
    if (plan.size() != dw.tensors.size() || dplan.size() != plan.size())
        throw Error("internal: tensor plan changed");
    hw->storage.reserve(plan.size());
    for (size_t i = 0; i < plan.size(); ++i) {
        const auto& t = dw.tensors[i];
        uint64_t elems = 1;
        for (int64_t d : t.shape) elems *= static_cast<uint64_t>(d);
        hw->storage.emplace_back(elems);
        if (t.ptr)
            CUDA_CHECK(cudaMemcpy(hw->storage.back().data(), t.ptr, t.bytes, cudaMemcpyDeviceToHost));
        else
            remake_copy(dplan[i], dw.quant_format, hw->storage.back().data());
        *plan[i].slot = hw->storage.back().data();
        ck.bound_bytes += 2 * elems;
    }
    for (size_t i = 0; i < ck.weights.layers.size(); ++i)
        ck.weights.layers[i].layer_scalar = dw.w.layers[i].layer_scalar;
    return hw;
}

}  // namespace markbase
