// Only with the CUDA backend: bench_cuda.cpp says what the bench measures.
#ifdef MARKBASE_HAS_CUDA

#include "cli/commands/bench_cuda_setup.h"

#include <algorithm>

#include "cli/commands/model_options.h"
#include "cuda/backend.h"
#include "loading/quant_checkpoint.h"
#include "model/error.h"
#include "runtime/graph_timeline.h"
#include "runtime/timing.h"

namespace markbase::cli {

BenchArgs parse_bench(ArgReader& a) {
    BenchArgs b;
    b.synthetic = a.value({"--synthetic"});
    b.layers = a.integer({"--layers"}, 0, 0, kIntMax);
    b.seed = static_cast<uint64_t>(a.integer<int64_t>({"--seed"}, 1234, 0, INT64_MAX));
    b.n_prompt = a.integer({"-p", "--n-prompt"}, 128, 1, kMaxTokens);
    b.n_gen = a.integer({"-n", "--n-gen"}, 256, 1, kMaxTokens);
    b.reps = a.integer({"-r", "--repetitions"}, 3, 1, kIntMax);
    b.n_prefill = a.integer({"--prefill-tokens"}, 512, 0, kMaxTokens);
    b.profile = a.flag({"--profile"});
    b.timeline = a.flag({"--timeline"});
    b.json_out = a.value_or({"--json-out"}, "");
    b.need = std::max<int64_t>(int64_t{b.n_prompt} + b.n_gen + 8, b.n_prefill);
    // the timeline's replays are decode steps after the prompt and one token
    if (b.timeline)
        b.need =
            std::max<int64_t>(b.need, int64_t{b.n_prompt} + 1 + timeline_positions(kTimelineReplays) + 8);
    return b;
}

BenchModel load_backend(ArgReader& a, const BenchArgs& b) {
    BenchModel m;
    // -np/--parallel N (llama.cpp's name): N sequences decoded together, one token each per step (batched
    // decode, docs/batched-decode.md), timed after the one-sequence receipt
    m.slots = a.integer({"-np", "--parallel"}, 1, 1, 4096);
    if (b.synthetic) {
        if (a.value({"-m", "--model"}))
            throw Error("bench: give either -m DIR or --synthetic VARIANT, not both");
        const std::string dev = a.value_or({"--device", "-dev"}, "cuda");
        if (dev != "cuda" && dev != "auto") throw Error("bench --synthetic runs on --device cuda only");
        BackendOptions& bo = m.bo;
        bo.ctx_size = a.integer<int64_t>({"-c", "--ctx-size"}, b.need, 1, kMaxTokens);
        bo.chunk = m.chunk = a.integer({"-b", "--batch-size"}, 512, 1, 8192);
        bo.tensor_parallel = a.integer({"-tp", "--tp", "--tensor-parallel-size"}, 1, 1, kMaxGpus);
        bo.slots = m.slots;
        bo.kv_dtype = parse_kv_dtype(a.value_or({"--kv-cache-dtype", "-ctk"}, "auto"), "--kv-cache-dtype");
        bo.tuning = read_tuning(a);
        // --quantize fp8|int4: the random weights quantised on the device (model/fp8.h, model/int4.h), as a
        // checkpoint's are at load (-m DIR --quantize goes through the loader)
        const std::string quantize = a.value_or({"--quantize"}, "none");
        if (quantize == "fp8")
            bo.weights = WeightFormat::kFp8;
        else if (quantize == "int4")
            bo.weights = WeightFormat::kInt4;
        else if (quantize != "none")
            throw Error("--quantize: expected fp8, int4 or none, found \"" + quantize + "\"");
        bo.bf16_copy = read_bf16_copy(a);  // (auto keeps it: random weights have no fit check)
        m.tuning = bo.tuning;
        m.kv_dtype = bo.kv_dtype;
        a.finish();
        bo.ctx_size = std::max<int64_t>(bo.ctx_size, b.need);
        const double t0 = now_s();
        m.owner = make_synthetic_cuda_backend(*b.synthetic, b.layers, bo, b.seed);
        m.load_s = now_s() - t0;
        m.label = "synthetic:" + *b.synthetic + (b.layers ? "/" + std::to_string(b.layers) + "L" : "");
        if (bo.weights != WeightFormat::kBf16) m.label += std::string(" ") + weight_format_name(bo.weights);
        if (bo.weights != WeightFormat::kBf16 && bo.bf16_copy == Bf16Copy::kDrop)
            m.label += " (no bf16 copy)";
        m.weights = bo.weights;
        return m;
    }
    ModelOptions mo = ModelOptions::read(a);
    mo.device = "cuda";
    mo.backend.ctx_size =
        std::max<int64_t>(a.integer<int64_t>({"-c", "--ctx-size"}, b.need, 1, kMaxTokens), b.need);
    mo.backend.chunk = m.chunk = a.integer({"-b", "--batch-size"}, 512, 1, 8192);
    mo.backend.slots = m.slots;
    a.finish();
    m.checkpoint_tp = mo.backend.tensor_parallel;
    m.tuning = mo.backend.tuning;
    m.kv_dtype = mo.backend.kv_dtype;
    LoadedModel lm = load_model(mo);
    m.checkpoint = std::move(lm.checkpoint);
    m.owner = std::move(lm.backend);
    m.load_s = lm.load_s;
    m.label = mo.model_dir;
    if (!m.checkpoint->weights.quant.empty()) m.weights = m.checkpoint->format;
    return m;
}

}  // namespace markbase::cli

#endif  // MARKBASE_HAS_CUDA
