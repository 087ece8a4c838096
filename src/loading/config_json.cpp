// config.json -> ModelConfig. Accepts the layouts GEMMA4.md describes: nested multimodal (text_config,
// Gemma4ForConditionalGeneration), flat text-only (Gemma4ForCausalLM), and both the released keys
// (global_head_dim, num_global_key_value_heads) and the per_layer_config map transformers >= 5.17 writes; and
// the same two layouts of the 12B (gemma4_unified: Gemma4UnifiedForConditionalGeneration / ForCausalLM),
// whose text decoder is Gemma 4's with other class defaults and neither per-layer embeddings nor experts.
// Defaults are transformers' Gemma4TextConfig (Gemma4UnifiedTextConfig) class defaults, so a config that
// leaves a field out means what it means to transformers.
#include "loading/config_json.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "loading/json_excerpt.h"
#include "loading/regular_file.h"
#include "model/error.h"

namespace markbase {

using nlohmann::json;

namespace {

struct Reader {
    const json& j;
    std::string where;   // "config.json (text_config)"
    std::string prefix;  // the object's own path in the file, for fields of a nested object

    [[noreturn]] void fail(const std::string& field, const std::string& what) const {
        throw Error(where + ": field '" + prefix + field + "' " + what);
    }
    bool has(const char* k) const { return j.contains(k) && !j.at(k).is_null(); }

    int64_t integer(const char* k, std::optional<int64_t> def) const {
        if (!has(k)) {
            if (def) return *def;
            fail(k, "is required but missing");
        }
        const json& v = j.at(k);
        if (!v.is_number_integer()) fail(k, "must be an integer, found " + json_excerpt(v));
        if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
            fail(k, "is out of range, found " + json_excerpt(v));
        return v.get<int64_t>();
    }
    int positive(const char* k, std::optional<int64_t> def) const {
        int64_t v = integer(k, def);
        if (v <= 0 || v > (int64_t{1} << 30))
            fail(k, "must be a positive integer, found " + std::to_string(v));
        return static_cast<int>(v);
    }
    int non_negative(const char* k, std::optional<int64_t> def) const {
        int64_t v = integer(k, def);
        if (v < 0 || v > (int64_t{1} << 30)) fail(k, "must be >= 0, found " + std::to_string(v));
        return static_cast<int>(v);
    }
    double number(const char* k, std::optional<double> def) const {
        if (!has(k)) {
            if (def) return *def;
            fail(k, "is required but missing");
        }
        const json& v = j.at(k);
        if (!v.is_number()) fail(k, "must be a number, found " + json_excerpt(v));
        return v.get<double>();
    }
    // A number > 0 (or >= 0 with allow_zero); JSON cannot spell NaN or Inf, but a default or a cast could.
    double positive_number(const char* k, std::optional<double> def, bool allow_zero = false) const {
        const double v = number(k, def);
        if (!std::isfinite(v) || v < 0 || (v == 0 && !allow_zero))
            fail(k, std::string("must be a finite number ") + (allow_zero ? ">= 0" : "> 0") + ", found " +
                        (has(k) ? json_excerpt(j.at(k)) : std::to_string(v)));
        return v;
    }
    bool boolean(const char* k, bool def) const {
        if (!has(k)) return def;
        const json& v = j.at(k);
        if (!v.is_boolean()) fail(k, "must be true or false, found " + json_excerpt(v));
        return v.get<bool>();
    }
    std::string string(const char* k, const std::string& def) const {
        if (!has(k)) return def;
        const json& v = j.at(k);
        if (!v.is_string()) fail(k, "must be a string, found " + json_excerpt(v));
        return v.get<std::string>();
    }
};

// The two text decoders' configs. transformers' Gemma4UnifiedTextConfig is Gemma4TextConfig with other
// defaults and without the PLE and MoE fields; its attention, MLP and decoder layer compute what Gemma 4's
// dense layers compute (docs/gemma4-reference-notes.md).
struct Family {
    const char* text_type;  // the text config's model_type
    const char* causal_lm;  // the flat layout's architecture
    const char* multimodal_type;
    const char* multimodal_arch;
    bool unified;
    int sliding_window;  // class defaults
    int64_t max_positions;
    int ple_dim;
};
constexpr Family kGemma4{
    "gemma4_text", "Gemma4ForCausalLM", "gemma4", "Gemma4ForConditionalGeneration", false, 512, 131072, 256};
constexpr Family kGemma4Unified{"gemma4_unified_text",
                                "Gemma4UnifiedForCausalLM",
                                "gemma4_unified",
                                "Gemma4UnifiedForConditionalGeneration",
                                true,
                                1024,
                                262144,
                                0};

RopeParams parse_rope(const Reader& r, const json& p, const std::string& type_name) {
    const std::string field = "rope_parameters." + type_name;
    if (!p.is_object()) r.fail(field, "must be an object, found " + json_excerpt(p));
    const Reader f{p, r.where, r.prefix + field + "."};
    RopeParams rp;
    const std::string rope_type = f.string("rope_type", "default");
    rp.theta = f.positive_number("rope_theta", std::nullopt);
    if (rope_type == "default") {
        rp.partial_rotary_factor = 1.0;
        rp.proportional = false;
    } else if (rope_type == "proportional") {
        rp.proportional = true;
        rp.partial_rotary_factor = f.number("partial_rotary_factor", 1.0);
        if (!(rp.partial_rotary_factor > 0.0 && rp.partial_rotary_factor <= 1.0))
            f.fail("partial_rotary_factor",
                   "must be in (0, 1], found " + json_excerpt(p["partial_rotary_factor"]));
    } else {
        f.fail("rope_type",
               "'" + text_excerpt(rope_type) + "' is not supported (expected default or proportional)");
    }
    for (const char* k : {"factor", "scaling_factor"}) {
        if (f.has(k) && f.number(k, std::nullopt) != 1.0)
            f.fail(k, "rope scaling is not supported by Gemma 4 (found " + json_excerpt(p[k]) + ")");
    }
    return rp;
}

// The widths that decide tensor shapes. transformers' defaults for them are another model's (hidden_size
// 2304 is Gemma 2's), so a config without one would load as a list of shape mismatches: it is reported
// once, before anything else. Keys whose default is Gemma 4's own value (rms_norm_eps, global_head_dim,
// hidden_size_per_layer_input, vocab_size_per_layer_input, ...) may still be left out.
void require_widths(const Reader& r) {
    std::string missing;
    int n = 0;
    for (const char* k : {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                          "num_key_value_heads", "head_dim", "intermediate_size"}) {
        if (r.has(k)) continue;
        missing += (n++ ? ", " : "") + std::string(k);
    }
    if (n)
        throw Error(r.where + ": " + missing + (n == 1 ? " is" : " are") +
                    " missing (Gemma 4 needs every width that decides a tensor shape; transformers' defaults "
                    "for them are not Gemma 4's)");
}

// An explicit id must be one of the vocabulary; the defaults (transformers') are not checked.
int token_id(const Reader& r, const char* k, int def, int vocab_size) {
    if (!r.has(k)) return def;
    const int64_t v = r.integer(k, std::nullopt);
    if (v < 0 || v >= vocab_size)
        r.fail(k, "must be a token id in [0, " + std::to_string(vocab_size) + ") (vocab_size), found " +
                      std::to_string(v));
    return static_cast<int>(v);
}

// Layer types: explicit list, or transformers' default 5:1 pattern; the last layer is always full.
std::vector<AttentionKind> read_layer_kinds(const Reader& r, int n_layers) {
    std::vector<AttentionKind> kinds(n_layers, AttentionKind::Sliding);
    if (r.has("layer_types")) {
        const json& lt = r.j.at("layer_types");
        if (!lt.is_array() || static_cast<int>(lt.size()) != n_layers)
            r.fail("layer_types", "must be a list of num_hidden_layers (" + std::to_string(n_layers) +
                                      ") entries, found " + std::to_string(lt.is_array() ? lt.size() : 0));
        for (int i = 0; i < n_layers; ++i) {
            std::string t = lt[i].is_string() ? text_excerpt(lt[i].get<std::string>()) : json_excerpt(lt[i]);
            if (t == "sliding_attention")
                kinds[i] = AttentionKind::Sliding;
            else if (t == "full_attention")
                kinds[i] = AttentionKind::Full;
            else
                r.fail("layer_types[" + std::to_string(i) + "]",
                       "'" + t + "' is not sliding_attention or full_attention");
        }
    } else {
        for (int i = 0; i < n_layers; ++i)
            kinds[i] = ((i + 1) % 6) ? AttentionKind::Sliding : AttentionKind::Full;
    }
    kinds.back() = AttentionKind::Full;
    return kinds;
}

// Full-layer overrides of head_dim and num_key_value_heads, applied to layer_hd / layer_kv.
void read_overrides(const Reader& r, const std::vector<AttentionKind>& kinds, bool k_eq_v,
                    std::vector<int>& layer_hd, std::vector<int>& layer_kv) {
    const int n_layers = static_cast<int>(kinds.size());
    // Full-layer overrides: per_layer_config (transformers >= 5.17 save format) or the released keys.
    // As in transformers, num_global_key_value_heads applies only when attention_k_eq_v is set.
    if (r.has("per_layer_config")) {
        const json& plc = r.j.at("per_layer_config");
        if (!plc.is_object())
            r.fail("per_layer_config", "must be an object mapping layer index to overrides");
        for (auto it = plc.begin(); it != plc.end(); ++it) {
            int idx = -1;
            try {
                size_t used = 0;
                idx = std::stoi(it.key(), &used);
                if (used != it.key().size()) idx = -1;
            } catch (const std::exception&) {
                idx = -1;
            }
            if (idx < 0 || idx >= n_layers)
                r.fail("per_layer_config", "has key '" + text_excerpt(it.key()) + "', not a layer index");
            Reader sub{it.value(), r.where + " per_layer_config[" + text_excerpt(it.key()) + "]", ""};
            if (!it.value().is_object()) sub.fail("(entry)", "must be an object");
            for (auto f = it.value().begin(); f != it.value().end(); ++f) {
                if (f.key() != "head_dim" && f.key() != "num_key_value_heads")
                    sub.fail(text_excerpt(f.key()),
                             "is not a supported per-layer override (head_dim, num_key_value_heads)");
            }
            layer_hd[idx] = sub.positive("head_dim", layer_hd[idx]);
            layer_kv[idx] = sub.positive("num_key_value_heads", layer_kv[idx]);
        }
    } else {
        int global_hd = r.positive("global_head_dim", 512);
        std::optional<int> global_kv;
        if (k_eq_v && r.has("num_global_key_value_heads"))
            global_kv = r.positive("num_global_key_value_heads", std::nullopt);
        for (int i = 0; i < n_layers; ++i) {
            if (kinds[i] != AttentionKind::Full) continue;
            layer_hd[i] = global_hd;
            if (global_kv) layer_kv[i] = *global_kv;
        }
    }
}

void read_moe(const Reader& r, ModelConfig& c) {
    c.moe = r.boolean("enable_moe_block", false);
    if (c.moe) {
        c.n_experts = r.positive("num_experts", std::nullopt);
        c.top_k = r.positive("top_k_experts", std::nullopt);
        if (r.has("moe_intermediate_size"))
            c.expert_width = r.positive("moe_intermediate_size", std::nullopt);
        else if (r.has("expert_intermediate_size"))
            c.expert_width = r.positive("expert_intermediate_size", std::nullopt);
        else
            r.fail("moe_intermediate_size",
                   "is required when enable_moe_block is true (or expert_intermediate_size)");
        if (c.top_k > c.n_experts)
            r.fail("top_k_experts", "(" + std::to_string(c.top_k) + ") exceeds num_experts (" +
                                        std::to_string(c.n_experts) + ")");
    }
}

// Settings Gemma 4 never uses, and keys that mean a different model.
void reject_unsupported(const Reader& r, const Family& fam) {
    std::string act = r.string("hidden_activation", "gelu_pytorch_tanh");
    if (act != "gelu_pytorch_tanh")
        r.fail("hidden_activation",
               "'" + text_excerpt(act) + "' is not supported (Gemma 4 uses gelu_pytorch_tanh)");
    if (r.boolean("attention_bias", false))
        r.fail("attention_bias", "true is not supported (Gemma 4 has no biases)");
    if (!r.boolean("tie_word_embeddings", true))
        r.fail("tie_word_embeddings", "false is not supported (Gemma 4 ties lm_head to embed_tokens)");
    std::string bidi = r.string("use_bidirectional_attention", "");
    if (bidi == "all")
        r.fail("use_bidirectional_attention",
               "'all' is not supported (text decoding is causal; 'vision' is fine)");
    for (const char* k : {"attn_logit_softcapping", "query_pre_attn_scalar"}) {
        // Some 12B configs carry query_pre_attn_scalar; transformers' unified attention never reads it (its
        // scaling is 1.0, q_norm sets the scale), which tools/make_unified_goldens.py checks.
        if (fam.unified && std::string(k) == "query_pre_attn_scalar") continue;
        if (r.has(k))
            r.fail(k,
                   "is present: this looks like a different Gemma model (Gemma 4 has neither); refusing to "
                   "guess");
    }
    if (fam.unified) {
        if (r.boolean("enable_moe_block", false))
            r.fail("enable_moe_block",
                   "true is not supported by gemma4_unified_text (the 12B has no experts)");
        if (r.non_negative("hidden_size_per_layer_input", 0) != 0)
            r.fail(
                "hidden_size_per_layer_input",
                "must be 0 or absent for gemma4_unified_text (the 12B has no per-layer embeddings), found " +
                    json_excerpt(r.j.at("hidden_size_per_layer_input")));
    }
}

// RoPE per layer type.
void read_rope(const Reader& r, ModelConfig& c) {
    if (!r.has("rope_parameters")) return;
    const json& rp = r.j.at("rope_parameters");
    if (!rp.is_object()) r.fail("rope_parameters", "must be an object");
    if (rp.contains("sliding_attention"))
        c.rope_sliding = parse_rope(r, rp.at("sliding_attention"), "sliding_attention");
    if (rp.contains("full_attention")) c.rope_full = parse_rope(r, rp.at("full_attention"), "full_attention");
}

// c.layers from the per-layer kinds, head dims and KV heads. KV sharing: layers from `first` on read the last
// non-shared layer of the same type, and (use_double_wide_mlp) have shared_mlp wide MLPs.
void build_layers(const Reader& r, const std::vector<AttentionKind>& kinds, const std::vector<int>& layer_hd,
                  const std::vector<int>& layer_kv, bool k_eq_v, int shared_mlp, int mlp, ModelConfig& c) {
    const int first = c.n_layers - c.n_kv_shared;
    c.layers.resize(c.n_layers);
    for (int i = 0; i < c.n_layers; ++i) {
        LayerSpec& l = c.layers[i];
        const bool shared = c.n_kv_shared > 0 && i >= first;
        l.kind = kinds[i];
        l.head_dim = layer_hd[i];
        l.n_kv_heads = layer_kv[i];
        l.k_eq_v = k_eq_v && kinds[i] == AttentionKind::Full;
        l.mlp_width = shared ? shared_mlp : mlp;
        if (l.head_dim % 2) r.fail("head_dim", "must be even for RoPE (layer " + std::to_string(i) + ")");
        if (c.n_heads % l.n_kv_heads)
            r.fail("num_key_value_heads", "(" + std::to_string(l.n_kv_heads) + " on layer " +
                                              std::to_string(i) + ") must divide num_attention_heads (" +
                                              std::to_string(c.n_heads) + ")");
        if (!shared) continue;
        int src = first - 1;
        while (src >= 0 && kinds[src] != kinds[i]) --src;
        if (src < 0)
            r.fail("num_kv_shared_layers",
                   "leaves layer " + std::to_string(i) +
                       " with no earlier non-shared layer of its type to share KV with");
        if (layer_hd[src] != l.head_dim || layer_kv[src] != l.n_kv_heads)
            r.fail("per_layer_config", "layer " + std::to_string(i) + " shares KV with layer " +
                                           std::to_string(src) +
                                           " but their head_dim/num_key_value_heads differ");
        l.kv_source = src;
    }
}

ModelConfig parse_text_config(const Reader& r, const Family& fam) {
    ModelConfig c;
    c.unified = fam.unified;
    std::string mt = r.string("model_type", fam.text_type);
    if (mt != fam.text_type)
        r.fail("model_type", std::string("must be ") + fam.text_type + ", found '" + text_excerpt(mt) + "'");

    require_widths(r);
    c.vocab_size = r.positive("vocab_size", std::nullopt);
    c.hidden = r.positive("hidden_size", std::nullopt);
    c.n_layers = r.positive("num_hidden_layers", std::nullopt);
    c.n_heads = r.positive("num_attention_heads", std::nullopt);
    int n_kv = r.positive("num_key_value_heads", std::nullopt);
    int head_dim = r.positive("head_dim", std::nullopt);
    c.sliding_window = r.positive("sliding_window", fam.sliding_window);
    c.max_positions = r.positive("max_position_embeddings", fam.max_positions);
    c.rms_eps = static_cast<float>(r.positive_number("rms_norm_eps", 1e-6));
    c.final_softcap = static_cast<float>(r.positive_number("final_logit_softcapping", 0.0, true));

    reject_unsupported(r, fam);

    c.ple_dim = r.non_negative("hidden_size_per_layer_input", fam.ple_dim);
    c.ple_vocab = r.positive("vocab_size_per_layer_input", 262144);
    read_moe(r, c);
    bool k_eq_v = r.boolean("attention_k_eq_v", false);
    bool double_wide = r.boolean("use_double_wide_mlp", false);
    int inter = r.positive("intermediate_size", std::nullopt);
    c.n_kv_shared = r.non_negative("num_kv_shared_layers", 0);
    if (c.n_kv_shared >= c.n_layers)
        r.fail("num_kv_shared_layers", "(" + std::to_string(c.n_kv_shared) +
                                           ") must be below num_hidden_layers (" +
                                           std::to_string(c.n_layers) + ")");

    const std::vector<AttentionKind> kinds = read_layer_kinds(r, c.n_layers);

    read_rope(r, c);
    std::vector<int> layer_hd(c.n_layers, head_dim), layer_kv(c.n_layers, n_kv);
    read_overrides(r, kinds, k_eq_v, layer_hd, layer_kv);
    build_layers(r, kinds, layer_hd, layer_kv, k_eq_v, inter * (double_wide ? 2 : 1), inter, c);

    c.bos_id = token_id(r, "bos_token_id", 2, c.vocab_size);
    c.pad_id = token_id(r, "pad_token_id", 0, c.vocab_size);
    if (r.has("eos_token_id"))
        c.stop_ids =
            parse_token_ids(r.j.at("eos_token_id"), c.vocab_size, r.where, r.prefix + "eos_token_id");
    if (c.stop_ids.empty()) c.stop_ids.push_back(1);
    c.eos_id = c.stop_ids.front();
    return c;
}

}  // namespace

std::vector<int> parse_token_ids(const json& value, int vocab_size, const std::string& where,
                                 const std::string& field) {
    auto fail = [&](const std::string& what) -> Error {
        return Error(where + ": field '" + field + "' " + what);
    };
    if (!value.is_array() && !value.is_number_integer())
        throw fail("must be a token id or a list of token ids, found " + json_excerpt(value));
    const json single = value.is_array() ? json() : json::array({value});
    std::vector<int> ids;
    for (const json& v : value.is_array() ? value : single) {
        if (!v.is_number_integer()) throw fail("must hold token ids (integers), found " + json_excerpt(v));
        const bool negative = !v.is_number_unsigned() && v.get<int64_t>() < 0;
        if (negative || v.get<uint64_t>() >= uint64_t(vocab_size))
            throw fail("holds " + json_excerpt(v) + ", not a token id of the vocabulary [0, " +
                       std::to_string(vocab_size) + ")");
        ids.push_back(v.get<int>());
    }
    return ids;
}

ModelConfig parse_config_text(const std::string& text, const std::string& source) {
    const json root = parse_json(text, source);
    if (!root.is_object()) throw Error(source + ": expected a JSON object at the top level");
    Reader top{root, source, ""};
    std::string mt = top.string("model_type", "");
    std::string arch;
    if (root.contains("architectures") && root["architectures"].is_array() &&
        !root["architectures"].empty() && root["architectures"][0].is_string())
        arch = root["architectures"][0].get<std::string>();

    ModelConfig c;
    const bool nested = root.contains("text_config");
    const Family* fam = nullptr;
    for (const Family* f : {&kGemma4, &kGemma4Unified})
        if (mt == (nested ? f->multimodal_type : f->text_type)) fam = f;
    if (!fam) {
        top.fail(
            "model_type",
            std::string(nested ? "must be gemma4 or gemma4_unified for a config with text_config"
                               : "must be gemma4_text or gemma4_unified_text (or gemma4 / gemma4_unified "
                                 "with a text_config)") +
                ", found '" + text_excerpt(mt) + "'" + (mt.empty() ? "" : " (only Gemma 4 is supported)"));
    }
    if (nested) {
        if (!arch.empty() && arch != fam->multimodal_arch)
            top.fail("architectures", "'" + text_excerpt(arch) + "' is not supported with model_type " + mt +
                                          " (expected " + fam->multimodal_arch + ")");
        const json& tc = root["text_config"];
        if (!tc.is_object()) top.fail("text_config", "must be an object");
        c = parse_text_config(Reader{tc, source + " (text_config)", ""}, *fam);
        c.weight_prefix = "model.language_model.";
        // The top-level eos list (e.g. [1, 106] for -it models) is what generation stops on.
        if (top.has("eos_token_id")) {
            std::vector<int> ids =
                parse_token_ids(root["eos_token_id"], c.vocab_size, source, "eos_token_id");
            if (!ids.empty()) c.stop_ids = ids;
        }
    } else {
        const std::string text_model = fam->unified ? "Gemma4UnifiedTextModel" : "Gemma4TextModel";
        if (!arch.empty() && arch != fam->causal_lm && arch != text_model)
            top.fail("architectures", "'" + text_excerpt(arch) + "' is not supported with model_type " + mt +
                                          " (expected " + fam->causal_lm + ")");
        c = parse_text_config(top, *fam);
        c.weight_prefix = "model.";
    }
    c.architecture = arch.empty() ? (nested ? fam->multimodal_arch : fam->causal_lm) : arch;
    return c;
}

ModelConfig parse_config_file(const std::string& path) {
    return parse_config_text(read_regular_file(path, " (does the model folder contain config.json?)"), path);
}

}  // namespace markbase
