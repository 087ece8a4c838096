// NumPy .npy files (version 1.0, little-endian float32, C order): `markbase logits` writes them, the golden
// tests read transformers' logits from them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace markbase {

struct NpyArray {
    std::vector<int64_t> shape;
    std::vector<float> data;
};

// Replaces `path` whole or not at all: the bytes go to a temporary file beside it, synced, then renamed over
// it; on any failure (a full disk, a file-size limit) the temporary is removed, `path` keeps what it held and
// the markbase::Error names the cause.
void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape);
NpyArray read_npy_f32(const std::string& path);  // throws markbase::Error on anything but '<f4' C-order

}  // namespace markbase
