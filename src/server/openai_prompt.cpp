#include "server/openai_prompt.h"

#include <algorithm>
#include <random>

#include "model/error.h"
#include "server/openai_error.h"
#include "tokenizer/chat_format.h"

namespace markbase::server {

namespace {

std::vector<int> encode_prompt(const ApiRequest& r, const ServedModel& m, int vocab) {
    const char* param = r.kind == ApiKind::Chat ? "messages" : "prompt";
    std::vector<int> ids;
    try {
        if (r.kind == ApiKind::Chat) {
            ids = m.tokenizer.encode(render_gemma4_chat(r.messages, true));
        } else if (!r.prompt_is_ids) {
            ids.push_back(m.tokenizer.bos_id() >= 0 ? m.tokenizer.bos_id() : 2);
            m.tokenizer.encode_append(r.prompt_text, ids);
        }
    } catch (const Error& e) {
        throw ApiError(400, std::string(param) + ": " + e.what(), param);
    }
    if (r.prompt_is_ids) {
        for (size_t i = 0; i < r.prompt_ids.size(); ++i)
            if (r.prompt_ids[i] >= vocab)
                throw ApiError(400,
                               "prompt[" + std::to_string(i) + "]: expected a token id in [0, " +
                                   std::to_string(vocab - 1) + "], found " + std::to_string(r.prompt_ids[i]),
                               "prompt[" + std::to_string(i) + "]");
        ids = r.prompt_ids;
    }
    return ids;
}

SamplingParams sampling_for(const ApiRequest& r, const SamplingParams& defaults) {
    SamplingParams s = defaults;
    if (r.temperature) s.temperature = *r.temperature;
    if (r.top_p) s.top_p = *r.top_p;
    if (r.top_k) s.top_k = *r.top_k;
    if (r.min_p) s.min_p = *r.min_p;
    if (r.presence_penalty) s.presence_penalty = *r.presence_penalty;
    if (r.frequency_penalty) s.frequency_penalty = *r.frequency_penalty;
    if (r.repetition_penalty) s.repeat_penalty = *r.repetition_penalty;
    if (r.seed) {
        s.seed = *r.seed;
    } else {
        thread_local std::mt19937_64 rng{std::random_device{}()};
        s.seed = rng();
    }
    try {
        s.validate();  // the parser's ranges are inside the sampler's; this guards the defaults too
    } catch (const Error& e) {
        throw ApiError(400, e.what());
    }
    return s;
}

}  // namespace

GenerationRequest build_generation(const ApiRequest& r, const ServedModel& m, int vocab, int64_t ctx_size) {
    GenerationRequest g;
    g.prompt = encode_prompt(r, m, vocab);
    const char* param = r.kind == ApiKind::Chat ? "messages" : "prompt";
    const auto n = static_cast<int64_t>(g.prompt.size());
    if (n + 1 > ctx_size)  // room for the prompt and one generated token
        throw ApiError(400,
                       std::string(param) + ": the prompt has " + std::to_string(n) +
                           " tokens; a sequence's context holds " + std::to_string(ctx_size) +
                           " (prompt and reply together; serve --ctx-size)",
                       param, "context_length_exceeded");
    const int room = static_cast<int>(std::min<int64_t>(ctx_size - n, INT32_MAX));
    g.max_tokens = r.max_tokens.value_or(r.kind == ApiKind::Chat ? room : kDefaultCompletionTokens);
    g.sampling = sampling_for(r, m.defaults);
    g.stop = r.stop;
    g.stop_ids = m.stop_ids;
    if (r.kind == ApiKind::Chat)
        for (int id : default_stop_ids())
            if (std::find(g.stop_ids.begin(), g.stop_ids.end(), id) == g.stop_ids.end())
                g.stop_ids.push_back(id);
    g.ignore_eos = r.ignore_eos;
    g.top_logprobs = r.top_logprobs;
    return g;
}

}  // namespace markbase::server
