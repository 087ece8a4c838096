#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <ctime>

#include "server/http_server.h"

namespace markbase::server {

namespace {

sigset_t stop_signals() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    return set;
}

}  // namespace

void block_stop_signals() {
    const sigset_t set = stop_signals();
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is a failed write, not the end of the server
}

int serve_until_signal(HttpServer& server, Engine& engine) {
    const sigset_t set = stop_signals();
    const timespec poll{0, 200 * 1000 * 1000};
    while (server.running()) {
        const int sig = sigtimedwait(&set, nullptr, &poll);
        if (sig == SIGINT || sig == SIGTERM) {
            std::fprintf(stderr, "serve: %s: stopping (in-flight requests end with an error)\n",
                         sig == SIGINT ? "SIGINT" : "SIGTERM");
            break;
        }
    }
    server.stop_accepting();
    engine.shutdown();
    server.wait();
    std::fprintf(stderr, "serve: stopped\n");
    return 0;
}

}  // namespace markbase::server
