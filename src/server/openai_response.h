// OpenAI's response shapes: the JSON of a finished chat or text completion, and the server-sent events of a
// streaming one ("data: {...}\n\n" chunks, the first carrying the role, text deltas, a chunk with the
// finish_reason, an optional usage chunk with empty choices, then "data: [DONE]\n\n").
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/engine.h"
#include "server/openai_error.h"
#include "server/openai_request.h"
#include "tokenizer/tokenizer.h"

namespace markbase::server {

struct ResponseMeta {
    ApiKind kind = ApiKind::Chat;
    std::string id;  // "chatcmpl-..." or "cmpl-..."
    std::string model;
    int64_t created = 0;         // unix seconds
    bool logprobs = false;       // the request asked for logprobs
    bool include_usage = false;  // streaming: "usage": null on each chunk and a usage chunk at the end
};

// "chatcmpl-" or "cmpl-" and 24 random hex digits.
std::string new_response_id(ApiKind kind);

// What a non-streaming request collected by its end.
struct Reply {
    std::string text;
    std::vector<TokenEvent> tokens;  // kept for logprobs only
    FinishReason reason = FinishReason::Stop;
    Usage usage;
};

const char* api_finish_reason(FinishReason r);  // "stop" or "length" (cancelled and error never reach a body)
nlohmann::json usage_json(const Usage& u);      // {prompt_tokens, completion_tokens, total_tokens}

// chat.completion or text_completion, with usage.
nlohmann::json completion_response(const ResponseMeta& meta, const Reply& reply, const Tokenizer& tok);

// One SSE event; invalid UTF-8 in token texts becomes U+FFFD rather than an exception.
std::string sse_event(const nlohmann::json& j);
std::string sse_first_chunk(const ResponseMeta& meta);  // chat: delta {"role": "assistant", "content": ""}
// A text delta; `token` adds its logprobs when the request asked for them (nullptr: none), `text_offset`
// is where `text` starts in the whole completion (the completions API's logprobs.text_offset).
std::string sse_text_chunk(const ResponseMeta& meta, const std::string& text, const TokenEvent* token,
                           size_t text_offset, const Tokenizer& tok);
std::string sse_finish_chunk(const ResponseMeta& meta, FinishReason reason);
std::string sse_usage_chunk(const ResponseMeta& meta, const Usage& usage);
std::string sse_error(const ApiError& e);  // data: {"error": {...}}
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

// JSON text for a response body (invalid UTF-8 replaced, never thrown).
std::string dump_json(const nlohmann::json& j);

}  // namespace markbase::server
