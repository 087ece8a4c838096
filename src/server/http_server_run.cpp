#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <thread>

#include "server/http_server.h"

namespace markbase::server {

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void on_stop_signal(int sig) {
    if (g_stop_signal) _exit(1);  // a second signal while stopping: give up waiting
    g_stop_signal = sig;
}

}  // namespace

void install_stop_handlers() {
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is a failed write, not the end of the server
}

int serve_until_signal(HttpServer& server, Engine& engine) {
    while (server.running() && !g_stop_signal) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (g_stop_signal)
        std::fprintf(stderr, "serve: %s: stopping (in-flight requests end with an error)\n",
                     g_stop_signal == SIGINT ? "SIGINT" : "SIGTERM");
    server.stop_accepting();
    engine.shutdown();
    server.wait();
    std::fprintf(stderr, "serve: stopped\n");
    return 0;
}

}  // namespace markbase::server
