// markbase serve [-m DIR] [--host 127.0.0.1] [--port 8080] [-np N] [-c N] [--api-key KEY] [--max-queue N]
// An OpenAI-compatible server (src/server/http_server.h) in front of the serving engine
// (src/server/engine.h): loads the model as the other commands do, serves until SIGINT/SIGTERM, logs one line
// per request on stderr. The sampling flags of `run` set the defaults a request's own fields override.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <memory>

#include "cli/commands/commands.h"
#include "cli/commands/model_options.h"
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

// What serves: the checkpoint, its sequence slots (one KV cache each over one copy of the weights) and the
// engine over them. The CPU backend serves; the CUDA backend has no slots for the engine yet
// (runtime/slot_backend.h says how bench -np's slots will map onto them), so a GPU build serves on the CPU
// unless --device cuda is asked for, which is refused rather than silently run elsewhere.
struct Serving {
    std::unique_ptr<Checkpoint> checkpoint;
    std::unique_ptr<SlotBackend> slots;
    std::unique_ptr<server::Engine> engine;
};

// limits.ctx_size comes back capped at the model's positions, as -c is for the other commands.
[[maybe_unused]] Serving make_serving(const ModelOptions& mo, const Tokenizer& tok,
                                      server::EngineLimits& limits, bool device_given) {
    if (mo.device != "cpu" && device_given)
        throw Error(
            "serve: --device " + mo.device +
            " cannot serve yet (the serving engine runs on the CPU backend's sequence slots; the CUDA "
            "backend's are not written); use --device cpu");
    if (mo.device != "cpu")
        std::fprintf(stderr, "serve: serving on the CPU (the CUDA backend does not serve yet)\n");
    if (mo.backend.tensor_parallel > 1)
        throw Error("serve: --tensor-parallel-size needs the CUDA backend, which does not serve yet");
    Serving s;
    LoadOptions lo;
    lo.check_weights = mo.check_weights;
    s.checkpoint = load_checkpoint(mo.model_dir, lo);
    check_tokenizer_fits(tok, *s.checkpoint);
    BackendOptions bo = mo.backend;
    bo.slots = limits.max_sequences;
    s.slots = make_cpu_slot_backend(*s.checkpoint, bo);
    limits.ctx_size = std::min(limits.ctx_size, s.slots->ctx_size());
    s.engine = server::make_engine(*s.slots, tok, s.checkpoint->config, limits);
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
    const bool device_given = a.value({"--device", "-dev"}).has_value() || std::getenv("MARKBASE_DEVICE");
    ModelOptions mo = ModelOptions::read(a);
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
    const SamplingParams defaults = read_sampling(a, mo.model_dir);
    a.finish();

    const Tokenizer tok = Tokenizer::load(mo.model_dir);
    Serving serving = make_serving(mo, tok, limits, device_given);
    server::ServedModel model{model_id(mo.model_dir), static_cast<int64_t>(std::time(nullptr)), tok, defaults,
                              stop_ids_for(*serving.checkpoint)};
    const std::string backend = serving.slots->name();
    server::Engine* engine = serving.engine.get();
    server::HttpServer http(*engine, std::move(model), so);
    const int port = http.start();
    server::install_stop_handlers();
    std::fprintf(stderr,
                 "serve: %s on %s, listening on http://%s:%d (%d sequences of %lld tokens, queue %d%s)\n",
                 mo.model_dir.c_str(), backend.c_str(), so.host.c_str(), port, limits.max_sequences,
                 static_cast<long long>(limits.ctx_size), limits.max_queue,
                 so.api_key.empty() ? "" : ", API key required");
    return server::serve_until_signal(http, *engine);
#endif
}

}  // namespace markbase::cli
