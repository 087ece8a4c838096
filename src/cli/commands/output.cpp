#include "cli/commands/output.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <streambuf>
#include <string>

#include "model/error.h"

namespace markbase::cli {

namespace {

int g_write_errno = 0;  // the errno of the first write to fd 1 that failed; 0 while none has

// fopencookie's write: all of `size` bytes or, on an error, what was written before it (0 tells stdio the
// write failed); the error is kept.
ssize_t write_fd1(void*, const char* buf, size_t size) {
    size_t done = 0;
    while (done < size) {
        const ssize_t n = ::write(STDOUT_FILENO, buf + done, size - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            if (g_write_errno == 0) g_write_errno = n < 0 ? errno : EIO;
            break;
        }
        done += static_cast<size_t>(n);
    }
    return static_cast<ssize_t>(done);
}

// std::cout's buffer once stdout is replaced: it writes into the current `stdout`, so that text sent
// through either arrives in order and through the one recording stream.
class StdoutBuf : public std::streambuf {
  protected:
    int_type overflow(int_type c) override {
        if (traits_type::eq_int_type(c, traits_type::eof())) return traits_type::not_eof(c);
        return std::fputc(c, stdout) == EOF ? traits_type::eof() : c;
    }
    std::streamsize xsputn(const char* s, std::streamsize n) override {
        return static_cast<std::streamsize>(std::fwrite(s, 1, static_cast<size_t>(n), stdout));
    }
    int sync() override { return std::fflush(stdout) == 0 ? 0 : -1; }
};

}  // namespace

void install_checked_stdout() {
    cookie_io_functions_t io{};
    io.write = write_fd1;
    FILE* f = fopencookie(nullptr, "w", io);
    if (f == nullptr) return;  // the plain stdout: flush_stdout still sees its errors, maybe not their cause
    std::setvbuf(f, nullptr, isatty(STDOUT_FILENO) ? _IOLBF : _IOFBF, BUFSIZ);
    stdout = f;                                  // glibc's stdout is an assignable FILE*
    static StdoutBuf* cout_buf = new StdoutBuf;  // never destroyed: std::cout flushes after statics die
    std::cout.rdbuf(cout_buf);
}

void flush_stdout() {
    std::cout.flush();
    errno = 0;
    if (std::fflush(stdout) != 0 && g_write_errno == 0) g_write_errno = errno != 0 ? errno : EIO;
    if ((std::ferror(stdout) || !std::cout.good()) && g_write_errno == 0) g_write_errno = EIO;
    if (g_write_errno != 0)
        throw Error(std::string("writing standard output: ") + std::strerror(g_write_errno));
}

}  // namespace markbase::cli
