#include "cli/commands/model_options.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "loading/generation_config.h"
#include "loading/quant_checkpoint.h"
#include "loading/quantization_config.h"
#include "loading/save_quantized.h"
#include "model/error.h"
#include "model/tensor_plan.h"
#ifdef MARKBASE_HAS_CUDA
#include "cuda/backend.h"
#include "cuda/loader.h"
#include "loading/memory_plan.h"
#endif

namespace markbase::cli {

ModelOptions ModelOptions::read(ArgReader& a) {
    ModelOptions o;
    auto m = a.value({"-m", "--model"});
    // --help lists the flags even where no model is found (the folder is read only for sampling defaults)
    o.model_dir = m ? *m : a.help() ? default_model_dir_or_empty() : default_model_dir();
    o.device = resolve_device(a.value_or({"--device", "-dev"}, "auto"));
    o.backend.threads = a.integer({"-t", "--threads"}, 0, 0, kMaxThreads);
    o.backend.ctx_size = a.integer<int64_t>({"-c", "--ctx-size"}, 4096, 1, kMaxTokens);
    o.backend.chunk = a.integer({"-b", "--batch-size"}, 256, 1, 8192);
    o.backend.tensor_parallel = a.integer({"-tp", "--tp", "--tensor-parallel-size"}, 1, 1, kMaxGpus);
    o.backend.kv_dtype = parse_kv_dtype(a.value_or({"--kv-cache-dtype", "-ctk"}, "auto"), "--kv-cache-dtype");
    o.check_weights = a.flag({"--check-weights"});
    const std::string q = a.value_or({"--quantize"}, "none");
    if (q != "none" && q != "fp8" && q != "int4" && !a.help())
        throw UsageError("--quantize: unknown weight format '" + q + "' (expected fp8, int4 or none)");
    o.quantize = q == "fp8" ? WeightFormat::kFp8 : q == "int4" ? WeightFormat::kInt4 : WeightFormat::kBf16;
    if (const auto save = a.value({"--save"})) {
        if (save->empty() && !a.help()) throw UsageError("--save: expected a folder to write, found \"\"");
        o.save_dir = *save;
    }
    o.backend.bf16_copy = read_bf16_copy(a);
    o.backend.tuning = read_tuning(a);
    return o;
}

LoadOptions ModelOptions::load_options() const {
    LoadOptions lo;
    lo.check_weights = check_weights;
    lo.quantize = quantize;
    return lo;
}

std::unique_ptr<Checkpoint> load_checkpoint_for(const ModelOptions& o) {
    // --save's refusals come before a load that may take minutes
    if (!o.save_dir.empty()) {
        check_save_target(o.save_dir, o.model_dir);
        if (o.quantize == WeightFormat::kBf16 &&
            !read_quantization_config(std::filesystem::path(o.model_dir) / "config.json"))
            throw nothing_to_save(o.model_dir);
    }
    std::unique_ptr<Checkpoint> ck = load_checkpoint(o.model_dir, o.load_options());
    for (const std::string& n : ck->notes) std::fprintf(stderr, "note: %s\n", n.c_str());
    if (!o.save_dir.empty()) {
        const SaveResult r = save_quantized(*ck, o.save_dir);
        for (const std::string& n : r.notes) std::fprintf(stderr, "note: %s\n", n.c_str());
        std::fprintf(stderr, "%s\n", save_summary(r).c_str());
    }
    return ck;
}

Bf16Copy read_bf16_copy(ArgReader& a) {
    const std::string c = a.value_or({"--bf16-copy"}, "auto");
    if (c == "keep") return Bf16Copy::kKeep;
    if (c == "drop") return Bf16Copy::kDrop;
    if (c != "auto" && !a.help())
        throw UsageError("--bf16-copy: expected auto, keep or drop, found '" + c + "'");
    return Bf16Copy::kAuto;
}

Tuning read_tuning(ArgReader& a) {
    if (const auto t = a.value({"--tuning"})) return parse_tuning(*t, "--tuning");
    if (const char* env = std::getenv("MARKBASE_TUNING")) return parse_tuning(env, "MARKBASE_TUNING");
    return {};
}

std::string resolve_device(const std::string& requested) {
    if (requested != "auto") return requested;
    if (const char* env = std::getenv("MARKBASE_DEVICE"); env && *env && std::string(env) != "auto")
        return env;
#ifdef MARKBASE_HAS_CUDA
    if (cuda_device_info().available) return "cuda";
#endif
    return "cpu";
}

#ifdef MARKBASE_HAS_CUDA
uint64_t gpu_weight_bytes(const Checkpoint& ck, cuda::CopyDrop drop) {
    if (ck.weights.quant.empty()) return ck.bound_bytes;
    const bool zero_points = has_zero_points(ck.weights);
    Weights w = cuda::rows_on_device(ck.config, ck.weights, ck.format);
    double bytes = cuda::dequant_scratch_needed(w, drop)
                       ? static_cast<double>(cuda::dequant_scratch_bytes(ck.config))
                       : 0.0;
    for (const PlannedTensor& p : plan_bound_tensors(ck.config, w)) {
        double n = 1;
        for (int64_t d : p.shape) n *= static_cast<double>(d);
        const bool copy = !cuda::copy_dropped(w, p, drop);
        bytes += n * ((copy ? 2 : 0) + quantized_bytes_per_weight(p, ck.format, zero_points));
    }
    return static_cast<uint64_t>(bytes);
}

CudaFitChoice fit_cuda_model(const Checkpoint& ck, const BackendOptions& b, uint64_t free_bytes,
                             const std::string& device) {
    // tensor parallel: each GPU holds about 1/N of the weights (the cache estimate stays whole); batched
    // decode (bench -np): a KV cache for each of the slots; a pool sized to the memory (serve) needs room for
    // one sequence's context here, and takes what is left once loaded
    const int64_t pool = b.kv_blocks > 0                ? b.kv_blocks
                         : b.gpu_memory_utilization > 0 ? kv_blocks_per_slot(b.ctx_size)
                                                        : 0;
    const auto fit = [&](Bf16Copy copy) {
        const cuda::CopyDrop drop = ck.weights.quant.empty()
                                        ? cuda::CopyDrop{}
                                        : cuda::copy_drop(ck.config, ck.format, b.tuning, copy);
        return check_cuda_fit(ck.config, gpu_weight_bytes(ck, drop) / b.tensor_parallel, b.ctx_size, b.chunk,
                              b.slots, free_bytes, device, gpu_kv_bytes(b.kv_dtype, b.slots), pool);
    };
    CudaFitChoice c;
    c.copy = b.bf16_copy == Bf16Copy::kAuto ? Bf16Copy::kKeep : b.bf16_copy;
    FitCheck f = fit(c.copy);
    if (!f.fits && b.bf16_copy == Bf16Copy::kAuto && !ck.weights.quant.empty()) {
        const FitCheck without = fit(Bf16Copy::kDrop);
        if (without.fits) {
            c.copy = Bf16Copy::kDrop;
            c.note = "the quantised projections' bf16 copy does not fit beside them (" + f.message +
                     "): not kept, so prompts and batched steps dequantise each product's weights first "
                     "(--bf16-copy keep to refuse instead)";
            f = without;
        }
    }
    if (!f.fits) throw Error("--device cuda: " + f.message);
    return c;
}
#endif

LoadedModel load_model(const ModelOptions& o) {
    LoadedModel lm;
    auto t0 = std::chrono::steady_clock::now();
    lm.checkpoint = load_checkpoint_for(o);
    if (o.device == "cpu") {
        if (o.backend.tensor_parallel > 1)
            throw Error("--tensor-parallel-size " + std::to_string(o.backend.tensor_parallel) +
                        " splits a model over GPUs: use --device cuda");
        lm.backend = make_cpu_backend(*lm.checkpoint, o.backend);
    } else if (o.device == "cuda") {
#ifdef MARKBASE_HAS_CUDA
        // Refuse before any weight moves when weights + KV cache + workspace exceed the free memory; a
        // quantised model's bf16 copy of its projections only where it fits (--bf16-copy auto)
        BackendOptions b = o.backend;
        uint64_t free_b = 0, total_b = 0;
        if (cuda_memory_info(&free_b, &total_b)) {
            const CudaFitChoice c = fit_cuda_model(*lm.checkpoint, b, free_b, cuda_device_info().name);
            if (!c.note.empty()) std::fprintf(stderr, "note: %s\n", c.note.c_str());
            b.bf16_copy = c.copy;
        }
        lm.backend = make_cuda_backend(*lm.checkpoint, b);
#else
        throw Error(
            "--device cuda: this build has no CUDA backend (configure where nvcc is found, or with "
            "-DMARKBASE_CUDA=ON); use --device cpu");
#endif
    } else {
        throw Error("--device: unknown device '" + o.device + "' (expected auto, cpu or cuda)");
    }
    lm.load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return lm;
}

// An installed binary (bin/markbase) finds the model that `cmake --install` put beside it first, so a
// package works wherever it is installed; the source tree it was built from comes second, for build/markbase.
std::string default_model_dir() {
    namespace fs = std::filesystem;
    if (const char* env = std::getenv("MARKBASE_MODEL")) return env;
    std::vector<fs::path> candidates;
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec)
        candidates.push_back(exe.parent_path().parent_path() / "share" / "markbase" / "models" / "default");
    candidates.push_back(fs::path(MARKBASE_SOURCE_DIR) / "models" / "default");
    std::string looked;
    for (const auto& c : candidates) {
        if (fs::exists(c / "config.json")) return c.string();
        looked += (looked.empty() ? "" : ", ") + c.string();
    }
    throw Error("no model given and no bundled model found (looked in " + looked +
                "): pass -m DIR (a Gemma 4 checkpoint folder) or set MARKBASE_MODEL");
}

std::string default_model_dir_or_empty() {
    try {
        return default_model_dir();
    } catch (const Error&) {
        return "";
    }
}

std::vector<int> stop_ids_for(const Checkpoint& ck) {
    std::vector<int> ids = ck.config.stop_ids;
    for (int id : read_generation_config(ck.dir).stop_ids)
        if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
    return ids;
}

std::vector<int> stop_ids_for(const LoadedModel& lm) {
    return stop_ids_for(*lm.checkpoint);
}

SamplingParams read_sampling(ArgReader& a, const std::string& model_dir) {
    const GenerationDefaults g = read_generation_config(model_dir);
    SamplingParams s;
    s.temperature = static_cast<float>(
        a.number({"--temp", "--temperature"}, g.do_sample ? g.temperature.value_or(1.0f) : 0.0));
    s.top_k = a.integer({"--top-k"}, g.top_k.value_or(64), 0, kIntMax);
    s.top_p = static_cast<float>(a.number({"--top-p"}, g.top_p.value_or(0.95f)));
    s.min_p = static_cast<float>(a.number({"--min-p"}, g.min_p.value_or(0.0f)));
    s.repeat_penalty =
        static_cast<float>(a.number({"--repeat-penalty"}, g.repetition_penalty.value_or(1.0f)));
    s.repeat_last_n = a.integer({"--repeat-last-n"}, 64, -1, kIntMax);
    s.presence_penalty = static_cast<float>(a.number({"--presence-penalty"}, 0.0));
    s.frequency_penalty = static_cast<float>(a.number({"--frequency-penalty"}, 0.0));
    const int64_t seed = a.integer<int64_t>({"-s", "--seed"}, -1, -1, INT64_MAX);
    s.seed = seed >= 0 ? static_cast<uint64_t>(seed) : std::random_device{}();
    s.validate();
    return s;
}

}  // namespace markbase::cli
