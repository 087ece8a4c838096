// What http_server.cpp and http_server_generate.cpp share: the server's state and the helpers that write
// responses. Included by those files only (it brings in cpp-httplib).
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "server/http_server.h"
#include "server/openai_error.h"
#include "server/serve_metrics.h"

namespace markbase::server {

// httplib::Server listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, compiled into Debian's library):
// a burst of clients overflows it and some connections fail. Listening again on the bound socket widens it.
class Listener : public httplib::Server {
  public:
    bool widen_backlog(int n) { return ::listen(svr_sock_, n) == 0; }
};

// Whether a request's client has closed its connection, for a handler that writes nothing while it waits (a
// non-streaming request): http_server_client_watch.cpp. Only on the handler's thread, while it runs.
class ClientWatch {
  public:
    explicit ClientWatch(const httplib::Request& req);
    bool gone() const;  // closed or reset; false where the connection's socket was not found

  private:
    int fd_ = -1;
};

struct HttpServer::Impl {
    Engine& engine;
    ServedModel model;
    ServerOptions opt;
    Listener http;
    StatusCounts statuses;
    std::atomic<bool> draining{false};
    std::thread thread;

    Impl(Engine& e, ServedModel m, ServerOptions o) : engine(e), model(std::move(m)), opt(std::move(o)) {}
    void install_routes();
    bool authorized(const httplib::Request& req) const;
    // POST /v1/chat/completions and /v1/completions once the body is read.
    void generate(ApiKind kind, const std::string& body, const httplib::Request& req, httplib::Response& res);
};

// The request being served on this thread, for its log line: reset before routing, filled by the handler
// (and by a stream's writer, which runs on the same thread), logged and cleared once the response is out.
struct RequestTrace {
    RequestLog log;
    std::optional<std::chrono::steady_clock::time_point> start;
};
RequestTrace& current_trace();

void respond_json(httplib::Response& res, int status, const nlohmann::json& body);
void respond_error(httplib::Response& res, const ApiError& e);

}  // namespace markbase::server
