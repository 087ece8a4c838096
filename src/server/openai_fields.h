// Reading one JSON object's fields with the check each needs. Every failure is an ApiError 400 naming the
// field as the client wrote it ("messages[1].content[0].text"), what was expected and what was found:
//   temperature: expected a number in [0, 2], found 3.5
//   stop: expected a string or an array of at most 4 strings, found an array of 5 elements
// An absent field and a null one are the same: the reader returns nothing and the default applies.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace markbase::server {

// What an error message shows of a value: its kind and a short excerpt ('a string "hot"', "3.5",
// "an object", "an array of 5 elements", "null", "true").
std::string describe_json(const nlohmann::json& v);

// Throws ApiError 400: "<param>: expected <expected>, found <describe_json(found)>".
[[noreturn]] void bad_field(const std::string& param, const std::string& expected,
                            const nlohmann::json& found);

class FieldReader {
  public:
    // obj must be a JSON object; prefix names it in messages ("messages[0]"), empty at the top level.
    FieldReader(const nlohmann::json& obj, std::string prefix = "");

    std::string param(const std::string& name) const;  // "messages[0].role", or "role" at the top level
    const nlohmann::json* get(const std::string& name) const;  // nullptr when absent or null

    std::optional<bool> boolean(const std::string& name) const;
    std::optional<std::string> string(const std::string& name) const;
    // An integer in [lo, hi]; a fraction (2.5) or a number past int64 is refused as well.
    std::optional<int64_t> integer(const std::string& name, int64_t lo, int64_t hi) const;
    // A finite number in [lo, hi] (lo excluded when lo_open).
    std::optional<double> number(const std::string& name, double lo, double hi, bool lo_open = false) const;

  private:
    const nlohmann::json& obj_;
    std::string prefix_;
};

}  // namespace markbase::server
