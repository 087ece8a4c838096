#include "loading/json_excerpt.h"

#include <utility>
#include <vector>

#include "model/error.h"

namespace markbase {

using nlohmann::json;

namespace {

constexpr size_t kExcerptChars = 80;

// Cuts `s` to at most `limit` bytes (on a UTF-8 character boundary) and marks the cut with "...".
void shorten(std::string& s, size_t limit) {
    if (s.size() <= limit) return;
    size_t cut = limit - 3;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
    s.resize(cut);
    s += "...";
}

std::string dump_flat(const json& scalar) {
    if (scalar.is_string()) {
        const auto& s = scalar.get_ref<const std::string&>();
        // dumping a string is not recursive; cut first so a 100 MB string is not copied whole
        return json(s.substr(0, kExcerptChars)).dump(-1, ' ', false, json::error_handler_t::replace);
    }
    return scalar.dump(-1, ' ', false, json::error_handler_t::replace);
}

// Nesting depth of a container (1 for [] or {}), with an explicit stack.
size_t depth_of(const json& v) {
    size_t deepest = 0;
    std::vector<std::pair<const json*, size_t>> todo{{&v, 1}};
    while (!todo.empty()) {
        auto [node, d] = todo.back();
        todo.pop_back();
        deepest = std::max(deepest, d);
        for (const json& child : *node)
            if (child.is_structured()) todo.emplace_back(&child, d + 1);
    }
    return deepest;
}

// Compact serialisation that stops once `limit` characters are written, with an explicit stack.
std::string bounded_dump(const json& v, size_t limit) {
    if (!v.is_structured()) return dump_flat(v);
    struct Frame {
        const json* node;
        json::const_iterator it;
        bool first;
    };
    std::string out;
    std::vector<Frame> stack;
    auto open = [&](const json& c) {
        out += c.is_array() ? '[' : '{';
        stack.push_back({&c, c.cbegin(), true});
    };
    open(v);
    while (!stack.empty() && out.size() <= limit) {
        Frame& f = stack.back();
        if (f.it == f.node->cend()) {
            out += f.node->is_array() ? ']' : '}';
            stack.pop_back();
            continue;
        }
        if (!f.first) out += ',';
        f.first = false;
        if (f.node->is_object()) out += dump_flat(json(f.it.key())) + ':';
        const json& child = *f.it;
        ++f.it;
        if (child.is_structured())
            open(child);  // invalidates f
        else
            out += dump_flat(child);
    }
    shorten(out, limit);
    return out;
}

// Where the parser is: one level per open container, the key (objects) or index (arrays) being read.
struct JsonPath {
    struct Level {
        bool array = false;
        std::string key;
        bool has_key = false;
        int64_t index = -1;
    };
    std::vector<Level> levels;
    std::string section;

    void child() {
        if (!levels.empty() && levels.back().array) ++levels.back().index;
    }
    std::string str() const {
        std::string out = section;
        int parts = 0;
        for (const Level& l : levels) {
            if (l.array ? l.index < 0 : !l.has_key) break;
            if (++parts > 8) {
                out += "...";
                break;
            }
            if (l.array)
                out += "[" + std::to_string(l.index) + "]";
            else
                out += (out.empty() ? "" : ".") + text_excerpt(l.key, 40);
        }
        return out;
    }
};

// nlohmann's what() without its "[json.exception.parse_error.101] " prefix.
std::string reason(const json::exception& e) {
    std::string s = e.what();
    if (s.rfind("[json.exception.", 0) == 0) {
        const size_t end = s.find("] ");
        if (end != std::string::npos) s.erase(0, end + 2);
    }
    return s;
}

}  // namespace

std::string json_excerpt(const json& v) {
    if (v.is_structured()) {
        const size_t depth = depth_of(v);
        if (depth > 8)
            return std::string(v.is_array() ? "an array" : "an object") + " nested " + std::to_string(depth) +
                   " deep: " + bounded_dump(v, 40);
    }
    return bounded_dump(v, kExcerptChars);
}

std::string text_excerpt(std::string_view s, size_t max) {
    std::string out;
    for (char c : s.substr(0, max + 1)) {
        if (static_cast<unsigned char>(c) < 0x20) {
            static const char* hex = "0123456789abcdef";
            out += "\\x";
            out += hex[(c >> 4) & 0xF];
            out += hex[c & 0xF];
        } else {
            out += c;
        }
    }
    shorten(out, max);
    return out;
}

json parse_json(std::string_view text, const std::string& file, const std::string& what,
                const std::string& section, const JsonEventHook& hook) {
    JsonPath path;
    path.section = section;
    json::parser_callback_t cb = [&](int depth, json::parse_event_t ev, json& parsed) {
        if (hook) hook(depth, ev, parsed);
        switch (ev) {
            case json::parse_event_t::object_start:
            case json::parse_event_t::array_start:
                path.child();
                if (path.levels.size() >= size_t(kMaxJsonDepth)) {
                    const std::string where = path.str();
                    throw Error(
                        file + ": " + (where.empty() ? "the JSON" : "field '" + where + "'") +
                        " nests more than " + std::to_string(kMaxJsonDepth) +
                        " levels deep (no real file nests more than a few; corrupt or hostile file?)");
                }
                path.levels.push_back({ev == json::parse_event_t::array_start, "", false, -1});
                break;
            case json::parse_event_t::key:
                path.levels.back().key = parsed.get<std::string>();
                path.levels.back().has_key = true;
                break;
            case json::parse_event_t::value:
                path.child();
                break;
            case json::parse_event_t::object_end:
            case json::parse_event_t::array_end:
                path.levels.pop_back();
                break;
        }
        return true;
    };
    try {
        return json::parse(text.data(), text.data() + text.size(), cb);
    } catch (const json::exception& e) {
        const std::string where = path.str();
        throw Error(file + ": " + (what.empty() ? "" : what + " is ") + "not valid JSON" +
                    (where.empty() ? "" : " at '" + where + "'") + ": " + reason(e));
    }
}

}  // namespace markbase
