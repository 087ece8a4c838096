#include "tokenizer/tokenizer_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <vector>

#include "model/error.h"
#include "tokenizer/tokenizer.h"

namespace markbase {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

std::string load_bench_text(const std::filesystem::path& file) {
    std::ifstream in(file, std::ios::binary);
    if (!in) throw Error(file.string() + ": cannot open the benchmark text");
    std::ostringstream ss;
    ss << in.rdbuf();
    if (file.extension() != ".jsonl") return ss.str();
    std::string text, line;
    std::istringstream lines(ss.str());
    bool first = true;
    for (int n = 1; std::getline(lines, line); ++n) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(line);
        } catch (const nlohmann::json::exception& e) {
            throw Error(file.string() + ":" + std::to_string(n) + ": not a JSON line: " + e.what());
        }
        if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
            throw Error(file.string() + ":" + std::to_string(n) +
                        ": expected an object with a \"text\" string");
        if (!first) text += '\n';
        text += j["text"].get<std::string>();
        first = false;
    }
    return text;
}

TokenizerBench bench_tokenizer(const std::filesystem::path& path, std::string_view text, double min_seconds) {
    TokenizerBench b;
    std::vector<double> loads;
    std::optional<Tokenizer> tok;
    for (int i = 0; i < 3; ++i) {
        const auto t0 = Clock::now();
        tok.emplace(Tokenizer::load(path));
        loads.push_back(seconds_since(t0) * 1e3);
    }
    std::sort(loads.begin(), loads.end());
    b.load_ms_min = loads.front();
    b.load_ms_median = loads[1];

    b.bytes = text.size();
    std::vector<int> ids = tok->encode(text);  // warm-up, and the token count
    b.tokens = ids.size();
    double spent = 0;
    const auto t0 = Clock::now();
    do {
        ids = tok->encode(text);
        ++b.passes;
        spent = seconds_since(t0);
    } while (spent < min_seconds);
    b.encode_mb_s = static_cast<double>(b.bytes) * b.passes / spent / 1e6;

    std::size_t out_bytes = 0;
    int decode_passes = 0;
    const auto t1 = Clock::now();
    do {
        out_bytes += tok->decode(ids).size();
        ++decode_passes;
        spent = seconds_since(t1);
    } while (spent < min_seconds / 2);
    b.decode_mb_s = static_cast<double>(out_bytes) / spent / 1e6;
    return b;
}

std::string format_bench(const TokenizerBench& b) {
    char line[256];
    std::snprintf(
        line, sizeof line,
        "load %.1f ms (min of 3; median %.1f ms) | encode %.2f MB/s (%zu bytes -> %zu tokens, %d passes) | "
        "decode %.2f MB/s",
        b.load_ms_min, b.load_ms_median, b.encode_mb_s, b.bytes, b.tokens, b.passes, b.decode_mb_s);
    return line;
}

}  // namespace markbase
