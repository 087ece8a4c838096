#include "loading/quantization_config.h"

#include <nlohmann/json.hpp>

#include "loading/json_excerpt.h"
#include "loading/regular_file.h"
#include "model/error.h"

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

void check_format(const Field& f) {
    if (!f.has("format")) return;
    const std::string fmt = f.string("format");
    if (fmt != "float-quantized" && fmt != "naive-quantized")
        f.fail("format", "must be float-quantized or naive-quantized (FP8 weights), found \"" +
                             text_excerpt(fmt) + "\"" +
                             (fmt == "pack-quantized" ? " (int4 weights are not supported yet)" : ""));
}

void check_weights(const Field& w) {
    if (!w.has("num_bits") || !w.j.at("num_bits").is_number_integer() ||
        w.j.at("num_bits").get<int64_t>() != 8)
        w.fail("num_bits",
               "must be 8 (FP8 weights; int4 and other widths are not supported yet), found " +
                   (w.has("num_bits") ? json_excerpt(w.j.at("num_bits")) : std::string("nothing")));
    const std::string type = w.has("type") ? w.string("type") : "";
    if (type != "float")
        w.fail("type",
               "must be \"float\" (float8 e4m3 weights; integer weights are not supported yet), found \"" +
                   text_excerpt(type) + "\"");
    const std::string strategy = w.has("strategy") ? w.string("strategy") : "";
    if (strategy != "channel" && strategy != "tensor")
        w.fail("strategy",
               "must be \"channel\" or \"tensor\" (one scale per output row or per matrix), found \"" +
                   text_excerpt(strategy) + "\"");
    w.expect_bool("symmetric", true, "FP8 weights have no zero point");
    w.expect_bool("dynamic", false, "the weights' scales are stored in the checkpoint");
    w.absent("group_size", "channel and tensor strategies have no groups");
    w.absent("block_structure", "block scales are not supported");
    if (w.has("actorder") && !(w.j.at("actorder").is_boolean() && !w.j.at("actorder").get<bool>()))
        w.fail("actorder", "must be null or false (activation ordering is a GPTQ setting), found " +
                               json_excerpt(w.j.at("actorder")));
}

void read_group(const Field& g, QuantizationConfig& qc) {
    check_format(g);
    for (ModulePattern& p : g.patterns("targets", true)) qc.targets.push_back(std::move(p));
    if (!g.has("weights")) g.fail("weights", "is required but missing (the group's weight scheme)");
    check_weights(g.sub("weights"));
    if (g.has("input_activations")) {
        const Field a = g.sub("input_activations");
        const bool dynamic =
            a.has("dynamic") && a.j.at("dynamic").is_boolean() && a.j.at("dynamic").get<bool>();
        if (qc.activations != "static") qc.activations = dynamic ? "dynamic" : "static";
    }
    g.absent("output_activations", "output activation quantization is not supported");
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
               "must be \"compressed-tensors\" (the FP8 checkpoints llm-compressor writes), found \"" +
                   text_excerpt(method) + "\"");
    check_format(f);
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
    for (auto it = groups.j.begin(); it != groups.j.end(); ++it) {
        if (!it.value().is_object())
            groups.fail(text_excerpt(it.key()), "must be an object, found " + json_excerpt(it.value()));
        read_group(Field{it.value(), file, groups.path + "." + text_excerpt(it.key())}, qc);
    }
    return qc;
}

std::optional<QuantizationConfig> read_quantization_config(const std::filesystem::path& config_json) {
    return parse_quantization_config(read_regular_file(config_json), config_json.string());
}

}  // namespace markbase
