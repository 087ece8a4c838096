// Tiny Gemma 4 configs of each family for tests that need a model but no reference outputs, written as random
// checkpoints into a temporary folder that is removed when the fixture dies.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

namespace markbase::testing {

// family: "e2b", "e4b", "26b-a4b", "31b" at tiny widths (hidden 64, head dims 16/32, vocab 256, window 4);
// layers: 10 (E2B) or 12 where 0.
nlohmann::json tiny_config(const std::string& family, int layers = 0);

// The same with every projection's K a multiple of 128 (int4's group): hidden 128, head dims 32/64, MLP and
// expert widths 128.
nlohmann::json tiny_int4_config(const std::string& family, int layers = 0);

// A gtest parameter name: s with every character but letters and digits as '_' ("26b-a4b" -> "26b_a4b").
std::string test_name(std::string s);

class TempDir {
  public:
    explicit TempDir(const std::string& tag);
    ~TempDir();
    const std::filesystem::path& path() const { return path_; }

  private:
    std::filesystem::path path_;
};

}  // namespace markbase::testing
