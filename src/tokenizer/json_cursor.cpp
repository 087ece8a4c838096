#include "tokenizer/json_cursor.h"

#include <algorithm>

#include "model/error.h"
#include "tokenizer/utf8.h"

namespace markbase::tok {

JsonCursor::JsonCursor(std::string_view text, std::string origin) : text_(text), origin_(std::move(origin)) {}

void JsonCursor::fail(const std::string& what) const {
    const std::size_t at = std::min(pos_, text_.size());
    const std::size_t line =
        1 + static_cast<std::size_t>(std::count(text_.begin(), text_.begin() + at, '\n'));
    const std::size_t line_start = text_.rfind('\n', at == 0 ? 0 : at - 1);
    const std::size_t col = at - (line_start == std::string_view::npos ? 0 : line_start + 1) + 1;
    throw Error(origin_ + ": invalid JSON at line " + std::to_string(line) + ", column " +
                std::to_string(col) + ": " + what);
}

void JsonCursor::skip_ws() {
    while (pos_ < text_.size()) {
        const char c = text_[pos_];
        if (c != ' ' && c != '\n' && c != '\r' && c != '\t') break;
        ++pos_;
    }
}

char JsonCursor::peek() {
    skip_ws();
    return pos_ < text_.size() ? text_[pos_] : '\0';
}

void JsonCursor::expect(char c) {
    if (peek() != c) {
        if (pos_ >= text_.size()) fail(std::string("expected '") + c + "' but the file ends");
        fail(std::string("expected '") + c + "', found '" + text_[pos_] + "'");
    }
    ++pos_;
}

bool JsonCursor::consume(char c) {
    if (peek() != c) return false;
    ++pos_;
    return true;
}

void JsonCursor::expect_end() {
    if (peek() != '\0' || pos_ < text_.size()) fail("unexpected text after the top-level value");
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

std::string_view JsonCursor::read_string(std::string& scratch) {
    expect('"');
    const std::size_t start = pos_;
    // Fast path: no escapes. Raw UTF-8 was validated for the whole file up front by the caller.
    while (pos_ < text_.size()) {
        const auto c = static_cast<unsigned char>(text_[pos_]);
        if (c == '"') return text_.substr(start, pos_++ - start);
        if (c == '\\') break;
        if (c < 0x20) fail("control character inside a string");
        ++pos_;
    }
    scratch.assign(text_.substr(start, pos_ - start));
    return read_escaped_rest(scratch);
}

// The rest of a string from its first escape on, unescaped onto `scratch`.
std::string_view JsonCursor::read_escaped_rest(std::string& scratch) {
    while (true) {
        if (pos_ >= text_.size()) fail("unterminated string");
        const auto c = static_cast<unsigned char>(text_[pos_]);
        if (c == '"') {
            ++pos_;
            return scratch;
        }
        if (c < 0x20) fail("control character inside a string");
        if (c != '\\') {
            scratch.push_back(static_cast<char>(c));
            ++pos_;
            continue;
        }
        if (pos_ + 1 >= text_.size()) fail("unterminated escape");
        const char e = text_[pos_ + 1];
        pos_ += 2;
        read_escape(e, scratch);
    }
}

// Appends what the escape \e stands for; pos_ is past the 'e'.
void JsonCursor::read_escape(char e, std::string& scratch) {
    switch (e) {
        case '"':
            scratch.push_back('"');
            break;
        case '\\':
            scratch.push_back('\\');
            break;
        case '/':
            scratch.push_back('/');
            break;
        case 'b':
            scratch.push_back('\b');
            break;
        case 'f':
            scratch.push_back('\f');
            break;
        case 'n':
            scratch.push_back('\n');
            break;
        case 'r':
            scratch.push_back('\r');
            break;
        case 't':
            scratch.push_back('\t');
            break;
        case 'u':
            append_utf8(scratch, read_unicode_escape());
            break;
        default:
            fail(std::string("invalid escape '\\") + e + "'");
    }
}

// The code point of a \u escape (pos_ past the 'u'), joining a surrogate pair written as two escapes.
char32_t JsonCursor::read_unicode_escape() {
    char32_t cp = read_hex4();
    if (cp >= 0xDC00 && cp <= 0xDFFF) fail("lone low surrogate in \\u escape");
    if (cp >= 0xD800 && cp <= 0xDBFF) {
        if (pos_ + 2 > text_.size() || text_[pos_] != '\\' || text_[pos_ + 1] != 'u')
            fail("high surrogate not followed by a low surrogate");
        pos_ += 2;
        const char32_t low = read_hex4();
        if (low < 0xDC00 || low > 0xDFFF) fail("high surrogate not followed by a low surrogate");
        cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
    }
    return cp;
}

char32_t JsonCursor::read_hex4() {
    if (pos_ + 4 > text_.size()) fail("truncated \\u escape");
    char32_t v = 0;
    for (int k = 0; k < 4; ++k) {
        const int h = hex_value(text_[pos_ + k]);
        if (h < 0) fail("bad hex digit in \\u escape");
        v = (v << 4) | static_cast<char32_t>(h);
    }
    pos_ += 4;
    return v;
}

int64_t JsonCursor::read_integer() {
    skip_ws();
    const std::size_t start = pos_;
    bool negative = false;
    if (pos_ < text_.size() && text_[pos_] == '-') {
        negative = true;
        ++pos_;
    }
    int64_t v = 0;
    std::size_t digits = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
        if (v > (int64_t{1} << 53)) fail("integer too large");
        v = v * 10 + (text_[pos_] - '0');
        ++pos_;
        ++digits;
    }
    if (digits == 0) {
        pos_ = start;
        fail("expected an integer");
    }
    if (pos_ < text_.size() && (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E')) {
        pos_ = start;
        fail("expected an integer, found a fractional number");
    }
    return negative ? -v : v;
}

void JsonCursor::skip_string() {
    ++pos_;  // opening quote
    while (pos_ < text_.size()) {
        const auto c = static_cast<unsigned char>(text_[pos_]);
        if (c == '"') {
            ++pos_;
            return;
        }
        if (c < 0x20) fail("control character inside a string");
        pos_ += (c == '\\') ? 2 : 1;
    }
    fail("unterminated string");
}

std::string_view JsonCursor::skip_value() {
    // Iterative so that a hostile file with deep nesting cannot overflow the stack; the skipped text is
    // re-parsed by nlohmann (small sections) or ignored, so only the structure needs to be right here.
    const char first = peek();
    const std::size_t start = pos_;
    std::string stack;
    bool expect_value = true;
    while (true) {
        const char c = peek();
        if (c == '\0') fail("the file ends inside a value");
        if (expect_value) {
            if (c == '{' || c == '[') {
                stack.push_back(c == '{' ? '}' : ']');
                ++pos_;
                if (peek() == stack.back()) {
                    ++pos_;
                    stack.pop_back();
                } else {
                    if (c == '{') {
                        if (peek() != '"') fail("expected a key");
                        skip_string();
                        expect(':');
                    }
                    continue;
                }
            } else if (c == '"') {
                skip_string();
            } else if (c == '-' || (c >= '0' && c <= '9')) {
                while (pos_ < text_.size() &&
                       std::string_view("+-.eE0123456789").find(text_[pos_]) != std::string_view::npos)
                    ++pos_;
            } else if (text_.substr(pos_, 4) == "true" || text_.substr(pos_, 4) == "null") {
                pos_ += 4;
            } else if (text_.substr(pos_, 5) == "false") {
                pos_ += 5;
            } else {
                fail(std::string("unexpected character '") + c + "'");
            }
        }
        // After a value: close containers or move to the next element.
        expect_value = false;
        if (stack.empty()) break;
        const char d = peek();
        if (d == ',') {
            ++pos_;
            if (stack.back() == '}') {
                if (peek() != '"') fail("expected a key");
                skip_string();
                expect(':');
            }
            expect_value = true;
        } else if (d == stack.back()) {
            ++pos_;
            stack.pop_back();
        } else {
            fail(std::string("expected ',' or '") + stack.back() + "'");
        }
    }
    (void)first;
    return text_.substr(start, pos_ - start);
}

}  // namespace markbase::tok
