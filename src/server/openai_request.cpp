#include "server/openai_request.h"

#include <limits>

#include "loading/json_excerpt.h"
#include "model/error.h"
#include "server/openai_error.h"
#include "server/openai_fields.h"

namespace markbase::server {

using nlohmann::json;

namespace {

constexpr int64_t kIntMax = std::numeric_limits<int>::max();

// Fields asking for features markbase serve lacks are refused unless absent, null or "off", so a client
// never believes it got them.
void refuse_unsupported(const FieldReader& f) {
    for (const char* name : {"tools", "functions"})
        if (const json* v = f.get(name); v && !(v->is_array() && v->empty()))
            throw ApiError(400, std::string(name) + ": tool and function calling are not supported", name);
    if (const json* v = f.get("logit_bias"); v && !(v->is_object() && v->empty()))
        throw ApiError(400, "logit_bias: not supported", "logit_bias");
    if (const json* v = f.get("response_format")) {
        const json* type = v->is_object() ? FieldReader(*v, "response_format").get("type") : nullptr;
        if (!type || *type != "text")
            throw ApiError(400, "response_format: only {\"type\": \"text\"} is supported", "response_format");
    }
    if (const json* v = f.get("suffix"); v && !(v->is_string() && v->get<std::string>().empty()))
        throw ApiError(400, "suffix: not supported", "suffix");
    if (const auto best_of = f.integer("best_of", 1, kIntMax); best_of && *best_of != 1)
        throw ApiError(400, "best_of: only 1 is supported, found " + std::to_string(*best_of), "best_of");
}

std::vector<std::string> read_stop(const FieldReader& f) {
    const json* v = f.get("stop");
    if (!v) return {};
    const std::string expected =
        "a non-empty string or an array of at most " + std::to_string(kMaxStops) + " non-empty strings";
    if (v->is_string()) {
        if (v->get<std::string>().empty()) bad_field("stop", expected, *v);
        return {v->get<std::string>()};
    }
    if (!v->is_array() || v->size() > size_t(kMaxStops)) bad_field("stop", expected, *v);
    std::vector<std::string> stops;
    for (size_t i = 0; i < v->size(); ++i) {
        const json& s = (*v)[i];
        if (!s.is_string() || s.get<std::string>().empty())
            bad_field("stop[" + std::to_string(i) + "]", "a non-empty string", s);
        stops.push_back(s.get<std::string>());
    }
    return stops;
}

// The fields both endpoints share: streaming, length, sampling, stops, n.
void read_common(const FieldReader& f, ApiRequest& r) {
    if (const json* model = f.get("model"); model && !model->is_string())
        bad_field("model", "a string", *model);
    r.stream = f.boolean("stream").value_or(false);
    if (const json* so = f.get("stream_options")) {
        if (!so->is_object()) bad_field("stream_options", "an object", *so);
        if (!r.stream)
            throw ApiError(400, "stream_options: only allowed when stream is true", "stream_options");
        r.include_usage = FieldReader(*so, "stream_options").boolean("include_usage").value_or(false);
    }
    auto max_tokens = f.integer("max_tokens", 1, kIntMax);
    if (auto mct = f.integer("max_completion_tokens", 1, kIntMax)) max_tokens = mct;
    if (max_tokens) r.max_tokens = static_cast<int>(*max_tokens);
    auto as_float = [](std::optional<double> x) {
        return x ? std::optional<float>(static_cast<float>(*x)) : std::nullopt;
    };
    r.temperature = as_float(f.number("temperature", 0, 2));
    r.top_p = as_float(f.number("top_p", 0, 1, true));
    if (auto k = f.integer("top_k", -1, kIntMax)) r.top_k = *k < 0 ? 0 : static_cast<int>(*k);
    r.min_p = as_float(f.number("min_p", 0, 1));
    r.presence_penalty = as_float(f.number("presence_penalty", -2, 2));
    r.frequency_penalty = as_float(f.number("frequency_penalty", -2, 2));
    r.repetition_penalty = as_float(f.number("repetition_penalty", 0, 100, true));
    if (auto seed =
            f.integer("seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()))
        r.seed = static_cast<uint64_t>(*seed);
    r.stop = read_stop(f);
    r.ignore_eos = f.boolean("ignore_eos").value_or(false);
    if (auto n = f.integer("n", 1, kIntMax); n && *n != 1)
        throw ApiError(400, "n: only 1 choice per request is supported, found " + std::to_string(*n), "n");
}

// One part of an array content: {"type": "text", "text": "..."}.
std::string read_text_part(const json& part, const std::string& param) {
    if (!part.is_object())
        bad_field(param, "a content part object {\"type\": \"text\", \"text\": ...}", part);
    const FieldReader p(part, param);
    const auto type = p.string("type");
    if (!type) throw ApiError(400, p.param("type") + ": required (\"text\")", p.param("type"));
    if (*type != "text")
        bad_field(p.param("type"), "\"text\" (the only content part supported)", part["type"]);
    const auto text = p.string("text");
    if (!text) throw ApiError(400, p.param("text") + ": required for a text part", p.param("text"));
    return *text;
}

ChatMessage read_message(const json& m, size_t index, bool first) {
    const std::string param = "messages[" + std::to_string(index) + "]";
    if (!m.is_object()) bad_field(param, "a message object with role and content", m);
    const FieldReader f(m, param);
    const auto role = f.string("role");
    if (!role) throw ApiError(400, f.param("role") + ": required", f.param("role"));
    if (*role != "system" && *role != "developer" && *role != "user" && *role != "assistant")
        bad_field(f.param("role"), "one of \"system\", \"developer\", \"user\", \"assistant\"", m["role"]);
    if (const json* calls = f.get("tool_calls"); calls && !(calls->is_array() && calls->empty()))
        throw ApiError(400, f.param("tool_calls") + ": tool calls are not supported", f.param("tool_calls"));
    ChatMessage out;
    // the template reads system/developer as the system turn only first; later ones are system turns
    out.role = *role == "developer" && !first ? "system" : *role;
    const json* content = f.get("content");
    if (!content) {
        if (*role != "assistant") throw ApiError(400, f.param("content") + ": required", f.param("content"));
    } else if (content->is_string()) {
        out.content = content->get<std::string>();
    } else if (content->is_array()) {
        for (size_t i = 0; i < content->size(); ++i) {
            if (i) out.content += "\n";
            out.content += read_text_part((*content)[i], f.param("content") + "[" + std::to_string(i) + "]");
        }
    } else {
        bad_field(f.param("content"), "a string or an array of text parts", *content);
    }
    return out;
}

// prompt: a string, an array of token ids, or either of them alone in an array.
void read_prompt(const FieldReader& f, ApiRequest& r) {
    const json* p = f.get("prompt");
    const std::string expected = "a string or an array of token ids";
    if (!p) throw ApiError(400, "prompt: required (" + expected + ")", "prompt");
    const json* v = p;
    if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) v = &(*p)[0];
    if (v->is_string()) {
        r.prompt_text = v->get<std::string>();
        return;
    }
    if (!v->is_array() || v->empty() || (*v)[0].is_string() || (*v)[0].is_array())
        bad_field("prompt", "one prompt: " + expected, *p);  // several prompts: n > 1 is not supported
    for (size_t i = 0; i < v->size(); ++i) {
        const json& id = (*v)[i];
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > kIntMax)
            bad_field("prompt[" + std::to_string(i) + "]", "a token id (an integer >= 0)", id);
        r.prompt_ids.push_back(id.get<int>());
    }
    r.prompt_is_ids = true;
}

}  // namespace

size_t invalid_utf8_offset(std::string_view s) {
    size_t i = 0;
    while (i < s.size()) {
        const auto c = static_cast<unsigned char>(s[i]);
        size_t n = 0;
        uint32_t cp = 0, min = 0;
        if (c < 0x80) {
            ++i;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            n = 1, cp = c & 0x1F, min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            n = 2, cp = c & 0x0F, min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            n = 3, cp = c & 0x07, min = 0x10000;
        } else {
            return i;
        }
        if (i + n >= s.size()) return i;  // truncated sequence
        for (size_t k = 1; k <= n; ++k) {
            const auto cc = static_cast<unsigned char>(s[i + k]);
            if ((cc & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (cc & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += n + 1;
    }
    return std::string_view::npos;
}

json parse_request_body(std::string_view body) {
    if (const size_t bad = invalid_utf8_offset(body); bad != std::string_view::npos)
        throw ApiError(400, "request body: not valid UTF-8 (byte " + std::to_string(bad) + ")");
    json j;
    try {
        j = parse_json(body, "request body");
    } catch (const Error& e) {
        throw ApiError(400, e.what());
    }
    if (!j.is_object()) bad_field("request body", "a JSON object", j);
    return j;
}

ApiRequest parse_chat_request(const json& body) {
    const FieldReader f(body);
    ApiRequest r;
    r.kind = ApiKind::Chat;
    const json* msgs = f.get("messages");
    if (!msgs) throw ApiError(400, "messages: required (an array of messages)", "messages");
    if (!msgs->is_array() || msgs->empty()) bad_field("messages", "a non-empty array of messages", *msgs);
    for (size_t i = 0; i < msgs->size(); ++i) r.messages.push_back(read_message((*msgs)[i], i, i == 0));
    refuse_unsupported(f);
    read_common(f, r);
    const bool logprobs = f.boolean("logprobs").value_or(false);
    const auto top = f.integer("top_logprobs", 0, kMaxTopLogprobs);
    if (top && !logprobs) throw ApiError(400, "top_logprobs: needs logprobs set to true", "top_logprobs");
    if (logprobs) r.top_logprobs = static_cast<int>(top.value_or(0));
    return r;
}

ApiRequest parse_completion_request(const json& body) {
    const FieldReader f(body);
    ApiRequest r;
    r.kind = ApiKind::Completion;
    read_prompt(f, r);
    refuse_unsupported(f);
    read_common(f, r);
    if (const auto lp = f.integer("logprobs", 0, kMaxTopLogprobs)) r.top_logprobs = static_cast<int>(*lp);
    if (f.boolean("echo").value_or(false)) throw ApiError(400, "echo: only false is supported", "echo");
    return r;
}

}  // namespace markbase::server
