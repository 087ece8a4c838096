#include "runtime/generate.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "model/error.h"
#include "runtime/timing.h"

namespace markbase {

GenerateStats generate(Backend& be, const std::vector<int>& prompt, const GenerateOptions& opt,
                       const std::function<bool(int)>& on_token, std::vector<int>* out_ids) {
    GenerateStats st;
    st.prompt_tokens = static_cast<int>(prompt.size());
    if (prompt.empty()) throw Error("the prompt is empty: give at least one token (BOS is id 2)");
    if (be.n_past() + static_cast<int64_t>(prompt.size()) > be.ctx_size())
        throw Error("the prompt has " + std::to_string(prompt.size()) + " tokens but the context holds " +
                    std::to_string(be.ctx_size() - be.n_past()) + " more (set --ctx-size, at most " +
                    std::to_string(be.config().max_positions) + ")");
    opt.sampling.validate();
    Sampler sampler(opt.sampling);
    const int64_t V = be.config().vocab_size;
    std::vector<float> logits(V);
    std::vector<int> history(prompt);

    double t0 = now_s();
    be.eval(prompt.data(), static_cast<int64_t>(prompt.size()), logits.data(), false);
    st.prefill_s = now_s() - t0;
    st.stop_reason = "length";

    double t1 = now_s();
    for (int i = 0; opt.max_new_tokens < 0 || i < opt.max_new_tokens; ++i) {
        if (i > 0) {
            if (be.n_past() >= be.ctx_size()) {
                st.stop_reason = "context full";
                break;
            }
            const int last = history.back();
            be.eval(&last, 1, logits.data(), false);
        }
        const int id = sampler.sample(logits.data(), V, history);
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
