// An in-process markbase serve HTTP layer over the fake engine on an ephemeral port, with a client, the
// parsing of server-sent events and a raw socket for clients that hang up. Built with cpp-httplib only.
#pragma once

#ifdef MARKBASE_HAS_HTTP

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands/model_options.h"
#include "server/fake_engine.h"
#include "server/http_server.h"

namespace markbase::testing {

class HttpServerTest : public ::testing::Test {
  protected:
    void start(FakeEngineOptions fo = {}, server::ServerOptions so = {}) {
        static const Tokenizer tok = Tokenizer::load(cli::default_model_dir());
        engine_ = std::make_unique<FakeEngine>(fo);
        so.host = "127.0.0.1";
        so.port = 0;
        so.log = [this](const std::string& line) {
            std::lock_guard<std::mutex> lock(log_mu_);
            log_.push_back(line);
        };
        server_ = std::make_unique<server::HttpServer>(
            *engine_, server::ServedModel{"test-model", 1700000000, tok, SamplingParams{}, {1}}, so);
        port_ = server_->start();
    }
    // What serve does on SIGTERM: stop accepting, end the engine's requests, wait for every HTTP thread.
    void stop() {
        if (!server_) return;
        server_->stop_accepting();
        engine_->shutdown();
        server_->wait();
        server_.reset();
    }
    void TearDown() override { stop(); }

    httplib::Client client() const {
        httplib::Client c("127.0.0.1", port_);
        c.set_read_timeout(20, 0);
        return c;
    }
    httplib::Result post(const std::string& path, const std::string& body,
                         const httplib::Headers& h = {}) const {
        return client().Post(path.c_str(), h, body, "application/json");
    }
    httplib::Result post(const std::string& path, const nlohmann::json& body,
                         const httplib::Headers& h = {}) const {
        return post(path, body.dump(), h);
    }
    std::vector<std::string> log() {
        std::lock_guard<std::mutex> lock(log_mu_);
        return log_;
    }

    std::unique_ptr<FakeEngine> engine_;
    std::unique_ptr<server::HttpServer> server_;
    int port_ = 0;
    std::mutex log_mu_;
    std::vector<std::string> log_;
};

// The "data: ..." payloads of an SSE body, in order ("[DONE]" included as is).
inline std::vector<std::string> sse_data(const std::string& body) {
    std::vector<std::string> out;
    size_t pos = 0;
    while (pos < body.size()) {
        const size_t end = body.find("\n\n", pos);
        if (end == std::string::npos) break;
        const std::string ev = body.substr(pos, end - pos);
        if (ev.rfind("data: ", 0) == 0) out.push_back(ev.substr(6));
        pos = end + 2;
    }
    return out;
}

// A bare TCP connection to the server: sends `request` as is, reads until `marker` shows up (or `timeout`).
class RawClient {
  public:
    explicit RawClient(int port) : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(static_cast<uint16_t>(port));
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
        timeval tv{0, 100000};
        setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    }
    ~RawClient() { close(); }
    bool connected() const { return connected_; }
    bool send_all(const std::string& s) {
        size_t off = 0;
        while (off < s.size()) {
            const ssize_t n = ::send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
            if (n <= 0) return false;
            off += size_t(n);
        }
        return true;
    }
    bool read_until(const std::string& marker, std::chrono::milliseconds timeout) {
        const auto end = std::chrono::steady_clock::now() + timeout;
        char buf[4096];
        while (received_.find(marker) == std::string::npos) {
            if (std::chrono::steady_clock::now() > end) return false;
            const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
            if (n == 0) return received_.find(marker) != std::string::npos;
            if (n > 0) received_.append(buf, size_t(n));
        }
        return true;
    }
    void close() {
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
    }
    const std::string& received() const { return received_; }

  private:
    int fd_;
    bool connected_ = false;
    std::string received_;
};

inline std::string http_post(const std::string& path, const std::string& body) {
    return "POST " + path +
           " HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body;
}

// Polls `done` until it holds or `timeout` passes.
template <class F>
bool eventually(F done, std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (!done()) {
        if (std::chrono::steady_clock::now() > end) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
}

}  // namespace markbase::testing

#endif  // MARKBASE_HAS_HTTP
