#include "cli/commands/model_options.h"

#include <chrono>
#include <cstdlib>
#include <random>

#include "model/error.h"
#ifdef MARKBASE_HAS_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace markbase::cli {

ModelOptions ModelOptions::read(ArgReader& a) {
    ModelOptions o;
    auto m = a.value({"-m", "--model"});
    if (m) o.model_dir = *m;
    else if (const char* env = std::getenv("MARKBASE_MODEL")) o.model_dir = env;
    else throw Error("no model given: pass -m DIR (a Gemma 4 checkpoint folder) or set MARKBASE_MODEL");
    o.device = resolve_device(a.value_or({"--device", "-dev"}, "auto"));
    o.backend.threads = static_cast<int>(a.integer({"-t", "--threads"}, 0));
    o.backend.ctx_size = a.integer({"-c", "--ctx-size"}, 4096);
    o.backend.chunk = static_cast<int>(a.integer({"-b", "--batch-size"}, 256));
    if (o.backend.threads < 0) throw Error("--threads must be >= 0");
    if (o.backend.chunk <= 0 || o.backend.chunk > 8192) throw Error("--batch-size must be in [1, 8192]");
    return o;
}

std::string resolve_device(const std::string& requested) {
    if (requested != "auto") return requested;
#ifdef MARKBASE_HAS_CUDA
    if (cuda_device_info().available) return "cuda";
#endif
    return "cpu";
}

LoadedModel load_model(const ModelOptions& o) {
    LoadedModel lm;
    auto t0 = std::chrono::steady_clock::now();
    lm.checkpoint = load_checkpoint(o.model_dir);
    if (o.device == "cpu") {
        lm.backend = make_cpu_backend(*lm.checkpoint, o.backend);
    } else if (o.device == "cuda") {
#ifdef MARKBASE_HAS_CUDA
        lm.backend = make_cuda_backend(*lm.checkpoint, o.backend);
#else
        throw Error("--device cuda: this build has no CUDA backend (configure where nvcc is found, or with "
                    "-DMARKBASE_CUDA=ON); use --device cpu");
#endif
    } else {
        throw Error("--device: unknown device '" + o.device + "' (expected auto, cpu or cuda)");
    }
    lm.load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return lm;
}

SamplingParams read_sampling(ArgReader& a) {
    SamplingParams s;
    s.temperature = static_cast<float>(a.number({"--temp", "--temperature"}, 1.0));
    s.top_k = static_cast<int>(a.integer({"--top-k"}, 64));
    s.top_p = static_cast<float>(a.number({"--top-p"}, 0.95));
    s.min_p = static_cast<float>(a.number({"--min-p"}, 0.0));
    s.repeat_penalty = static_cast<float>(a.number({"--repeat-penalty"}, 1.0));
    s.repeat_last_n = static_cast<int>(a.integer({"--repeat-last-n"}, 64));
    s.presence_penalty = static_cast<float>(a.number({"--presence-penalty"}, 0.0));
    s.frequency_penalty = static_cast<float>(a.number({"--frequency-penalty"}, 0.0));
    const int64_t seed = a.integer({"-s", "--seed"}, -1);
    s.seed = seed >= 0 ? static_cast<uint64_t>(seed) : std::random_device{}();
    s.validate();
    return s;
}

}  // namespace markbase::cli
