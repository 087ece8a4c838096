// ClientWatch: whether the client of a request being handled has closed its connection.
//
// cpp-httplib 0.11.4 (Debian 12's) gives a handler no handle on its connection (later versions added
// Request::is_connection_closed), and a non-streaming request writes nothing until its reply is complete, so
// no failed write tells it either. But the connection's socket is open in this process while its handler
// runs, and the request carries both of its ends' addresses: the socket whose local and peer addresses are
// those is found once, among this process's open descriptors, and then peeked at without blocking.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include "server/http_server_impl.h"

namespace markbase::server {

namespace {

// Whether `a` is the address `addr` (as the library spells it: numeric, IPv4-mapped IPv6 as ::ffff:a.b.c.d)
// with port `port`; a port < 0 (not given) matches any address.
bool same_end(const sockaddr_storage& a, const std::string& addr, int port) {
    if (port < 0) return true;
    char text[INET6_ADDRSTRLEN] = {};
    int p = -1;
    if (a.ss_family == AF_INET) {
        const auto* s = reinterpret_cast<const sockaddr_in*>(&a);
        inet_ntop(AF_INET, &s->sin_addr, text, sizeof text);
        p = ntohs(s->sin_port);
    } else if (a.ss_family == AF_INET6) {
        const auto* s = reinterpret_cast<const sockaddr_in6*>(&a);
        inet_ntop(AF_INET6, &s->sin6_addr, text, sizeof text);
        p = ntohs(s->sin6_port);
    } else {
        return false;
    }
    return p == port && addr == text;
}

// The descriptor of the connected socket with these ends, or -1.
int find_connection(const httplib::Request& req) {
    DIR* dir = opendir("/proc/self/fd");
    if (dir == nullptr) return -1;
    int found = -1;
    while (const dirent* e = readdir(dir)) {
        char* end = nullptr;
        const long fd = std::strtol(e->d_name, &end, 10);
        if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
        struct stat st {};
        if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
        sockaddr_storage peer{}, local{};
        socklen_t n = sizeof peer;
        if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &n) != 0) continue;
        n = sizeof local;
        if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &n) != 0) continue;
        if (same_end(peer, req.remote_addr, req.remote_port) &&
            same_end(local, req.local_addr, req.local_port)) {
            found = static_cast<int>(fd);
            break;
        }
    }
    closedir(dir);
    return found;
}

}  // namespace

ClientWatch::ClientWatch(const httplib::Request& req)
    : fd_(req.remote_port >= 0 ? find_connection(req) : -1) {}

bool ClientWatch::gone() const {
    if (fd_ < 0) return false;  // not found: the request runs to its end, as before
    char c = 0;
    const ssize_t n = recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return true;                                                    // the client's end is closed
    return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;  // reset
}

}  // namespace markbase::server
