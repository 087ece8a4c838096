// markbase serve's HTTP side: OpenAI's API over cpp-httplib, in front of an Engine (engine.h).
//   POST /v1/chat/completions, POST /v1/completions  generation, streamed as server-sent events on request
//   GET /v1/models, GET /v1/models/{id}               the one model served
//   GET /health                                       200 {"status": "ok"} (no key needed)
//   GET /metrics                                      Prometheus text
// HTTP threads only parse, submit, cancel and read metrics. A request's thread waits on its own sink
// (request_sink.h) and writes what comes; when its client goes away (a write fails, or the socket is closed
// while waiting) it cancels the request in the engine. Errors are OpenAI error objects: 400 (naming the
// field), 401, 404, 405, 413, 503 (queue full, shutting down). Built only with cpp-httplib
// (MARKBASE_HAS_HTTP).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "server/engine.h"
#include "server/openai_prompt.h"
#include "server/openai_request.h"

namespace markbase::server {

struct ServerOptions {
    std::string host = "127.0.0.1";
    int port = 8080;                        // 0: a free port (start() returns it)
    std::string api_key;                    // empty: no key asked; else "Authorization: Bearer KEY"
    size_t max_body_bytes = kMaxBodyBytes;  // larger bodies get 413
    int http_threads = 0;  // connections served at once; 0: the engine's sequences + queue + 8
    std::function<void(const std::string&)> log;  // one line per request; empty: none
};

class HttpServer {
  public:
    HttpServer(Engine& engine, ServedModel model, ServerOptions options);
    ~HttpServer();  // stop_accepting() and wait()
    HttpServer(const HttpServer&) = delete;
    HttpServer& operator=(const HttpServer&) = delete;

    // Binds and serves on a thread of its own; returns the port. Throws markbase::Error when the address
    // cannot be bound.
    int start();
    // Closes the listening socket and answers new generation requests on open connections with 503;
    // requests in flight go on (Engine::shutdown() ends them). Returns at once.
    void stop_accepting();
    // Waits until every connection is closed and every HTTP thread has ended (after stop_accepting()).
    void wait();
    bool running() const;  // between start() and the listening socket's closing

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// SIGINT and SIGTERM set a flag serve_until_signal() polls (a second one exits at once); SIGPIPE is ignored.
// Installed once the model is loaded: until then the signals end the process as usual.
void install_stop_handlers();

// markbase serve's main loop, on a started server: waits for SIGINT or SIGTERM (or for the server to stop
// otherwise), then stops accepting, shuts the engine down (in-flight streams end with an error event), waits
// for every HTTP thread and returns 0.
int serve_until_signal(HttpServer& server, Engine& engine);

}  // namespace markbase::server
