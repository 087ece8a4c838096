// From a validated ApiRequest to the engine's GenerationRequest: the prompt rendered (chat: the Gemma 4
// template with the generation prompt) and encoded, checked against the vocabulary and the context, the
// sampling settings over the model's defaults, the stop ids.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/sampler.h"
#include "server/engine.h"
#include "server/openai_request.h"
#include "tokenizer/tokenizer.h"

namespace markbase::server {

// What the API layer knows of the model it serves.
struct ServedModel {
    std::string id;             // /v1/models and every response's "model": the checkpoint folder's name
    int64_t created = 0;        // unix time the server started (/v1/models "created")
    Tokenizer tokenizer;        // the folder's tokenizer.json
    SamplingParams defaults;    // generation_config.json's (or the serve flags'); a request overrides fields
    std::vector<int> stop_ids;  // the model's eos ids; chat adds the template's (<turn|> and the others)
};

// ApiError 400 for a prompt the model cannot take: a token id outside [0, vocab), a prompt that leaves no
// room in the context ("context_length_exceeded"), text the tokenizer refuses. Without a seed, the request
// gets a random one.
GenerationRequest build_generation(const ApiRequest& r, const ServedModel& m, int vocab, int64_t ctx_size);

// Tokens a completion may have when the request gives no max_tokens: OpenAI's 16 for /v1/completions; a
// chat reply runs to its end or to the context's.
constexpr int kDefaultCompletionTokens = 16;

}  // namespace markbase::server
