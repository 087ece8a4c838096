#include <cstdio>
#include <regex>

#include "model/error.h"
#include "server/http_server_impl.h"
#include "server/openai_response.h"

namespace markbase::server {

using nlohmann::json;

namespace {

struct Route {
    const char* path;
    const char* method;
};
const Route kRoutes[] = {{"/v1/chat/completions", "POST"},
                         {"/v1/completions", "POST"},
                         {"/v1/models", "GET"},
                         {"/health", "GET"},
                         {"/metrics", "GET"}};

// Known paths asked with the wrong method get 405 with Allow; anything else 404, as OpenAI words it.
void no_route(const httplib::Request& req, httplib::Response& res) {
    const bool model_path = req.path.rfind("/v1/models/", 0) == 0;
    for (const Route& r : kRoutes)
        if (req.path == r.path || (model_path && std::string(r.path) == "/v1/models")) {
            res.set_header("Allow", std::string(r.method) + (std::string(r.method) == "GET" ? ", HEAD" : ""));
            throw ApiError(
                405, "Method " + req.method + " is not allowed on " + req.path + " (use " + r.method + ")");
        }
    throw ApiError(404, "Invalid URL (" + req.method + " " + req.path + ")", "", "unknown_url");
}

// What the library answers by itself (a body over the limit, a malformed request line) as an OpenAI error.
ApiError library_error(int status, size_t max_body) {
    switch (status) {
        case 413:
            return ApiError(413, "request body larger than " + std::to_string(max_body) + " bytes");
        case 414:
            return ApiError(414, "request URI too long");
        case 404:
            return ApiError(404, "Invalid URL", "", "unknown_url");
        default:
            return ApiError(status, "malformed HTTP request");
    }
}

// Compares in time that depends on the length only, not on where the first difference lies.
bool same_secret(const std::string& a, const std::string& b) {
    if (a.size() != b.size()) return false;
    unsigned char diff = 0;
    for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
    return diff == 0;
}

json model_object(const ServedModel& m) {
    return {{"id", m.id}, {"object", "model"}, {"created", m.created}, {"owned_by", "markbase"}};
}

}  // namespace

RequestTrace& current_trace() {
    thread_local RequestTrace trace;
    return trace;
}

void respond_json(httplib::Response& res, int status, const json& body) {
    res.status = status;
    res.set_content(dump_json(body), "application/json");
}

void respond_error(httplib::Response& res, const ApiError& e) {
    if (e.status == 401) res.set_header("WWW-Authenticate", "Bearer");
    if (e.status == 503) res.set_header("Retry-After", "1");
    respond_json(res, e.status, error_body(e));
}

bool HttpServer::Impl::authorized(const httplib::Request& req) const {
    if (opt.api_key.empty()) return true;
    const std::string auth = req.get_header_value("Authorization");
    if (auth.size() < 7 || strncasecmp(auth.c_str(), "Bearer ", 7) != 0) return false;
    return same_secret(auth.substr(7), opt.api_key);
}

void HttpServer::Impl::install_routes() {
    // Every handler: the key first (but /health), then the route; whatever it throws becomes an error object.
    auto guard = [this](std::function<void(const httplib::Request&, httplib::Response&)> h,
                        bool keyed = true) {
        return [this, h, keyed](const httplib::Request& req, httplib::Response& res) {
            try {
                if (keyed && !authorized(req))
                    throw ApiError(401,
                                   "Incorrect or missing API key: send the header Authorization: Bearer KEY",
                                   "", "invalid_api_key");
                h(req, res);
            } catch (const ApiError& e) {
                respond_error(res, e);
            } catch (const std::bad_alloc&) {
                respond_error(res, ApiError(500, "out of memory"));
            } catch (const std::exception& e) {
                respond_error(res, ApiError(500, std::string("internal error: ") + e.what()));
            }
        };
    };
    http.Get("/health", guard(
                            [](const auto&, auto& res) {
                                respond_json(res, 200, {{"status", "ok"}});
                            },
                            false));
    http.Get("/v1/models", guard([this](const auto&, auto& res) {
                 respond_json(res, 200, {{"object", "list"}, {"data", json::array({model_object(model)})}});
             }));
    http.Get(R"(/v1/models/(.+))", guard([this](const httplib::Request& req, httplib::Response& res) {
                 if (req.matches[1] != model.id)
                     throw ApiError(404, "The model '" + std::string(req.matches[1]) + "' does not exist",
                                    "model", "model_not_found");
                 respond_json(res, 200, model_object(model));
             }));
    http.Get("/metrics", guard([this](const auto&, auto& res) {
                 res.set_content(prometheus_text(engine.metrics(), statuses.snapshot()),
                                 "text/plain; version=0.0.4");
             }));
    for (const ApiKind kind : {ApiKind::Chat, ApiKind::Completion}) {
        const char* path = kind == ApiKind::Chat ? "/v1/chat/completions" : "/v1/completions";
        // the body is read here, not by the library, so that a chunked body also stops at the limit
        http.Post(path, [this, kind, guard](const httplib::Request& req, httplib::Response& res,
                                            const httplib::ContentReader& reader) {
            std::string body;
            bool too_large = false;
            const bool ok = reader([&](const char* data, size_t n) {
                if (body.size() + n > opt.max_body_bytes) return !(too_large = true);
                body.append(data, n);
                return true;
            });
            guard([&](const httplib::Request&, httplib::Response&) {
                if (too_large || res.status == 413) throw library_error(413, opt.max_body_bytes);
                if (!ok) throw ApiError(400, "could not read the request body");
                generate(kind, body, req, res);
            })(req, res);
            if (too_large || !ok) res.set_header("Connection", "close");
        });
    }
    const httplib::Server::Handler fallback = guard(no_route);
    http.Get(".*", fallback).Post(".*", fallback).Put(".*", fallback).Patch(".*", fallback);
    http.Delete(".*", fallback).Options(".*", fallback);
}

HttpServer::HttpServer(Engine& engine, ServedModel model, ServerOptions options)
    : impl_(std::make_unique<Impl>(engine, std::move(model), std::move(options))) {
    Impl& s = *impl_;
    const EngineLimits& lim = engine.limits();
    const size_t threads = s.opt.http_threads > 0 ? size_t(s.opt.http_threads)
                                                  : size_t(lim.max_sequences) + size_t(lim.max_queue) + 8;
    s.http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    s.http.set_payload_max_length(s.opt.max_body_bytes);
    s.http.set_pre_routing_handler([](const httplib::Request&, httplib::Response&) {
        current_trace() = {};
        current_trace().start = std::chrono::steady_clock::now();
        return httplib::Server::HandlerResponse::Unhandled;
    });
    s.http.set_error_handler(
        httplib::Server::HandlerWithResponse([&s](const httplib::Request&, httplib::Response& res) {
            if (!res.body.empty())
                return httplib::Server::HandlerResponse::Unhandled;  // ours, already written
            respond_error(res, library_error(res.status, s.opt.max_body_bytes));
            return httplib::Server::HandlerResponse::Handled;
        }));
    s.http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
        respond_error(res, ApiError(500, "internal error"));
    });
    s.http.set_logger([&s](const httplib::Request& req, const httplib::Response& res) {
        RequestTrace& t = current_trace();
        t.log.method = req.method;
        t.log.path = req.path;
        t.log.status = res.status;
        if (t.start)
            t.log.elapsed_s =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - *t.start).count();
        s.statuses.add(res.status);
        if (s.opt.log) s.opt.log(format_request_log(t.log));
        t = {};
    });
    s.install_routes();
}

HttpServer::~HttpServer() {
    stop_accepting();
    wait();
}

int HttpServer::start() {
    Impl& s = *impl_;
    const int port = s.opt.port == 0 ? s.http.bind_to_any_port(s.opt.host)
                                     : (s.http.bind_to_port(s.opt.host, s.opt.port) ? s.opt.port : -1);
    if (port < 0)
        throw Error("serve: cannot listen on " + s.opt.host + ":" + std::to_string(s.opt.port) +
                    " (in use, or not an address of this machine)");
    if (!s.http.widen_backlog(SOMAXCONN)) throw Error("serve: cannot listen on the bound socket");
    s.thread = std::thread([&s] { s.http.listen_after_bind(); });
    while (!s.http.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return port;
}

void HttpServer::stop_accepting() {
    impl_->draining = true;
    impl_->http.stop();
}

void HttpServer::wait() {
    if (impl_->thread.joinable()) impl_->thread.join();
}

bool HttpServer::running() const {
    return impl_->http.is_running();
}

}  // namespace markbase::server
