// Perplexity of a token sequence, as llama.cpp's perplexity tool and transformers compute it: each window of
// at most `window` tokens gets BOS prepended (unless it already starts with it), runs in one forward pass,
// and every position after the first predicts the next id; ppl = exp(mean NLL over all predicted ids).
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/backend.h"

namespace markbase {

struct PerplexityResult {
    double ppl = 0;
    double mean_nll = 0;
    int64_t predicted = 0;  // ids scored
    int windows = 0;
};

// ids: the text's tokens without BOS. window: tokens per forward pass including the BOS (>= 2).
PerplexityResult perplexity(Backend& be, const std::vector<int>& ids, int window, int bos_id);

}  // namespace markbase
