#include "server/openai_fields.h"

#include <cmath>
#include <limits>
#include <sstream>

#include "loading/json_excerpt.h"
#include "server/openai_error.h"

namespace markbase::server {

using nlohmann::json;

std::string describe_json(const json& v) {
    switch (v.type()) {
        case json::value_t::null:
            return "null";
        case json::value_t::boolean:
            return v.get<bool>() ? "true" : "false";
        case json::value_t::string:
            return "a string " + json_excerpt(v);
        case json::value_t::object:
            return "an object";
        case json::value_t::array:
            return "an array of " + std::to_string(v.size()) + " elements";
        default:
            return json_excerpt(v);  // numbers as written
    }
}

void bad_field(const std::string& param, const std::string& expected, const json& found) {
    throw ApiError(400, param + ": expected " + expected + ", found " + describe_json(found), param);
}

FieldReader::FieldReader(const json& obj, std::string prefix) : obj_(obj), prefix_(std::move(prefix)) {}

std::string FieldReader::param(const std::string& name) const {
    return prefix_.empty() ? name : prefix_ + "." + name;
}

const json* FieldReader::get(const std::string& name) const {
    const auto it = obj_.find(name);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
}

std::optional<bool> FieldReader::boolean(const std::string& name) const {
    const json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) bad_field(param(name), "a boolean", *v);
    return v->get<bool>();
}

std::optional<std::string> FieldReader::string(const std::string& name) const {
    const json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_string()) bad_field(param(name), "a string", *v);
    return v->get<std::string>();
}

std::optional<int64_t> FieldReader::integer(const std::string& name, int64_t lo, int64_t hi) const {
    const json* v = get(name);
    if (!v) return std::nullopt;
    const std::string range = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    if (v->is_number_unsigned()) {
        const uint64_t u = v->get<uint64_t>();
        if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) || static_cast<int64_t>(u) > hi ||
            static_cast<int64_t>(u) < lo)
            bad_field(param(name), range, *v);
        return static_cast<int64_t>(u);
    }
    if (!v->is_number_integer()) bad_field(param(name), range, *v);
    const int64_t x = v->get<int64_t>();
    if (x < lo || x > hi) bad_field(param(name), range, *v);
    return x;
}

std::optional<double> FieldReader::number(const std::string& name, double lo, double hi, bool lo_open) const {
    const json* v = get(name);
    if (!v) return std::nullopt;
    std::ostringstream range;
    range << "a number in " << (lo_open ? "(" : "[") << lo << ", " << hi << "]";
    if (!v->is_number()) bad_field(param(name), range.str(), *v);
    const double x = v->get<double>();
    if (!std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo))
        bad_field(param(name), range.str(), *v);
    return x;
}

}  // namespace markbase::server
