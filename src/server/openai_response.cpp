#include "server/openai_response.h"

#include <random>

namespace markbase::server {

using nlohmann::json;

namespace {

const char* object_name(const ResponseMeta& m, bool chunk) {
    if (m.kind == ApiKind::Completion) return "text_completion";
    return chunk ? "chat.completion.chunk" : "chat.completion";
}

json envelope(const ResponseMeta& m, bool chunk) {
    return {{"id", m.id}, {"object", object_name(m, chunk)}, {"created", m.created}, {"model", m.model}};
}

// The text one token stands for alone (its piece when it does not decode by itself).
std::string token_string(const Tokenizer& tok, int id) {
    try {
        const int ids[1] = {id};
        return tok.decode(ids);
    } catch (...) {
        return std::string(tok.token_text(id));
    }
}

json token_bytes(const std::string& s) {
    json b = json::array();
    for (unsigned char c : s) b.push_back(int(c));
    return b;
}

// chat: {"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}
json chat_logprob(const TokenEvent& t, const Tokenizer& tok) {
    const std::string s = token_string(tok, t.id);
    json top = json::array();
    for (size_t i = 0; i < t.top.size(); ++i) {
        const std::string alt =
            i < t.top_text.size() ? t.top_text[i].first : token_string(tok, t.top[i].first);
        top.push_back({{"token", alt}, {"logprob", t.top[i].second}, {"bytes", token_bytes(alt)}});
    }
    return {{"token", s}, {"logprob", t.logprob}, {"bytes", token_bytes(s)}, {"top_logprobs", top}};
}

// completions: parallel arrays tokens, token_logprobs, top_logprobs ({text: logprob}), text_offset
json completion_logprobs(const std::vector<const TokenEvent*>& tokens, size_t first_offset,
                         const Tokenizer& tok) {
    json j = {{"tokens", json::array()},
              {"token_logprobs", json::array()},
              {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
    size_t offset = first_offset;
    for (const TokenEvent* t : tokens) {
        j["tokens"].push_back(token_string(tok, t->id));
        j["token_logprobs"].push_back(t->logprob);
        json top = json::object();
        for (size_t i = 0; i < t->top.size(); ++i)
            top[i < t->top_text.size() ? t->top_text[i].first : token_string(tok, t->top[i].first)] =
                t->top[i].second;
        j["top_logprobs"].push_back(top);
        j["text_offset"].push_back(offset);
        offset += t->text.size();
    }
    return j;
}

json logprobs_of(const ResponseMeta& m, const std::vector<const TokenEvent*>& tokens, size_t offset,
                 const Tokenizer& tok) {
    if (!m.logprobs) return nullptr;
    if (m.kind == ApiKind::Completion) return completion_logprobs(tokens, offset, tok);
    json content = json::array();
    for (const TokenEvent* t : tokens) content.push_back(chat_logprob(*t, tok));
    return {{"content", content}};
}

json chunk_choice(const ResponseMeta& m, const std::string& text, bool with_text) {
    json c = {{"index", 0}};
    if (m.kind == ApiKind::Chat)
        c["delta"] = with_text ? json{{"content", text}} : json::object();
    else
        c["text"] = text;
    c["logprobs"] = nullptr;
    c["finish_reason"] = nullptr;
    return c;
}

json chunk(const ResponseMeta& m, json choice) {
    json j = envelope(m, true);
    j["choices"] = json::array({std::move(choice)});
    if (m.include_usage) j["usage"] = nullptr;
    return j;
}

}  // namespace

std::string new_response_id(ApiKind kind) {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    static const char* hex = "0123456789abcdef";
    std::string id = kind == ApiKind::Chat ? "chatcmpl-" : "cmpl-";
    for (int i = 0; i < 24; ++i) id += hex[rng() & 15];
    return id;
}

const char* api_finish_reason(FinishReason r) {
    return r == FinishReason::Length ? "length" : "stop";
}

json usage_json(const Usage& u) {
    return {{"prompt_tokens", u.prompt_tokens},
            {"completion_tokens", u.completion_tokens},
            {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

json completion_response(const ResponseMeta& meta, const Reply& reply, const Tokenizer& tok) {
    json j = envelope(meta, false);
    std::vector<const TokenEvent*> tokens;
    for (const TokenEvent& t : reply.tokens) tokens.push_back(&t);
    json choice = {{"index", 0}};
    if (meta.kind == ApiKind::Chat)
        choice["message"] = {{"role", "assistant"}, {"content", reply.text}};
    else
        choice["text"] = reply.text;
    choice["logprobs"] = logprobs_of(meta, tokens, 0, tok);
    choice["finish_reason"] = api_finish_reason(reply.reason);
    j["choices"] = json::array({choice});
    j["usage"] = usage_json(reply.usage);
    return j;
}

std::string dump_json(const json& j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string sse_event(const json& j) {
    return "data: " + dump_json(j) + "\n\n";
}

std::string sse_first_chunk(const ResponseMeta& meta) {
    json c = chunk_choice(meta, "", false);
    c["delta"] = {{"role", "assistant"}, {"content", ""}};
    return sse_event(chunk(meta, c));
}

std::string sse_text_chunk(const ResponseMeta& meta, const std::string& text, const TokenEvent* token,
                           size_t text_offset, const Tokenizer& tok) {
    json c = chunk_choice(meta, text, true);
    if (token) c["logprobs"] = logprobs_of(meta, {token}, text_offset, tok);
    return sse_event(chunk(meta, c));
}

std::string sse_finish_chunk(const ResponseMeta& meta, FinishReason reason) {
    json c = chunk_choice(meta, "", false);
    c["finish_reason"] = api_finish_reason(reason);
    return sse_event(chunk(meta, c));
}

std::string sse_usage_chunk(const ResponseMeta& meta, const Usage& usage) {
    json j = envelope(meta, true);
    j["choices"] = json::array();
    j["usage"] = usage_json(usage);
    return sse_event(j);
}

std::string sse_error(const ApiError& e) {
    return sse_event(error_body(e));
}

}  // namespace markbase::server
