// UTF-8 helpers shared by the tokenizer, its decoder and the chat formatter.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace markbase::tok {

// Length in bytes of the UTF-8 sequence that starts with `lead` (1 for a stray continuation byte, so that
// callers that only walk already-validated text never stall).
inline std::size_t utf8_len(unsigned char lead) {
    if (lead < 0x80) return 1;
    if ((lead & 0xE0) == 0xC0) return 2;
    if ((lead & 0xF0) == 0xE0) return 3;
    if ((lead & 0xF8) == 0xF0) return 4;
    return 1;
}

// Strict validation (no overlong forms, no surrogates, nothing past U+10FFFF): the same set of strings a Rust
// `String` or a Python `str` can hold, so anything we accept is something HF `tokenizers` could have been
// given. Returns the byte offset of the first bad byte, or npos when `s` is valid.
std::size_t find_invalid_utf8(std::string_view s);

// Decodes the code point at s[i] (s must be valid UTF-8) and advances i past it.
char32_t next_code_point(std::string_view s, std::size_t& i);

void append_utf8(std::string& out, char32_t cp);

// Python's str.isspace() for one code point; Jinja's `trim` filter is Python's str.strip(), which uses it.
bool python_isspace(char32_t cp);

// Python's str.strip() with no argument, on valid UTF-8.
std::string_view python_strip(std::string_view s);

}  // namespace markbase::tok
