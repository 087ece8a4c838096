// markbase serve [-m DIR] [--host 127.0.0.1] [--port 8080] [-np N] [-c N] [--api-key KEY] [--max-queue N]
// An OpenAI-compatible server (src/server/http_server.h) in front of the serving engine
// (src/server/engine.h): loads the model as the other commands do, serves until SIGINT/SIGTERM, logs one line
// per request on stderr. The sampling flags of `run` set the defaults a request's own fields override.
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <memory>

#include "cli/commands/commands.h"
#include "cli/commands/model_options.h"
#include "loading/tokenizer_fit.h"
#include "model/error.h"
#include "server/engine.h"
#ifdef MARKBASE_HAS_HTTP
#include "server/http_server.h"
#endif

namespace markbase::cli {

namespace {

// The serving engine over a loaded model: scheduler, multi-sequence backend, KV blocks. It is built in
// src/server/engine_impl.h (make_engine), which this branch does not have yet; the merge replaces the body
// with `return server::make_engine(std::move(lm), limits);`.
[[maybe_unused]] std::unique_ptr<server::Engine> make_serve_engine(LoadedModel lm,
                                                                   const server::EngineLimits& limits) {
    throw Error("serve: this build has no serving engine (src/server/engine_impl.h is not part of it yet)");
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
    mo.backend.slots = limits.max_sequences;
    const SamplingParams defaults = read_sampling(a, mo.model_dir);
    a.finish();

    Tokenizer tok = Tokenizer::load(mo.model_dir);
    LoadedModel lm = load_model(mo);
    check_tokenizer_fits(tok, *lm.checkpoint);
    server::ServedModel model{model_id(mo.model_dir), static_cast<int64_t>(std::time(nullptr)), tok, defaults,
                              stop_ids_for(lm)};
    const std::string backend = lm.backend->name();
    std::unique_ptr<server::Engine> engine = make_serve_engine(std::move(lm), limits);
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
