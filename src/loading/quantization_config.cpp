#include "loading/quantization_config.h"

#include <nlohmann/json.hpp>

#include "loading/json_excerpt.h"
#include "loading/regular_file.h"
#include "model/error.h"
#include "model/int4.h"

namespace markbase {

using nlohmann::json;

namespace {

// One object of quantization_config, read with its path for messages.
struct Field {
    const json& j;
    const std::string& file;
    std::string path;  // "quantization_config.config_groups.group_0.weights"

    [[noreturn]] void fail(const std::string& key, const std::string& what) const {
        throw Error(file + ": field '" + path + (key.empty() ? "" : "." + key) + "' " + what);
    }
    bool has(const char* k) const { return j.contains(k) && !j.at(k).is_null(); }
    Field sub(const char* k) const {
        if (!j.at(k).is_object()) fail(k, "must be an object, found " + json_excerpt(j.at(k)));
        return {j.at(k), file, path + "." + k};
    }
    std::string string(const char* k) const {
        const json& v = j.at(k);
        if (!v.is_string()) fail(k, "must be a string, found " + json_excerpt(v));
        return v.get<std::string>();
    }
    // The key must be absent or null: a setting of a scheme we do not read.
    void absent(const char* k, const std::string& why) const {
        if (has(k)) fail(k, "must be null or absent (" + why + "), found " + json_excerpt(j.at(k)));
    }
    void expect_bool(const char* k, bool want, const std::string& why) const {
        if (!has(k)) return;
        const json& v = j.at(k);
        if (!v.is_boolean() || v.get<bool>() != want)
            fail(k, std::string("must be ") + (want ? "true" : "false") + " (" + why + "), found " +
                        json_excerpt(v));
    }
    std::vector<ModulePattern> patterns(const char* k, bool required) const {
        std::vector<ModulePattern> out;
        if (!has(k)) {
            if (required) fail(k, "is required but missing (the modules the group quantizes)");
            return out;
        }
        const json& v = j.at(k);
        if (!v.is_array() || (required && v.empty()))
            fail(k, std::string("must be a ") + (required ? "non-empty " : "") +
                        "list of module names, Linear or re:PATTERN, found " + json_excerpt(v));
        for (size_t i = 0; i < v.size(); ++i) {
            const std::string at = path + "." + k + "[" + std::to_string(i) + "]";
            if (!v[i].is_string())
                throw Error(file + ": field '" + at + "' must be a string, found " + json_excerpt(v[i]));
            out.push_back(ModulePattern::parse(v[i].get<std::string>(), file, at));
        }
        return out;
    }
};

// A group's weight scheme, as its `weights` say.
struct Scheme {
    WeightFormat format = WeightFormat::kFp8;
    bool symmetric = true;
};

const char* scheme_name(const Scheme& s) {
    return s.format == WeightFormat::kFp8 ? "FP8" : s.symmetric ? "int4 symmetric" : "int4 asymmetric";
}

// The key `format` (of quantization_config or of a group), where present, must be the scheme's.
void check_format(const Field& f, const Scheme& s) {
    if (!f.has("format")) return;
    const std::string fmt = f.string("format");
    if (s.format == WeightFormat::kFp8 && fmt != "float-quantized" && fmt != "naive-quantized")
        f.fail("format",
               "must be float-quantized or naive-quantized (FP8 weights: num_bits 8, type float), found \"" +
                   text_excerpt(fmt) + "\"");
    if (s.format == WeightFormat::kInt4 && fmt != "pack-quantized")
        f.fail("format", "must be pack-quantized (int4 weights: num_bits 4, type int), found \"" +
                             text_excerpt(fmt) + "\"");
}

// Keys both schemes want the same way.
void check_common(const Field& w) {
    w.expect_bool("dynamic", false, "the weights' scales are stored in the checkpoint");
    w.absent("block_structure", "block scales are not supported");
}

void check_fp8_weights(const Field& w, const std::string& type) {
    if (type != "float")
        w.fail("type",
               "must be \"float\" for 8-bit weights (float8 e4m3; int8 weights are not supported), found \"" +
                   text_excerpt(type) + "\"");
    const std::string strategy = w.has("strategy") ? w.string("strategy") : "";
    if (strategy != "channel" && strategy != "tensor")
        w.fail("strategy",
               "must be \"channel\" or \"tensor\" (one scale per output row or per matrix), found \"" +
                   text_excerpt(strategy) + "\"");
    w.expect_bool("symmetric", true, "FP8 weights have no zero point");
    check_common(w);
    w.absent("group_size", "channel and tensor strategies have no groups");
    if (w.has("actorder") && !(w.j.at("actorder").is_boolean() && !w.j.at("actorder").get<bool>()))
        w.fail("actorder", "must be null or false (activation ordering is a GPTQ setting), found " +
                               json_excerpt(w.j.at("actorder")));
}

// Returns whether the weights are symmetric.
bool check_int4_weights(const Field& w, const std::string& type) {
    if (type != "int")  // compressed-tensors' default type is int
        w.fail("type", "must be \"int\" for 4-bit weights (FP4 weights are not supported), found \"" +
                           text_excerpt(type) + "\"");
    // compressed-tensors infers the group strategy from a positive group_size
    const std::string strategy = w.has("strategy")     ? w.string("strategy")
                                 : w.has("group_size") ? "group"
                                                       : "";
    if (strategy != "group")
        w.fail(
            "strategy",
            "must be \"group\" (int4 weights with a scale per 128 weights along a row; channel, tensor and "
            "block scales are not supported), found \"" +
                text_excerpt(strategy) + "\"");
    const json* g = w.has("group_size") ? &w.j.at("group_size") : nullptr;
    if (!g || !g->is_number_integer() || g->get<int64_t>() != kInt4Group)
        w.fail("group_size", "must be 128 (the int4 layout holds a scale per 128 weights), found " +
                                 (g ? json_excerpt(*g) : std::string("nothing")));
    check_common(w);
    if (w.has("actorder")) {
        const json& a = w.j.at("actorder");
        const bool in_order =
            (a.is_boolean() && !a.get<bool>()) ||
            (a.is_string() && (a.get<std::string>() == "weight" || a.get<std::string>() == "static"));
        if (!in_order)
            w.fail("actorder",
                   "must be null, false, \"weight\" or \"static\" (activation ordering by group stores a "
                   "weight_g_idx permutation of the groups, which is not supported), found " +
                       json_excerpt(a));
    }
    if (!w.has("symmetric")) return true;
    const json& s = w.j.at("symmetric");
    if (!s.is_boolean()) w.fail("symmetric", "must be true or false, found " + json_excerpt(s));
    return s.get<bool>();
}

Scheme check_weights(const Field& w) {
    const json* bits = w.has("num_bits") ? &w.j.at("num_bits") : nullptr;
    const int64_t n = bits && bits->is_number_integer() ? bits->get<int64_t>() : 0;
    if (n != 8 && n != 4)
        w.fail("num_bits", "must be 8 (FP8 weights) or 4 (int4 weights), found " +
                               (bits ? json_excerpt(*bits) : std::string("nothing")));
    if (n == 8) {
        check_fp8_weights(w, w.has("type") ? w.string("type") : "");
        return {};
    }
    return {WeightFormat::kInt4, check_int4_weights(w, w.has("type") ? w.string("type") : "int")};
}

Scheme read_group(const Field& g, QuantizationConfig& qc) {
    for (ModulePattern& p : g.patterns("targets", true)) qc.targets.push_back(std::move(p));
    if (!g.has("weights")) g.fail("weights", "is required but missing (the group's weight scheme)");
    const Scheme s = check_weights(g.sub("weights"));
    check_format(g, s);
    if (g.has("input_activations")) {
        const Field a = g.sub("input_activations");
        if (s.format == WeightFormat::kInt4)
            g.fail("input_activations",
                   "must be null or absent (W4A16: int4 weights with bf16 activations; int4 weights with "
                   "quantized activations are not supported), found " +
                       json_excerpt(a.j));
        const bool dynamic =
            a.has("dynamic") && a.j.at("dynamic").is_boolean() && a.j.at("dynamic").get<bool>();
        if (qc.activations != "static") qc.activations = dynamic ? "dynamic" : "static";
    }
    g.absent("output_activations", "output activation quantization is not supported");
    return s;
}

}  // namespace

bool QuantizationConfig::ignores(const std::string& module) const {
    for (const ModulePattern& p : ignore)
        if (p.matches(module)) return true;
    return false;
}

bool QuantizationConfig::quantizes(const std::string& module) const {
    bool targeted = false;
    for (const ModulePattern& p : targets) targeted = targeted || p.matches(module);
    return targeted && !ignores(module);
}

std::optional<QuantizationConfig> parse_quantization_config(const std::string& json_text,
                                                            const std::string& file) {
    const json root = parse_json(json_text, file);
    if (!root.is_object()) throw Error(file + ": expected a JSON object at the top level");
    const json* q = nullptr;
    std::string path = "quantization_config";
    if (root.contains("quantization_config")) {
        q = &root.at("quantization_config");
    } else if (root.contains("text_config") && root.at("text_config").is_object() &&
               root.at("text_config").contains("quantization_config")) {
        q = &root.at("text_config").at("quantization_config");
        path = "text_config.quantization_config";
    }
    if (!q || q->is_null()) return std::nullopt;
    if (!q->is_object())
        throw Error(file + ": field '" + path + "' must be an object, found " + json_excerpt(*q));
    const Field f{*q, file, path};
    const std::string method = f.has("quant_method") ? f.string("quant_method") : "";
    if (method != "compressed-tensors")
        f.fail("quant_method",
               "must be \"compressed-tensors\" (the FP8 and int4 checkpoints llm-compressor writes), found "
               "\"" +
                   text_excerpt(method) + "\"");
    f.absent("kv_cache_scheme", "an FP8 KV cache's scales are not supported yet");
    if (f.has("sparsity_config")) {
        const Field s = f.sub("sparsity_config");
        if (s.has("format") && s.string("format") != "dense")
            s.fail("format", "must be \"dense\" (sparse weights are not supported), found \"" +
                                 text_excerpt(s.string("format")) + "\"");
    }
    QuantizationConfig qc;
    qc.file = file;
    qc.ignore = f.patterns("ignore", false);
    if (!f.has("config_groups") || !q->at("config_groups").is_object() || q->at("config_groups").empty())
        f.fail("config_groups",
               "must be an object of one or more groups, found " +
                   (f.has("config_groups") ? json_excerpt(q->at("config_groups")) : "nothing"));
    const Field groups = f.sub("config_groups");
    std::optional<Scheme> first;
    for (auto it = groups.j.begin(); it != groups.j.end(); ++it) {
        if (!it.value().is_object())
            groups.fail(text_excerpt(it.key()), "must be an object, found " + json_excerpt(it.value()));
        const Field g{it.value(), file, groups.path + "." + text_excerpt(it.key())};
        const Scheme s = read_group(g, qc);
        // Checkpoint::format is one format, and an int4 checkpoint's zero points are all there or none
        if (first && (s.format != first->format || s.symmetric != first->symmetric))
            g.fail("weights", std::string("must use the scheme of the groups before it (one weight format a "
                                          "checkpoint), ") +
                                  scheme_name(*first) + ", found " + scheme_name(s));
        first = s;
    }
    check_format(f, *first);
    qc.format = first->format;
    qc.symmetric = first->symmetric;
    return qc;
}

std::optional<QuantizationConfig> read_quantization_config(const std::filesystem::path& config_json) {
    return parse_quantization_config(read_regular_file(config_json), config_json.string());
}

}  // namespace markbase
