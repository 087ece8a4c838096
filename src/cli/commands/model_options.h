// The options every model-running command shares (-m, --device, -t, -c, -b) and the loading they imply.
#pragma once

#include <memory>
#include <string>

#include "cli/commands/args.h"
#include "loading/checkpoint.h"
#include "runtime/backend.h"
#include "runtime/sampler.h"
#ifdef MARKBASE_HAS_CUDA
#include "cuda/loader.h"
#endif

namespace markbase::cli {

struct LoadedModel {
    std::unique_ptr<Checkpoint> checkpoint;
    std::unique_ptr<Backend> backend;
    double load_s = 0;
};

// Reads -m/--model (default: $MARKBASE_MODEL, else the bundled models/default), --device, -t/--threads,
// -c/--ctx-size, -b/--batch-size, -tp/--tensor-parallel-size, --kv-cache-dtype, --check-weights,
// --quantize, --save, --bf16-copy, --tuning.
struct ModelOptions {
    std::string model_dir;
    std::string device = "cpu";
    BackendOptions backend;
    bool check_weights = false;  // --check-weights: the loader scans every tensor for NaN/Inf
    // --quantize fp8|int4|none: a bf16 checkpoint's projections quantised at load, kFp8 per row, kInt4 per
    // group of 128 weights (symmetric)
    WeightFormat quantize = WeightFormat::kBf16;
    // --save DIR: the quantised model written as a compressed-tensors checkpoint once loaded
    // (loading/save_quantized.h), before the command goes on
    std::string save_dir;
    static ModelOptions read(ArgReader& a);
    LoadOptions load_options() const;
};

// load_checkpoint with the options' LoadOptions; the loader's notes go to stderr ("note: ..."). With --save,
// the target is checked before loading and the model saved after it, one line on stderr saying where.
std::unique_ptr<Checkpoint> load_checkpoint_for(const ModelOptions& o);

LoadedModel load_model(const ModelOptions& o);

// --bf16-copy auto|keep|drop (runtime/backend.h Bf16Copy; default auto).
Bf16Copy read_bf16_copy(ArgReader& a);

#ifdef MARKBASE_HAS_CUDA
// The weights' bytes on the GPU: the files' tensors as stored; a quantised model holds its tensors in bf16
// but the copies `drop` names (cuda::CopyDrop: the experts' where nothing reads them, the dense projections'
// under --bf16-copy drop, with the scratch their products dequantise into), and its projections once more
// quantised, with their scales (and int4's zero points).
uint64_t gpu_weight_bytes(const Checkpoint& ck, cuda::CopyDrop drop);

// What load_model decides before any weight moves: whether weights + KV cache + workspace fit free_bytes of
// `device`, a quantised model's bf16 copy of its projections kept where that fits (--bf16-copy auto) and
// dropped, with a note saying so, where only that makes it fit. Throws the fit check's message otherwise.
struct CudaFitChoice {
    Bf16Copy copy = Bf16Copy::kKeep;
    std::string note;  // empty unless auto dropped the copy
};
CudaFitChoice fit_cuda_model(const Checkpoint& ck, const BackendOptions& b, uint64_t free_bytes,
                             const std::string& device);
#endif

// --tuning KEY=VALUE[,...] (runtime/tuning.h), else $MARKBASE_TUNING, else the defaults: the one place the
// engine's tuning is built.
Tuning read_tuning(ArgReader& a);

// "auto" (the default --device) becomes $MARKBASE_DEVICE when set, else "cuda" when this build has the CUDA
// backend and a device is present, else "cpu"; any other name is returned as given.
std::string resolve_device(const std::string& requested);

// Reads --temp, --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n, --presence-penalty,
// --frequency-penalty, -s/--seed (llama.cpp's names). Unset flags take the model folder's
// generation_config.json values, else Gemma 4's (temperature 1.0, top_k 64, top_p 0.95).
SamplingParams read_sampling(ArgReader& a, const std::string& model_dir);

// The folder `markbase` uses without -m: $MARKBASE_MODEL, else the installed bundled model
// (../share/markbase/models/default from the binary's folder), else models/default of the source tree it was
// built from; throws markbase::Error saying to pass -m DIR or set MARKBASE_MODEL when neither exists.
std::string default_model_dir();
// The same, "" where it would throw.
std::string default_model_dir_or_empty();

// Stop ids: config.json's eos ids plus generation_config.json's.
std::vector<int> stop_ids_for(const LoadedModel& lm);
std::vector<int> stop_ids_for(const Checkpoint& ck);

}  // namespace markbase::cli
