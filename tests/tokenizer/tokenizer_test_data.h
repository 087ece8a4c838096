// Shared fixtures for the tokenizer tests: the two real tokenizers (xz-compressed in tests/data/tokenizer,
// unpacked in memory with the xz tool once per test process) and small JSONL readers.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace markbase::test {

inline std::string tokenizer_data(const std::string& rel) {
    return std::string(MARKBASE_TEST_DATA) + "/tokenizer/" + rel;
}

inline std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot open " + path);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

inline std::string read_xz(const std::string& path) {
    if (!std::ifstream(path)) throw std::runtime_error("missing test fixture " + path);
    FILE* p = popen(("xz -dc '" + path + "'").c_str(), "r");
    if (!p) throw std::runtime_error("cannot run xz (install xz-utils: scripts/install-deps.sh)");
    std::string out;
    char buf[1 << 16];
    for (std::size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    if (pclose(p) != 0 || out.empty()) throw std::runtime_error("xz -dc failed on " + path);
    return out;
}

// Loaded once per process: the Gemma 4 file is 15 MB, Gemma 3's 33 MB.
inline const Tokenizer& gemma4() {
    static const Tokenizer tok =
        Tokenizer::from_json(read_xz(tokenizer_data("gemma4/tokenizer.json.xz")), "gemma4/tokenizer.json");
    return tok;
}
inline const Tokenizer& gemma3() {
    static const Tokenizer tok =
        Tokenizer::from_json(read_xz(tokenizer_data("gemma3/tokenizer.json.xz")), "gemma3/tokenizer.json");
    return tok;
}

// One JSON value per line; lines are split on '\n' only (texts may hold raw U+2028).
inline std::vector<nlohmann::json> read_jsonl(const std::string& path) {
    std::vector<nlohmann::json> rows;
    std::istringstream in(read_file(path));
    std::string line;
    while (std::getline(in, line))
        if (line.find_first_not_of(" \t\r") != std::string::npos) rows.push_back(nlohmann::json::parse(line));
    return rows;
}

inline std::string ids_str(const std::vector<int>& ids) {
    std::string s;
    for (std::size_t i = 0; i < ids.size(); ++i) {
        if (i) s += ' ';
        s += std::to_string(ids[i]);
    }
    return s;
}

}  // namespace markbase::test
