// Reading tokenizer.json: the vocabulary and merges through the fast cursor, every other section through
// nlohmann, and a check that each section is something we implement exactly (see tokenizer.h).
#include <cctype>
#include <deque>
#include <nlohmann/json.hpp>

#include "loading/json_excerpt.h"
#include "loading/regular_file.h"
#include "model/error.h"
#include "tokenizer/json_cursor.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace markbase {

namespace {

using nlohmann::json;
using tok::JsonCursor;

const char* kSupported = " (MarkBase reads SentencePiece-style BPE tokenizer.json files such as Gemma's)";

// The raw content of tokenizer.json with the two big tables kept as views.
struct RawFile {
    json top = json::object();    // every top-level key but "model"
    json model = json::object();  // model minus vocab and merges
    bool have_model = false, have_vocab = false, have_merges = false;
    std::vector<tok::Vocab::Entry> vocab;
    std::vector<std::pair<std::string_view, std::string_view>> merges;
    std::deque<std::string> unescaped;  // storage for the few strings that had escapes (stable addresses)
};

// Nesting is capped here (kMaxJsonDepth): the section parsers below recurse once per Sequence level.
json parse_section(std::string_view raw, const std::string& origin, const std::string& name) {
    return parse_json(raw, origin, "", name);
}

std::string_view keep(RawFile& f, std::string_view s, const std::string& scratch) {
    if (s.data() != scratch.data()) return s;  // points into the file text
    f.unescaped.emplace_back(s);
    return f.unescaped.back();
}

void read_vocab(JsonCursor& cur, RawFile& f) {
    std::string scratch;
    cur.expect('{');
    if (cur.consume('}')) return;
    f.vocab.reserve(300000);
    do {
        std::string_view token = keep(f, cur.read_string(scratch), scratch);
        cur.expect(':');
        if (cur.peek() != '-' && (cur.peek() < '0' || cur.peek() > '9'))
            cur.fail("model.vocab must map each token to an integer id");
        f.vocab.push_back({token, cur.read_integer()});
    } while (cur.consume(','));
    cur.expect('}');
}

void read_merges(JsonCursor& cur, RawFile& f) {
    std::string scratch;
    cur.expect('[');
    if (cur.consume(']')) return;
    f.merges.reserve(600000);
    do {
        if (cur.peek() == '[') {  // current format: ["left", "right"]
            cur.expect('[');
            std::string_view l = keep(f, cur.read_string(scratch), scratch);
            cur.expect(',');
            std::string_view r = keep(f, cur.read_string(scratch), scratch);
            if (cur.peek() != ']') cur.fail("each entry of model.merges must hold exactly two tokens");
            cur.expect(']');
            f.merges.emplace_back(l, r);
        } else if (cur.peek() == '"') {  // legacy format: "left right"
            std::string_view s = keep(f, cur.read_string(scratch), scratch);
            const std::size_t sp = s.find(' ');
            if (sp == std::string_view::npos || s.find(' ', sp + 1) != std::string_view::npos)
                cur.fail("a merge written as a string must be two tokens separated by one space");
            f.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
        } else {
            cur.fail("model.merges entries must be [\"left\", \"right\"] pairs or \"left right\" strings");
        }
    } while (cur.consume(','));
    cur.expect(']');
}

// The "model" object: vocab and merges through the cursor, every other key through nlohmann.
void read_model(JsonCursor& cur, RawFile& f, const std::string& origin) {
    std::string scratch;
    f.have_model = true;
    cur.expect('{');
    if (cur.consume('}')) return;
    do {
        const std::string mkey(cur.read_string(scratch));
        cur.expect(':');
        if (mkey == "vocab" && cur.peek() == '{') {
            read_vocab(cur, f);
            f.have_vocab = true;
        } else if (mkey == "merges" && cur.peek() == '[') {
            read_merges(cur, f);
            f.have_merges = true;
        } else {
            f.model[mkey] = parse_section(cur.skip_value(), origin, "model." + mkey);
        }
    } while (cur.consume(','));
    cur.expect('}');
}

RawFile read_raw(std::string_view text, const std::string& origin) {
    if (text.find_first_not_of(" \t\r\n") == std::string_view::npos)
        throw Error(origin + ": the file is empty, not a tokenizer.json");
    const std::size_t bad = tok::find_invalid_utf8(text);
    if (bad != std::string_view::npos)
        throw Error(origin + ": not UTF-8 text (bad byte at offset " + std::to_string(bad) +
                    "); expected a tokenizer.json");
    RawFile f;
    JsonCursor cur(text, origin);
    if (cur.peek() != '{') cur.fail("expected a JSON object (a tokenizer.json)");
    cur.expect('{');
    std::string scratch;
    if (!cur.consume('}')) {
        do {
            const std::string key(cur.read_string(scratch));
            cur.expect(':');
            if (key == "model" && cur.peek() == '{')
                read_model(cur, f, origin);
            else
                f.top[key] = parse_section(cur.skip_value(), origin, key);
        } while (cur.consume(','));
    }
    cur.expect('}');
    cur.expect_end();
    return f;
}

std::string type_of(const json& j) {
    if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) return "";
    return j["type"].get<std::string>();
}

bool get_bool(const json& j, const char* key, bool fallback, const std::string& origin,
              const std::string& where) {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_boolean()) throw Error(origin + ": " + where + "." + key + " must be true or false");
    return j[key].get<bool>();
}

std::string get_string(const json& j, const char* key, const std::string& origin, const std::string& where) {
    if (!j.is_object() || !j.contains(key) || !j[key].is_string())
        throw Error(origin + ": " + where + "." + key + " must be a string");
    return j[key].get<std::string>();
}

// A Replace/Split pattern: {"String": s} or {"Regex": r}. Regexes are accepted only when they are a plain
// literal (returned as such) or, where `allow_repeat`, one character followed by '+'.
std::string read_pattern(const json& j, const std::string& origin, const std::string& where,
                         bool allow_repeat, bool& repeated) {
    repeated = false;
    if (!j.contains("pattern") || !j["pattern"].is_object())
        throw Error(origin + ": " + where + ".pattern must be {\"String\": ...} or {\"Regex\": ...}");
    const json& p = j["pattern"];
    if (p.contains("String") && p["String"].is_string()) return p["String"].get<std::string>();
    if (!p.contains("Regex") || !p["Regex"].is_string())
        throw Error(origin + ": " + where + ".pattern must be {\"String\": ...} or {\"Regex\": ...}");
    const std::string re = p["Regex"].get<std::string>();
    auto unsupported = [&]() -> Error {
        return Error(
            origin + ": " + where + " uses the regex \"" + text_excerpt(re) +
            "\", which MarkBase does not implement (only literals and a single repeated character like "
            "\"\\n+\" are)" +
            kSupported);
    };
    std::string literal;
    std::size_t atoms = 0;
    for (std::size_t i = 0; i < re.size();) {
        const char c = re[i];
        if (c == '\\') {
            if (i + 1 >= re.size()) throw unsupported();
            const char e = re[i + 1];
            i += 2;
            switch (e) {
                case 'n':
                    literal += '\n';
                    break;
                case 't':
                    literal += '\t';
                    break;
                case 'r':
                    literal += '\r';
                    break;
                case 'f':
                    literal += '\f';
                    break;
                case 'v':
                    literal += '\v';
                    break;
                default:
                    // An escaped punctuation character is itself; letters and digits are classes or
                    // references.
                    if (static_cast<unsigned char>(e) < 0x80 && !std::isalnum(static_cast<unsigned char>(e)))
                        literal += e;
                    else
                        throw unsupported();
            }
        } else if (c == '+' && allow_repeat && i + 1 == re.size() && atoms == 1) {
            repeated = true;
            ++i;
            continue;
        } else if (std::string_view(".^$*+?()[]{}|").find(c) != std::string_view::npos) {
            throw unsupported();
        } else {
            const std::size_t len = tok::utf8_len(static_cast<unsigned char>(c));
            literal.append(re, i, len);
            i += len;
        }
        ++atoms;
    }
    return literal;
}

void parse_normalizer(const json& j, std::vector<tok::NormalizerStep>& out, const std::string& origin,
                      const std::string& where) {
    if (j.is_null()) return;
    const std::string type = type_of(j);
    if (type == "Sequence") {
        if (!j.contains("normalizers") || !j["normalizers"].is_array())
            throw Error(origin + ": " + where + ".normalizers must be a list");
        for (std::size_t i = 0; i < j["normalizers"].size(); ++i)
            parse_normalizer(j["normalizers"][i], out, origin,
                             where + ".normalizers[" + std::to_string(i) + "]");
    } else if (type == "Replace") {
        bool repeated = false;
        tok::NormalizerStep step;
        step.kind = tok::NormalizerStep::Replace;
        step.pattern = read_pattern(j, origin, where, false, repeated);
        step.content = get_string(j, "content", origin, where);
        out.push_back(step);
    } else if (type == "Prepend") {
        tok::NormalizerStep step;
        step.kind = tok::NormalizerStep::Prepend;
        step.content = get_string(j, "prepend", origin, where);
        out.push_back(step);
    } else {
        throw Error(origin + ": " + where + " is of type \"" + text_excerpt(type) +
                    "\"; only Replace, Prepend and Sequence are supported" + kSupported);
    }
}

void parse_pre_tokenizer(const json& j, std::vector<tok::SplitRule>& out, const std::string& origin,
                         const std::string& where) {
    if (j.is_null()) return;
    const std::string type = type_of(j);
    if (type == "Sequence") {
        if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array())
            throw Error(origin + ": " + where + ".pretokenizers must be a list");
        for (std::size_t i = 0; i < j["pretokenizers"].size(); ++i)
            parse_pre_tokenizer(j["pretokenizers"][i], out, origin,
                                where + ".pretokenizers[" + std::to_string(i) + "]");
    } else if (type == "Split") {
        tok::SplitRule rule;
        rule.literal = read_pattern(j, origin, where, true, rule.repeated);
        if (rule.repeated && rule.literal.empty())
            throw Error(origin + ": " + where + ": empty repeated pattern");
        const std::string behavior = get_string(j, "behavior", origin, where);
        if (behavior == "Removed")
            rule.behavior = tok::SplitBehavior::Removed;
        else if (behavior == "Isolated")
            rule.behavior = tok::SplitBehavior::Isolated;
        else if (behavior == "MergedWithPrevious")
            rule.behavior = tok::SplitBehavior::MergedWithPrevious;
        else if (behavior == "MergedWithNext")
            rule.behavior = tok::SplitBehavior::MergedWithNext;
        else if (behavior == "Contiguous")
            rule.behavior = tok::SplitBehavior::Contiguous;
        else
            throw Error(origin + ": " + where + ".behavior \"" + text_excerpt(behavior) +
                        "\" is not a Split behavior");
        if (get_bool(j, "invert", false, origin, where))
            throw Error(origin + ": " + where + ".invert is true, which MarkBase does not implement" +
                        kSupported);
        out.push_back(rule);
    } else {
        throw Error(origin + ": " + where + " is of type \"" + text_excerpt(type) +
                    "\"; only Split and Sequence are supported" + kSupported);
    }
}

void parse_decoder(const json& j, std::vector<tok::DecoderStep>& out, const std::string& origin,
                   const std::string& where) {
    const std::string type = type_of(j);
    if (type == "Sequence") {
        if (!j.contains("decoders") || !j["decoders"].is_array())
            throw Error(origin + ": " + where + ".decoders must be a list");
        for (std::size_t i = 0; i < j["decoders"].size(); ++i)
            parse_decoder(j["decoders"][i], out, origin, where + ".decoders[" + std::to_string(i) + "]");
    } else if (type == "Replace") {
        bool repeated = false;
        tok::DecoderStep step;
        step.kind = tok::DecoderStep::Replace;
        step.pattern = read_pattern(j, origin, where, false, repeated);
        step.content = get_string(j, "content", origin, where);
        out.push_back(step);
    } else if (type == "ByteFallback") {
        out.push_back({tok::DecoderStep::ByteFallback, "", ""});
    } else if (type == "Fuse") {
        out.push_back({tok::DecoderStep::Fuse, "", ""});
    } else {
        throw Error(origin + ": " + where + " is of type \"" + text_excerpt(type) +
                    "\"; only Replace, ByteFallback, Fuse and Sequence are supported" + kSupported);
    }
}

void build_model(const RawFile& f, Tokenizer::Impl& m) {
    const std::string& origin = m.origin;
    const json& model = f.model;
    const std::string type = model.contains("type") ? type_of(model) : (f.have_merges ? "BPE" : "");
    if (type != "BPE") {
        const std::string found =
            type.empty() ? "no model.type" : "model.type \"" + text_excerpt(type) + "\"";
        throw Error(origin + ": " + found + "; MarkBase reads only BPE tokenizers" + kSupported);
    }
    if (!f.have_vocab)
        throw Error(origin + (model.contains("vocab")
                                  ? ": model.vocab must be an object of token -> id"
                                  : ": model.vocab is missing (expected an object of token -> id)"));
    if (!f.have_merges)
        throw Error(origin + (model.contains("merges")
                                  ? ": model.merges must be a list of token pairs"
                                  : ": model.merges is missing (expected a list of token pairs)"));
    if (model.contains("dropout") && !model["dropout"].is_null() &&
        !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0))
        throw Error(origin +
                    ": model.dropout is set; BPE dropout makes tokenisation random and is not supported");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
        if (model.contains(key) && !model[key].is_null() &&
            !(model[key].is_string() && model[key].get<std::string>().empty()))
            throw Error(origin + ": model." + key + " is set, which MarkBase does not implement" +
                        kSupported);
    }
    tok::BpeOptions opt;
    if (model.contains("unk_token") && !model["unk_token"].is_null())
        opt.unk_token = get_string(model, "unk_token", origin, "model");
    opt.fuse_unk = get_bool(model, "fuse_unk", false, origin, "model");
    opt.byte_fallback = get_bool(model, "byte_fallback", false, origin, "model");
    opt.ignore_merges = get_bool(model, "ignore_merges", false, origin, "model");
    m.bpe.build(f.vocab, f.merges, opt, origin);
}

void build_added_tokens(const json& list, Tokenizer::Impl& m) {
    const std::string& origin = m.origin;
    if (!list.is_null() && !list.is_array()) throw Error(origin + ": added_tokens must be a list");
    const tok::Vocab& vocab = m.bpe.vocab();
    int max_added = -1;
    for (std::size_t i = 0; list.is_array() && i < list.size(); ++i) {
        const json& t = list[i];
        const std::string where = "added_tokens[" + std::to_string(i) + "]";
        if (!t.is_object()) throw Error(origin + ": " + where + " must be an object");
        tok::AddedToken a;
        a.content = get_string(t, "content", origin, where);
        a.special = get_bool(t, "special", false, origin, where);
        a.normalized = get_bool(t, "normalized", !a.special, origin, where);
        for (const char* flag : {"lstrip", "rstrip", "single_word"})
            if (get_bool(t, flag, false, origin, where))
                throw Error(origin + ": " + where + " (\"" + text_excerpt(a.content) + "\") sets " + flag +
                            ", which MarkBase does not implement" + kSupported);
        // As HF's AddedVocabulary: empty and repeated contents are ignored; the id is the vocabulary's when
        // the token is in it, else the next id past the vocabulary (the "id" written in the file is only a
        // hint).
        if (a.content.empty()) continue;
        bool seen = false;
        for (const auto& b : m.added) seen = seen || b.content == a.content;
        if (seen) continue;
        a.id = vocab.find(a.content);
        if (a.id < 0) {
            const int vsize = static_cast<int>(vocab.size());
            a.id = max_added < 0 ? vsize : (max_added >= vsize || vsize == 0 ? max_added + 1 : vsize);
        }
        max_added = std::max(max_added, a.id);
        m.added.push_back(a);
    }
    m.id_space = std::max(vocab.id_space(), max_added + 1);
    m.added_index.assign(m.id_space, -1);
    for (std::size_t i = 0; i < m.added.size(); ++i) {
        m.added_index[m.added[i].id] = static_cast<int>(i);
        tok::AddedToken& b = m.added[i];
        b.piece = b.normalized ? m.normalize(b.content) : b.content;
        if (b.normalized)
            m.normalized_trie.add(b.piece, b.id);
        else
            m.raw_trie.add(b.content, b.id);
    }
}

}  // namespace

Tokenizer Tokenizer::from_json(std::string_view text, const std::string& origin) {
    RawFile f = read_raw(text, origin);
    auto m = std::make_shared<Impl>();
    m->origin = origin;
    auto section = [&](const char* key) -> const json& {
        static const json null_json;
        return f.top.contains(key) ? f.top[key] : null_json;
    };
    if (!f.top.contains("model") && !f.have_model)
        throw Error(origin + ": no \"model\" section; this is not a tokenizer.json");
    if (f.top.contains("model"))
        throw Error(origin + ": \"model\" must be an object holding the BPE vocab and merges");
    build_model(f, *m);
    parse_normalizer(section("normalizer"), m->normalizer, origin, "normalizer");
    parse_pre_tokenizer(section("pre_tokenizer"), m->pre_tokenizer, origin, "pre_tokenizer");
    const json& dec = section("decoder");
    m->has_decoder = !dec.is_null();
    if (m->has_decoder) parse_decoder(dec, m->decoder, origin, "decoder");
    bool fused = false;
    for (const auto& step : m->decoder) {
        m->byte_fallback_decoder |= step.kind == tok::DecoderStep::ByteFallback;
        // After Fuse a Replace would see text across token boundaries, which streaming cannot reproduce.
        if (fused && step.kind != tok::DecoderStep::Fuse)
            throw Error(origin +
                        ": decoder has a Replace or ByteFallback after Fuse, which is not supported" +
                        kSupported);
        fused |= step.kind == tok::DecoderStep::Fuse;
    }
    m->id_space = m->bpe.vocab().id_space();
    build_added_tokens(section("added_tokens"), *m);
    return Tokenizer(std::move(m));
}

Tokenizer Tokenizer::load(const std::filesystem::path& path) {
    std::filesystem::path file = path;
    if (path_problem(path, true).empty()) {
        file = path / "tokenizer.json";
        if (path_missing(file)) throw Error(path.string() + ": this folder has no tokenizer.json");
    }
    // A FIFO, a device or a symlink loop is refused before it is opened (a FIFO blocks the open).
    if (const std::string why = path_problem(file); !why.empty())
        throw Error(file.string() + ": cannot open the tokenizer file: it " + why);
    return from_json(read_regular_file(file), file.string());
}

}  // namespace markbase
