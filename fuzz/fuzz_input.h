// What the harnesses share: the fuzzer's bytes as text, and a private folder in which file-based parsers find
// them under the name they expect.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace markbase::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
    return {reinterpret_cast<const char*>(data), size};
}

// A folder of this process's own (on /dev/shm where it exists: one file write per input).
inline const std::filesystem::path& scratch_dir() {
    static const std::filesystem::path dir = [] {
        const std::filesystem::path base =
            std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
        std::filesystem::path d = base / ("markbase-fuzz-" + std::to_string(getpid()));
        std::filesystem::create_directories(d);
        return d;
    }();
    return dir;
}

// Writes the input to scratch_dir()/name and returns its path.
inline std::filesystem::path write_input(const std::string& name, const uint8_t* data, size_t size) {
    const std::filesystem::path p = scratch_dir() / name;
    std::ofstream(p, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data),
                                                                static_cast<std::streamsize>(size));
    return p;
}

}  // namespace markbase::fuzz
