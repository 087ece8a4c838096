// Standalone tokenizer benchmark, built by tools/make_tokenizer_goldens.py --cxx-bench on a machine that has
// no CMake setup for MarkBase (only g++ and nlohmann/json.hpp), so that HF and MarkBase are timed side by
// side. Usage: markbase_tokenizer_bench TOKENIZER_JSON TEXT_FILE   (prints one JSON object)
#include <cstdio>
#include <exception>

#include "tokenizer/tokenizer_bench.h"

int main(int argc, char** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s TOKENIZER_JSON TEXT_FILE\n", argv[0]);
        return 2;
    }
    try {
        const std::string text = markbase::load_bench_text(argv[2]);
        const markbase::TokenizerBench b = markbase::bench_tokenizer(argv[1], text, 2.0);
        std::printf(
            "{\"load_ms_min\": %.2f, \"load_ms_median\": %.2f, \"bytes\": %zu, \"tokens\": %zu, \"passes\": "
            "%d, "
            "\"encode_mb_s\": %.3f, \"decode_mb_s\": %.3f}\n",
            b.load_ms_min, b.load_ms_median, b.bytes, b.tokens, b.passes, b.encode_mb_s, b.decode_mb_s);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
