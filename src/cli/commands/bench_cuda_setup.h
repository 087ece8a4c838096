// `bench --device cuda`'s options and the backend it measures (bench_cuda_setup.cpp): the bench's own flags,
// and random weights (--synthetic) or a loaded checkpoint. Built only with the CUDA backend.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "cli/commands/args.h"
#include "loading/checkpoint.h"
#include "runtime/backend.h"

namespace markbase::cli {

constexpr int kTimelineReplays = 20;  // --timeline: traced replays of the decode graph

// The bench's own options (the model's are read by load_backend).
struct BenchArgs {
    std::optional<std::string> synthetic;
    int layers = 0;
    uint64_t seed = 1234;
    int n_prompt = 128, n_gen = 256, reps = 3, n_prefill = 512;
    bool profile = false, timeline = false;
    std::string json_out;
    int64_t need = 0;  // positions the runs need (the context is at least this)
};
BenchArgs parse_bench(ArgReader& a);

// The backend under test: random weights (--synthetic) or a checkpoint, and what the receipt says of it.
struct BenchModel {
    std::unique_ptr<Backend> owner;
    std::unique_ptr<Checkpoint> checkpoint;
    std::string label;
    BackendOptions bo;
    Tuning tuning;                      // --tuning / $MARKBASE_TUNING, for the receipt
    KvDtype kv_dtype = KvDtype::kAuto;  // --kv-cache-dtype, for the receipt
    double load_s = 0;
    int checkpoint_tp = 1;
    int chunk = 512;  // prompt tokens per batched pass (-b): the largest prefill the profile can take
    int slots = 1;
    WeightFormat weights = WeightFormat::kBf16;  // FP8: --quantize fp8 or an FP8 checkpoint
};
BenchModel load_backend(ArgReader& a, const BenchArgs& b);

}  // namespace markbase::cli
