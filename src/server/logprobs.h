// Log-probabilities as the OpenAI API reports them: log-softmax over the whole vocabulary of the logits
// divided by the request's temperature (temperature 0, greedy, reads as 1). The penalties and the top-k /
// top-p / min-p filters are not applied, so a token those filters removed still has a finite logprob and
// the alternatives are the model's own best guesses at that temperature (vLLM's default, raw logprobs of the
// tempered distribution). A -inf logit gives -inf.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace markbase::server {

struct Logprobs {
    float chosen = 0;                        // the sampled token's
    std::vector<std::pair<int, float>> top;  // the k most likely, logprob descending then id ascending
};

Logprobs compute_logprobs(const float* logits, int64_t vocab, float temperature, int chosen, int k);

}  // namespace markbase::server
