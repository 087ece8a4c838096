// Where the transformers goldens live (tests/data/models, written by tools/make_goldens.py and
// tools/make_unified_goldens.py) and which checkpoints hold one: the CPU and CUDA golden tests share the
// list.
#pragma once

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

namespace markbase::testing {

inline std::filesystem::path golden_models_dir() {
    return std::filesystem::path(MARKBASE_TEST_DATA) / "models";
}

// The folders under golden_models_dir() with a golden.json, sorted.
inline std::vector<std::string> golden_models() {
    std::vector<std::string> out;
    if (std::filesystem::is_directory(golden_models_dir()))
        for (const auto& e : std::filesystem::directory_iterator(golden_models_dir()))
            if (std::filesystem::exists(e.path() / "golden.json"))
                out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
}

}  // namespace markbase::testing
