#include "loading/npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "model/error.h"

namespace markbase {

namespace {

// A file written beside `path` under a temporary name and renamed over it once all of it is on disk: a write
// that fails part way (a full disk, a file-size limit) removes the temporary and leaves `path` as it was.
class ReplacingFile {
  public:
    explicit ReplacingFile(const std::string& path) : path_(path) {
        namespace fs = std::filesystem;
        std::error_code ec;
        fs::path target(path);
        if (fs::is_symlink(target, ec)) target = fs::weakly_canonical(target, ec);  // replace what it names
        target_ = target.string();
        struct stat st {};
        existed_ = ::stat(target_.c_str(), &st) == 0;
        mode_ = existed_ ? (st.st_mode & 07777) : default_mode();
        tmp_ = (target.parent_path() / ("." + target.filename().string() + ".XXXXXX")).string();
        fd_ = ::mkstemp(tmp_.data());
        if (fd_ < 0) fail("cannot create a temporary file beside it");
    }
    ReplacingFile(const ReplacingFile&) = delete;
    ReplacingFile& operator=(const ReplacingFile&) = delete;
    ~ReplacingFile() {
        if (fd_ >= 0) ::close(fd_);
        if (!tmp_written_over_) ::unlink(tmp_.c_str());
    }

    void write(const void* p, size_t n) {
        const char* b = static_cast<const char*>(p);
        while (n > 0) {
            const ssize_t w = ::write(fd_, b, n);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) fail("write failed");
            b += w;
            n -= static_cast<size_t>(w);
        }
    }

    void commit() {
        if (::fchmod(fd_, mode_) != 0) fail("cannot set the file mode");
        if (::fsync(fd_) != 0) fail("write failed");
        const int fd = fd_;
        fd_ = -1;
        if (::close(fd) != 0) fail("write failed");
        if (::rename(tmp_.c_str(), target_.c_str()) != 0) fail("cannot replace it");
        tmp_written_over_ = true;
        // the rename itself reaches the disk with the folder's own sync (best effort: some file systems
        // refuse)
        const std::string dir = std::filesystem::path(target_).parent_path().string();
        const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
        if (dfd >= 0) {
            ::fsync(dfd);
            ::close(dfd);
        }
    }

  private:
    static mode_t default_mode() {  // what open(O_CREAT, 0666) would give
        const mode_t mask = ::umask(0);
        ::umask(mask);
        return 0666 & ~mask;
    }
    [[noreturn]] void fail(const char* what) const {
        const int err = errno;
        throw Error(path_ + ": " + what + ": " + std::strerror(err) +
                    (existed_ ? " (the file was not changed)" : ""));
    }

    std::string path_, target_, tmp_;
    mode_t mode_ = 0;
    int fd_ = -1;
    bool existed_ = false;
    bool tmp_written_over_ = false;
};

}  // namespace

void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
    std::string dims;
    int64_t n = 1;
    for (size_t i = 0; i < shape.size(); ++i) {
        dims += std::to_string(shape[i]) + (shape.size() == 1 ? "," : (i + 1 < shape.size() ? ", " : ""));
        n *= shape[i];
    }
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
    // magic(6) + version(2) + len(2) + header + '\n' must be a multiple of 64
    const size_t unpadded = 10 + header.size() + 1;
    header.append((64 - unpadded % 64) % 64, ' ');
    header += '\n';
    const uint16_t len = static_cast<uint16_t>(header.size());
    std::string prefix("\x93NUMPY\x01\x00", 8);
    prefix += static_cast<char>(len & 0xff);
    prefix += static_cast<char>(len >> 8);
    prefix += header;
    ReplacingFile f(path);
    f.write(prefix.data(), prefix.size());
    f.write(data, static_cast<size_t>(n) * sizeof(float));
    f.commit();
}

NpyArray read_npy_f32(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(path + ": cannot open");
    char pre[10];
    if (!f.read(pre, 10) || std::memcmp(pre, "\x93NUMPY", 6) != 0) throw Error(path + ": not a .npy file");
    size_t hlen = static_cast<unsigned char>(pre[8]) | (static_cast<unsigned char>(pre[9]) << 8);
    if (pre[6] != 1) {  // versions 2/3 use a 4-byte length
        char more[2];
        if (!f.read(more, 2)) throw Error(path + ": truncated header");
        hlen |= (static_cast<size_t>(static_cast<unsigned char>(more[0])) << 16) |
                (static_cast<size_t>(static_cast<unsigned char>(more[1])) << 24);
    }
    std::string header(hlen, '\0');
    if (!f.read(header.data(), static_cast<std::streamsize>(hlen))) throw Error(path + ": truncated header");
    if (header.find("'descr': '<f4'") == std::string::npos)
        throw Error(path + ": expected little-endian float32 ('<f4'), header is " + header);
    if (header.find("'fortran_order': False") == std::string::npos) throw Error(path + ": expected C order");
    // shape: the integers between "'shape': (" and ")"
    const size_t sp = header.find("'shape': (");
    const size_t se = sp == std::string::npos ? sp : header.find(')', sp);
    if (se == std::string::npos) throw Error(path + ": no shape in header");
    NpyArray a;
    int64_t n = 1, cur = -1;
    for (size_t i = sp + 10; i <= se; ++i) {
        const char ch = header[i];
        if (ch >= '0' && ch <= '9') {
            cur = (cur < 0 ? 0 : cur * 10) + (ch - '0');
        } else if (cur >= 0) {
            a.shape.push_back(cur);
            n *= cur;
            cur = -1;
        }
    }
    a.data.resize(static_cast<size_t>(n));
    if (!f.read(reinterpret_cast<char*>(a.data.data()), static_cast<std::streamsize>(n * sizeof(float))))
        throw Error(path + ": data shorter than its shape says");
    return a;
}

}  // namespace markbase
