#include "loading/generation_config.h"

#include <climits>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>

#include "loading/config_json.h"
#include "loading/json_excerpt.h"
#include "loading/regular_file.h"
#include "model/error.h"

namespace markbase {

using nlohmann::json;

namespace {

struct Field {
    const json& j;
    const std::string& file;

    [[noreturn]] void fail(const char* k, const std::string& what) const {
        throw Error(file + ": field '" + k + "' " + what);
    }
    const json* get(const char* k) const {
        const auto it = j.find(k);
        return it == j.end() || it->is_null() ? nullptr : &*it;
    }
    // A number for which ok() holds; `expect` says which in the message.
    std::optional<float> number(const char* k, const std::function<bool(double)>& ok,
                                const char* expect) const {
        const json* v = get(k);
        if (!v) return std::nullopt;
        if (!v->is_number()) fail(k, "must be a number, found " + json_excerpt(*v));
        if (!ok(v->get<double>())) fail(k, std::string("must be ") + expect + ", found " + json_excerpt(*v));
        return static_cast<float>(v->get<double>());
    }
};

}  // namespace

GenerationDefaults read_generation_config(const std::filesystem::path& dir, int vocab_size) {
    GenerationDefaults g;
    const std::string path = (dir / "generation_config.json").string();
    if (path_missing(path)) return g;
    const json j = parse_json(read_regular_file(path), path);
    if (!j.is_object()) throw Error(path + ": expected a JSON object, found " + json_excerpt(j));
    const Field r{j, path};
    g.temperature = r.number(
        "temperature", [](double v) { return std::isfinite(v) && v >= 0; },
        "a finite number >= 0 (0 = greedy)");
    g.top_p = r.number(
        "top_p", [](double v) { return v > 0 && v <= 1; }, "in (0, 1] (1 = off)");
    g.min_p = r.number(
        "min_p", [](double v) { return v >= 0 && v <= 1; }, "in [0, 1] (0 = off)");
    g.repetition_penalty = r.number(
        "repetition_penalty", [](double v) { return std::isfinite(v) && v > 0; },
        "a finite number > 0 (1 = off)");
    if (const json* v = r.get("top_k")) {
        if (!v->is_number_integer()) r.fail("top_k", "must be an integer >= 0, found " + json_excerpt(*v));
        const bool negative = !v->is_number_unsigned() && v->get<int64_t>() < 0;
        if (negative || v->get<uint64_t>() > uint64_t(INT_MAX))
            r.fail("top_k", "must be an integer in [0, " + std::to_string(INT_MAX) + "] (0 = off), found " +
                                json_excerpt(*v));
        g.top_k = v->get<int>();
    }
    if (const json* v = r.get("do_sample")) {
        if (!v->is_boolean()) r.fail("do_sample", "must be true or false, found " + json_excerpt(*v));
        g.do_sample = v->get<bool>();
    }
    if (const json* v = r.get("eos_token_id"))
        g.stop_ids = parse_token_ids(*v, vocab_size > 0 ? vocab_size : INT_MAX, path, "eos_token_id");
    return g;
}

GenerationDefaults read_generation_config(const std::filesystem::path& dir) {
    const auto config = dir / "config.json";
    const int vocab = path_missing(config) ? 0 : parse_config_file(config.string()).vocab_size;
    return read_generation_config(dir, vocab);
}

}  // namespace markbase
