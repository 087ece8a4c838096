// Tokenizer speed: load time of tokenizer.json and single-thread encode/decode throughput. Called by
// `markbase tokenize --tokenizer PATH --bench FILE` (and later `markbase bench tokenizer`). The same text is
// timed through HF `tokenizers` by tools/make_tokenizer_goldens.py --bench, so the numbers compare on one
// machine.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

namespace markbase {

struct TokenizerBench {
    double load_ms_min = 0, load_ms_median = 0;  // over 3 loads
    std::size_t bytes = 0, tokens = 0;           // one pass over the text
    int passes = 0;                              // encode passes timed (at least min_seconds in all)
    double encode_mb_s = 0;                      // 1 MB = 1e6 bytes of input text
    double decode_mb_s = 0;                      // bytes of text produced per second by decode
};

// The benchmark text: a .jsonl file contributes its lines' "text" fields joined with "\n" (the tokenizer
// corpus), any other file its raw bytes.
std::string load_bench_text(const std::filesystem::path& file);

TokenizerBench bench_tokenizer(const std::filesystem::path& tokenizer, std::string_view text,
                               double min_seconds = 1.0);

std::string format_bench(const TokenizerBench& b);  // one human-readable line

}  // namespace markbase
