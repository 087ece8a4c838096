// The generation loop: batched prefill of the prompt, then one token at a time through the cache, sampling
// each next id; plus the receipt every generating command prints.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "runtime/backend.h"
#include "runtime/sampler.h"

namespace markbase {

struct GenerateOptions {
    int max_new_tokens = 128;  // -n; < 0 = until a stop id or the context is full
    SamplingParams sampling;
    std::vector<int> stop_ids;  // generation ends after emitting one of these (it is reported, not printed)
    bool ignore_eos = false;
    // false: every token's whole logits row goes to the host sampler, even where the backend can select on
    // the device (bench's comparison; the backend's own setting is Tuning::device_sampling)
    bool device_select = true;
};

struct GenerateStats {
    int prompt_tokens = 0;
    int generated = 0;
    double prefill_s = 0;
    double decode_s = 0;      // time for generated-1 decode steps (the first token comes from the prefill)
    std::string stop_reason;  // "stop id", "length", "context full", "callback"
};

// Throws markbase::Error unless `prompt` can be fed to `be` after `n_past` cached positions: not empty,
// every id inside the vocabulary, and room for all of it in the context. generate() checks it first (with
// be.n_past()); a caller that prints or changes anything before generating checks it before that.
void check_prompt(const Backend& be, const std::vector<int>& prompt, int64_t n_past);

// The device-side selection (Backend::eval_select, SlotWork::select) for a sequence's next token: k (1 at
// temperature 0, else top_k), the penalties and the window of `history`. False where a backend taking at most
// max_k candidates and max_ids penalty ids cannot serve it (top_k 0 or too large, too long a window, or ids
// outside the vocabulary, which the host sampler names): the row goes to the host sampler then.
bool device_select_request(const SamplingParams& sp, const std::vector<int>& history, int64_t vocab,
                           int max_k, int max_ids, DeviceSelect* req);

// on_token(id) is called for each generated id (stop ids included); returning false stops generation.
GenerateStats generate(Backend& be, const std::vector<int>& prompt, const GenerateOptions& opt,
                       const std::function<bool(int)>& on_token, std::vector<int>* out_ids = nullptr);

// "prompt 27 tok, prefill 812.3 tok/s | decode 12 tok, 4.21 ms/tok, 237.5 tok/s" (+ GB/s when bytes given)
std::string format_receipt(const GenerateStats& s, double bytes_per_token = 0);

}  // namespace markbase
