// A strict, allocation-light JSON reader for the two huge tables of tokenizer.json (model.vocab: 262k
// entries, model.merges: 515k pairs). A full nlohmann DOM of the Gemma file costs ~330 ms and ~1.5 M
// allocations; walking the text with this cursor and handing only the small sections to nlohmann keeps load
// time to tens of ms.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace markbase::tok {

class JsonCursor {
  public:
    // `text` must outlive the cursor. `origin` names the file in error messages.
    JsonCursor(std::string_view text, std::string origin);

    char peek();           // next non-whitespace character ('\0' at the end)
    void expect(char c);   // consumes c or throws
    bool consume(char c);  // consumes c if it is next
    void expect_end();     // only whitespace may remain

    // Reads a string. The view points into the text when the string has no escapes, else into `scratch`.
    std::string_view read_string(std::string& scratch);
    int64_t read_integer();         // an integer literal (no fraction or exponent)
    std::string_view skip_value();  // skips any value (structure checked); returns its raw text

    [[noreturn]] void fail(const std::string& what) const;  // markbase::Error naming file, line and column
    std::size_t offset() const { return pos_; }

  private:
    void skip_ws();
    void skip_string();
    // read_string's slow path, for strings with escapes.
    std::string_view read_escaped_rest(std::string& scratch);
    void read_escape(char e, std::string& scratch);
    char32_t read_unicode_escape();
    char32_t read_hex4();
    std::string_view text_;
    std::string origin_;
    std::size_t pos_ = 0;
};

}  // namespace markbase::tok
