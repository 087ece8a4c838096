// The options every model-running command shares (-m, --device, -t, -c, -b) and the loading they imply.
#pragma once

#include <memory>
#include <string>

#include "cli/commands/args.h"
#include "loading/checkpoint.h"
#include "runtime/backend.h"
#include "runtime/sampler.h"

namespace markbase::cli {

struct LoadedModel {
    std::unique_ptr<Checkpoint> checkpoint;
    std::unique_ptr<Backend> backend;
    double load_s = 0;
};

// Reads -m/--model, --device, -t/--threads, -c/--ctx-size, -b/--batch-size.
struct ModelOptions {
    std::string model_dir;
    std::string device = "cpu";
    BackendOptions backend;
    static ModelOptions read(ArgReader& a);
};

LoadedModel load_model(const ModelOptions& o);

// "auto" (the default --device) becomes "cuda" when this build has the CUDA backend and a device is present,
// else "cpu"; any other name is returned as given.
std::string resolve_device(const std::string& requested);

// Reads --temp, --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n, --presence-penalty,
// --frequency-penalty, -s/--seed (llama.cpp's names). Defaults are Gemma 4's generation_config.
SamplingParams read_sampling(ArgReader& a);

}  // namespace markbase::cli
