#include "loading/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "model/error.h"

namespace markbase {

namespace fs = std::filesystem;

namespace {

std::string kind_words(fs::file_type t) {
    switch (t) {
        case fs::file_type::directory:
            return "is a directory";
        case fs::file_type::fifo:
            return "is a FIFO (named pipe)";
        case fs::file_type::character:
            return "is a character device";
        case fs::file_type::block:
            return "is a block device";
        case fs::file_type::socket:
            return "is a socket";
        default:
            return "is of an unknown file type";
    }
}

std::string errno_words(int err) {
    if (err == ELOOP) return "is a symlink loop (too many levels of symbolic links)";
    return "cannot be looked at: " + std::error_code(err, std::generic_category()).message();
}

}  // namespace

std::string path_problem(const fs::path& p, bool want_dir) {
    std::error_code ec;
    const fs::file_status st = fs::status(p, ec);
    if (st.type() == fs::file_type::not_found) return "does not exist";
    if (ec) return errno_words(ec.value());
    if (want_dir) {
        if (st.type() == fs::file_type::directory) return "";
        if (st.type() == fs::file_type::regular) return "is a file, not a folder";
        return kind_words(st.type()) + ", not a folder";
    }
    if (st.type() == fs::file_type::regular) return "";
    if (st.type() == fs::file_type::directory) return "is a directory, not a regular file";
    return kind_words(st.type()) + ", not a regular file";
}

bool path_missing(const fs::path& p) {
    std::error_code ec;
    return fs::status(p, ec).type() == fs::file_type::not_found;
}

std::string read_regular_file(const fs::path& p, const std::string& missing_hint, uint64_t max_bytes) {
    const std::string name = p.string();
    if (std::string why = path_problem(p); !why.empty())
        throw Error(name + ": " + why + (why == "does not exist" ? missing_hint : ""));
    // O_NONBLOCK: should the path have been swapped for a FIFO since the check, the open does not block
    // (the fstat below then refuses it); on a regular file it changes nothing.
    const int fd = ::open(name.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        throw Error(name + ": cannot open: " + std::error_code(errno, std::generic_category()).message());
    struct FdCloser {
        int fd;
        ~FdCloser() { ::close(fd); }
    } closer{fd};
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) throw Error(name + ": not a regular file");
    if (uint64_t(st.st_size) > max_bytes)
        throw Error(name + ": is " + std::to_string(st.st_size) + " bytes, more than the " +
                    std::to_string(max_bytes) + "-byte limit for this file");
    std::string out(size_t(st.st_size), '\0');
    size_t got = 0;
    while (got < out.size()) {
        const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0)
            throw Error(name + ": read error: " + std::error_code(errno, std::generic_category()).message());
        if (n == 0) break;  // shrank while reading: what is there is what we parse
        got += size_t(n);
    }
    out.resize(got);
    return out;
}

}  // namespace markbase
