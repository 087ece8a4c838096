// markbase serve [-m DIR] [--device cpu|cuda] [--host 127.0.0.1] [--port 8080] [-np N] [-c N] [-b N]
//                [--api-key KEY] [--max-queue N] [--synthetic VARIANT [--layers N] [--seed S]]
// An OpenAI-compatible server (src/server/http_server.h) in front of the serving engine
// (src/server/engine.h): loads the model as the other commands do, serves until SIGINT/SIGTERM, logs one line
// per request on stderr. The sampling flags of `run` set the defaults a request's own fields override.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <memory>
#include <optional>

#include "cli/commands/commands.h"
#include "cli/commands/model_options.h"
#ifdef MARKBASE_HAS_CUDA
#include "cuda/backend.h"
#endif
#include "loading/tokenizer_fit.h"
#include "model/error.h"
#include "runtime/slot_backend.h"
#include "server/engine.h"
#include "server/engine_impl.h"
#ifdef MARKBASE_HAS_HTTP
#include "server/http_server.h"
#endif

namespace markbase::cli {

namespace {

// What serves: the checkpoint (none with --synthetic), its sequence slots (one KV cache each over one copy of
// the weights) and the engine over them. The CPU backend's slots (cpu_slots.cpp) or the CUDA backend's
// (cuda/cuda_slots.cpp), by --device.
struct Serving {
    std::unique_ptr<Checkpoint> checkpoint;
    std::vector<int> stop_ids;
    std::unique_ptr<SlotBackend> slots;
    std::unique_ptr<server::Engine> engine;
};

// --synthetic VARIANT [--layers N] [--seed S]: random weights at a variant's real widths, drawn on the GPU
// (vLLM's --load-format dummy): serving benchmarks of the big variants without their checkpoints. The
// tokenizer, chat template and sampling defaults still come from -m's folder.
struct Synthetic {
    std::optional<std::string> variant;
    int layers = 0;
    uint64_t seed = 1234;
};

[[maybe_unused]] std::unique_ptr<SlotBackend> make_cuda_slots(const ModelOptions& mo, const Synthetic& syn,
                                                              int sequences, Serving& s) {
#ifdef MARKBASE_HAS_CUDA
    if (mo.backend.tensor_parallel > 1)
        throw Error("serve: --tensor-parallel-size " + std::to_string(mo.backend.tensor_parallel) +
                    " cannot serve yet (the tensor-parallel backend has no sequence slots); use 1");
    BackendOptions bo = mo.backend;
    bo.slots = std::max(2, sequences);  // decode_batch needs two; a lone sequence leaves one idle
    std::unique_ptr<CudaBackend> be;
    if (syn.variant) {
        bo.weights = mo.quantize;  // --quantize: the random weights quantised on the device, as bench does
        be = make_synthetic_cuda_backend(*syn.variant, syn.layers, bo, syn.seed);
        s.stop_ids = be->config().stop_ids;
    } else {
        ModelOptions m = mo;
        m.backend = bo;
        LoadedModel lm = load_model(m);
        s.checkpoint = std::move(lm.checkpoint);
        s.stop_ids = stop_ids_for(*s.checkpoint);
        be.reset(dynamic_cast<CudaBackend*>(lm.backend.release()));
        if (!be) throw Error("internal: --device cuda loaded a backend that is not the CUDA backend");
    }
    return make_cuda_slot_backend(std::move(be), sequences);
#else
    (void)mo, (void)syn, (void)sequences, (void)s;
    throw Error("serve: --device cuda: this build has no CUDA backend (configure where nvcc is found)");
#endif
}

// limits.ctx_size comes back capped at the model's positions, as -c is for the other commands.
[[maybe_unused]] Serving make_serving(const ModelOptions& mo, const Synthetic& syn, const Tokenizer& tok,
                                      server::EngineLimits& limits) {
    Serving s;
    if (mo.device == "cuda") {
        s.slots = make_cuda_slots(mo, syn, limits.max_sequences, s);
    } else {
        if (syn.variant) throw Error("serve: --synthetic draws its weights on the GPU: use --device cuda");
        if (mo.backend.tensor_parallel > 1) throw Error("serve: --tensor-parallel-size needs --device cuda");
        s.checkpoint = load_checkpoint_for(mo);
        s.stop_ids = stop_ids_for(*s.checkpoint);
        BackendOptions bo = mo.backend;
        bo.slots = limits.max_sequences;
        s.slots = make_cpu_slot_backend(*s.checkpoint, bo);
    }
    if (s.checkpoint)
        check_tokenizer_fits(tok, *s.checkpoint);
    else if (tok.vocab_size() > s.slots->config().vocab_size)
        throw Error("serve: the tokenizer in " + mo.model_dir + " has " + std::to_string(tok.vocab_size()) +
                    " ids, more than the model's vocabulary of " +
                    std::to_string(s.slots->config().vocab_size));
    limits.ctx_size = std::min(limits.ctx_size, s.slots->ctx_size());
    s.engine = server::make_engine(*s.slots, tok, s.slots->config(), limits);
    return s;
}

// The id /v1/models reports: the checkpoint folder's name.
[[maybe_unused]] std::string model_id(const std::string& dir) {
    std::filesystem::path p = std::filesystem::path(dir).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();
    return p.filename().empty() ? std::string("markbase") : p.filename().string();
}

}  // namespace

int cmd_serve(const Args& args) {
#ifndef MARKBASE_HAS_HTTP
    (void)args;
    throw Error(
        "serve: this build has no HTTP server: cpp-httplib was not found when it was configured "
        "(apt-get install libcpp-httplib-dev, then configure and build again)");
#else
    ArgReader a("serve", args);
    Synthetic syn;
    syn.variant = a.value({"--synthetic"});
    syn.layers = a.integer({"--layers"}, 0, 0, 1 << 16);
    syn.seed = static_cast<uint64_t>(a.integer<int64_t>({"--seed"}, 1234, 0, INT64_MAX));
    ModelOptions mo = ModelOptions::read(a);
    if (syn.variant && !mo.save_dir.empty())
        throw UsageError(
            "serve: --save writes a loaded checkpoint, and --synthetic loads none (give -m DIR)");
    server::ServerOptions so;
    so.host = a.value_or({"--host"}, "127.0.0.1");
    so.port = a.integer({"--port"}, 8080, 0, 65535);
    const char* env_key = std::getenv("MARKBASE_API_KEY");
    so.api_key = a.value_or({"--api-key"}, env_key ? env_key : "");
    so.log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
    server::EngineLimits limits;
    limits.max_sequences = a.integer({"-np", "--parallel"}, limits.max_sequences, 1, 4096);
    limits.max_queue = a.integer({"--max-queue"}, limits.max_queue, 0, 1 << 20);
    limits.ctx_size = mo.backend.ctx_size;
    limits.step_token_budget = mo.backend.chunk;  // -b: a step's prompt tokens, the backend's prefill chunk
    // the GPU's paged KV pool: what this share of its memory leaves after the weights and buffers (vLLM's
    // flag and default)
    mo.backend.gpu_memory_utilization = a.number({"--gpu-memory-utilization"}, 0.9);
    if (!(mo.backend.gpu_memory_utilization > 0 && mo.backend.gpu_memory_utilization <= 1)) {
        char got[32];
        std::snprintf(got, sizeof got, "%g", mo.backend.gpu_memory_utilization);
        throw UsageError(std::string("serve: --gpu-memory-utilization must be in (0, 1], got ") + got);
    }
    const SamplingParams defaults = read_sampling(a, mo.model_dir);
    a.finish();

    const Tokenizer tok = Tokenizer::load(mo.model_dir);
    Serving serving = make_serving(mo, syn, tok, limits);
    const std::string id = syn.variant ? "synthetic-" + *syn.variant : model_id(mo.model_dir);
    server::ServedModel model{id, static_cast<int64_t>(std::time(nullptr)), tok, defaults, serving.stop_ids};
    const std::string backend = serving.slots->name();
    server::Engine* engine = serving.engine.get();
    server::HttpServer http(*engine, std::move(model), so);
    const int port = http.start();
    server::install_stop_handlers();
    const int64_t pool = serving.slots->kv_pool_blocks();  // the paged cache's full-attention blocks
    const std::string paged = pool > 0
                                  ? ", KV pool " + std::to_string(pool) +
                                        " blocks = " + std::to_string(pool * serving.slots->kv_block_size()) +
                                        " positions of every sequence together"
                                  : "";
    std::fprintf(
        stderr, "serve: %s on %s, listening on http://%s:%d (%d sequences of %lld tokens, queue %d%s%s)\n",
        syn.variant ? ("random weights of " + *syn.variant).c_str() : mo.model_dir.c_str(), backend.c_str(),
        so.host.c_str(), port, limits.max_sequences, static_cast<long long>(limits.ctx_size),
        limits.max_queue, paged.c_str(), so.api_key.empty() ? "" : ", API key required");
    return server::serve_until_signal(http, *engine);
#endif
}

}  // namespace markbase::cli
