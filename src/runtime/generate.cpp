#include "runtime/generate.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "model/error.h"
#include "runtime/timing.h"

namespace markbase {

void check_prompt(const Backend& be, const std::vector<int>& prompt, int64_t n_past) {
    if (prompt.empty()) throw Error("the prompt is empty: give at least one token (BOS is id 2)");
    const int64_t V = be.config().vocab_size;
    for (size_t i = 0; i < prompt.size(); ++i)
        if (prompt[i] < 0 || prompt[i] >= V)
            throw Error("prompt token " + std::to_string(i) + ": id " + std::to_string(prompt[i]) +
                        " is outside the vocabulary [0, " + std::to_string(V) + ")");
    if (n_past + static_cast<int64_t>(prompt.size()) > be.ctx_size())
        throw Error("the prompt has " + std::to_string(prompt.size()) + " tokens but the context holds " +
                    std::to_string(be.ctx_size() - n_past) + " more (set --ctx-size, at most " +
                    std::to_string(be.config().max_positions) + ")");
}

bool device_select_request(const SamplingParams& sp, const std::vector<int>& history, int64_t vocab,
                           int max_k, int max_ids, DeviceSelect* req) {
    req->k = sp.temperature == 0.0f ? 1 : sp.top_k;
    if (req->k < 1 || req->k > max_k) return false;
    penalty_window(history, sp, &req->pen_ids, &req->pen_counts);
    if (static_cast<int64_t>(req->pen_ids.size()) > max_ids ||
        (!req->pen_ids.empty() && (req->pen_ids.front() < 0 || req->pen_ids.back() >= vocab)))
        return false;
    req->repeat_penalty = sp.repeat_penalty;
    req->presence_penalty = sp.presence_penalty;
    req->frequency_penalty = sp.frequency_penalty;
    return true;
}

GenerateStats generate(Backend& be, const std::vector<int>& prompt, const GenerateOptions& opt,
                       const std::function<bool(int)>& on_token, std::vector<int>* out_ids) {
    GenerateStats st;
    st.prompt_tokens = static_cast<int>(prompt.size());
    check_prompt(be, prompt, be.n_past());
    opt.sampling.validate();
    Sampler sampler(opt.sampling);
    const int64_t V = be.config().vocab_size;
    std::vector<float> logits(V);
    std::vector<int> history(prompt);

    double t0 = now_s();
    be.eval(prompt.data(), static_cast<int64_t>(prompt.size()), logits.data(), false);
    st.prefill_s = now_s() - t0;
    st.stop_reason = "length";

    // After the prompt, a backend that selects on the device returns k candidates instead of the row (the
    // draw stays here, so the ids are exactly the host sampler's). Tuning::device_sampling (the backend's
    // max_select_k is then 0) or opt.device_select turns it off.
    const SamplingParams& sp = opt.sampling;
    const int max_k = opt.device_select ? be.max_select_k() : 0;
    DeviceSelect req;
    DeviceSelection sel;

    double t1 = now_s();
    for (int i = 0; opt.max_new_tokens < 0 || i < opt.max_new_tokens; ++i) {
        int id = -1;
        if (i > 0) {
            if (be.n_past() >= be.ctx_size()) {
                st.stop_reason = "context full";
                break;
            }
            const int last = history.back();
            if (!device_select_request(sp, history, V, max_k, be.max_select_penalty_ids(), &req))
                be.eval(&last, 1, logits.data(), false);
            else if (be.eval_select(last, req, &sel, logits.data()))
                id = sampler.sample_top(sel.top, sel.n_finite);
        }
        if (id < 0) id = sampler.sample(logits.data(), V, history);
        history.push_back(id);
        ++st.generated;
        if (out_ids) out_ids->push_back(id);
        const bool stop =
            !opt.ignore_eos && std::find(opt.stop_ids.begin(), opt.stop_ids.end(), id) != opt.stop_ids.end();
        if (!on_token(id)) {
            st.stop_reason = "callback";
            break;
        }
        if (stop) {
            st.stop_reason = "stop id";
            break;
        }
    }
    st.decode_s = now_s() - t1;
    return st;
}

std::string format_receipt(const GenerateStats& s, double bytes_per_token) {
    char buf[256];
    const int steps = std::max(0, s.generated - 1);
    const double ms = steps ? 1e3 * s.decode_s / steps : 0.0;
    int k = std::snprintf(buf, sizeof buf,
                          "prompt %d tok, prefill %.1f tok/s | decode %d tok, %.2f ms/tok, %.1f tok/s",
                          s.prompt_tokens, s.prefill_s > 0 ? s.prompt_tokens / s.prefill_s : 0.0, s.generated,
                          ms, ms > 0 ? 1e3 / ms : 0.0);
    if (bytes_per_token > 0 && ms > 0 && k > 0 && k < static_cast<int>(sizeof buf))
        std::snprintf(buf + k, sizeof buf - k, ", %.1f GB/s", bytes_per_token / (ms * 1e-3) / 1e9);
    return buf;
}

}  // namespace markbase
