// JSON from untrusted files (config.json, safetensors headers, the shard index, generation_config.json,
// tokenizer.json): parsing that names the file and the field in every error and refuses absurd nesting, and
// excerpts of values for error messages that stay short and never recurse (nlohmann's dump() recurses once
// per nesting level, so quoting a value nested 100,000 deep overflowed the stack).
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace markbase {

// Deeper than any real config or header (they nest 4 levels at most); deeper input is refused while parsing,
// so nothing downstream (recursive section parsers, error paths) ever sees more.
constexpr int kMaxJsonDepth = 512;

// The value as an error message should quote it, at most ~80 characters, built without recursion:
//   42, "big", {"a":[1,2]}, "xxxxxxxx...", an array nested 100000 deep: [[[[[[[[...
std::string json_excerpt(const nlohmann::json& v);

// A string from the file (a key, a tensor name) quoted in a message: at most `max` bytes, control bytes
// escaped.
std::string text_excerpt(std::string_view s, size_t max = 160);

// Called for every parse event (nlohmann's callback arguments), e.g. to see duplicate keys.
using JsonEventHook =
    std::function<void(int depth, nlohmann::json::parse_event_t event, const nlohmann::json&)>;

// Parses one JSON document. Any problem throws markbase::Error
//   "<file>: [<what> is ]not valid JSON at '<field>': <reason>"  (syntax, a number out of range such as
//   1e999)
//   "<file>: field '<field>' nests more than 512 levels deep ..."
// where <field> is the path of keys and indices being read ("text_config.rope_parameters", "w[0]"), prefixed
// by `section` when the text is one section of the file ("normalizer").
nlohmann::json parse_json(std::string_view text, const std::string& file, const std::string& what = "",
                          const std::string& section = "", const JsonEventHook& hook = {});

}  // namespace markbase
