#include "loading/npy.h"

#include <cstring>
#include <fstream>

#include "model/error.h"

namespace markbase {

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
    std::ofstream f(path, std::ios::binary);
    if (!f) throw Error(path + ": cannot open for writing");
    const char magic[] = "\x93NUMPY\x01\x00";
    f.write(magic, 8);
    const uint16_t len = static_cast<uint16_t>(header.size());
    const char lenb[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
    f.write(lenb, 2);
    f.write(header.data(), static_cast<std::streamsize>(header.size()));
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * sizeof(float)));
    if (!f) throw Error(path + ": write failed (disk full?)");
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
