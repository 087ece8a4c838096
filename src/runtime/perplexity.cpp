#include "runtime/perplexity.h"

#include <algorithm>
#include <cmath>

#include "model/error.h"

namespace markbase {

PerplexityResult perplexity(Backend& be, const std::vector<int>& ids, int window, int bos_id) {
    if (window < 2) throw Error("perplexity: the window must hold at least 2 tokens");
    if (ids.empty()) throw Error("perplexity: no tokens to score");
    const int64_t V = be.config().vocab_size;
    PerplexityResult r;
    double nll = 0;
    std::vector<float> logits;
    for (size_t start = 0; start < ids.size(); start += static_cast<size_t>(window - 1)) {
        std::vector<int> w{bos_id};
        const size_t end = std::min(ids.size(), start + static_cast<size_t>(window - 1));
        w.insert(w.end(), ids.begin() + static_cast<long>(start), ids.begin() + static_cast<long>(end));
        if (w.size() < 2) break;
        be.reset();
        logits.resize(w.size() * V);
        be.eval(w.data(), static_cast<int64_t>(w.size()), logits.data(), true);
        for (size_t i = 1; i < w.size(); ++i) {
            const float* row = logits.data() + (i - 1) * V;
            const float mx = *std::max_element(row, row + V);
            double sum = 0;
            for (int64_t j = 0; j < V; ++j) sum += std::exp(static_cast<double>(row[j]) - mx);
            nll += std::log(sum) + mx - row[w[i]];
            ++r.predicted;
        }
        ++r.windows;
    }
    r.mean_nll = nll / static_cast<double>(r.predicted);
    r.ppl = std::exp(r.mean_nll);
    return r;
}

}  // namespace markbase
