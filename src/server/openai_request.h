// The OpenAI request bodies markbase serve takes, parsed and validated into plain structs: POST
// /v1/chat/completions and POST /v1/completions. Nothing here knows the model: openai_prompt.h turns an
// ApiRequest into the engine's GenerationRequest. Every problem is an ApiError 400 naming the field.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/chat_format.h"

namespace markbase::server {

enum class ApiKind { Chat, Completion };

struct ApiRequest {
    ApiKind kind = ApiKind::Chat;
    std::vector<ChatMessage> messages;  // chat: roles system, developer, user, assistant; text contents
    std::string prompt_text;            // completions: a text prompt (BOS is prepended) ...
    std::vector<int> prompt_ids;        // ... or token ids, as given
    bool prompt_is_ids = false;
    bool stream = false;
    bool include_usage = false;                                // stream_options.include_usage
    std::optional<int> max_tokens;                             // max_tokens or max_completion_tokens
    std::optional<float> temperature;                          // [0, 2]
    std::optional<float> top_p;                                // (0, 1]
    std::optional<int> top_k;                                  // >= 0 (-1 and 0: off)
    std::optional<float> min_p;                                // [0, 1]
    std::optional<float> presence_penalty, frequency_penalty;  // [-2, 2]
    std::optional<float> repetition_penalty;                   // (0, 100]
    std::optional<uint64_t> seed;
    std::vector<std::string> stop;  // at most 4, none empty
    bool ignore_eos = false;  // vLLM's extension: stop ids do not end the reply (fixed-length benchmarks)
    int top_logprobs = -1;    // -1: no logprobs; else 0..20 alternatives per token
};

// Largest request body parse_request_body is given (the HTTP layer refuses larger ones with 413).
constexpr size_t kMaxBodyBytes = 4u << 20;
constexpr int kMaxStops = 4;
constexpr int kMaxTopLogprobs = 20;

// The body as a JSON object. ApiError 400 when it is not valid UTF-8 (naming the byte offset), not JSON,
// nested absurdly deep, or not an object.
nlohmann::json parse_request_body(std::string_view body);

ApiRequest parse_chat_request(const nlohmann::json& body);
ApiRequest parse_completion_request(const nlohmann::json& body);

// The offset of the first byte that breaks UTF-8 (overlong forms, surrogates and code points past U+10FFFF
// included), or npos when `s` is valid.
size_t invalid_utf8_offset(std::string_view s);

}  // namespace markbase::server
