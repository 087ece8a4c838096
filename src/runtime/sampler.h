// Turning one row of logits into one token id.
//
// The chain, in order (llama.cpp's default chain where it matters, HF/vLLM's placement of temperature):
//   1. penalties   repeat (llama.cpp: logit > 0 ? logit / pen : logit * pen), then presence and frequency
//                  (OpenAI/vLLM: logit -= presence * [count > 0] + frequency * count), counted over the last
//                  repeat_last_n ids of the history (-1 = the whole history, 0 = no penalties at all).
//   2. greedy      temperature == 0: the argmax, ties to the lowest id; nothing below runs.
//   3. top_k       keep the k largest logits (ties to the lowest id), by partial selection, not a full sort.
//   4. temperature probabilities are softmax(logit / T) over the tokens top_k kept.
//   5. top_p       keep the shortest run of most-probable tokens whose mass reaches top_p (the token that
//                  crosses the line is kept).
//   6. min_p       keep tokens with p >= min_p * p_max.
//   7. renormalise and draw one token with std::mt19937_64 seeded by `seed`.
// Unlike llama.cpp, which applies temperature last, top_p and min_p see the tempered distribution (as in HF
// transformers and vLLM). top_p and min_p both keep a prefix of the same order (p descending, id ascending),
// so their result does not depend on which runs first; the code runs min_p first because it needs no sort.
//
// Reproducibility: the same seed gives the same ids on every platform. mt19937_64's sequence is fixed by the
// standard, its bits become a double by hand (53 bits * 2^-53, never std::uniform_real_distribution), and
// every sort and selection uses a total order (probability, then id), so no library's tie-breaking leaks into
// the result. What stays platform-dependent is the last bit of std::exp (and so a mass landing exactly on the
// top_p line).
//
// Cost at vocab 262144: one copy of the row, one exp per surviving token, an O(vocab) nth_element for top_k,
// and for top_p without top_k a selection by mass (partition, sum, narrow) that is O(vocab), never a full
// sort.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace markbase {

struct SamplingParams {
    float temperature = 1.0f;        // 0 => greedy (argmax; ties -> lowest id); must be finite and >= 0
    int top_k = 0;                   // 0 => off
    float top_p = 1.0f;              // 1 => off; must be in (0, 1]
    float min_p = 0.0f;              // 0 => off; keep tokens with p >= min_p * p_max; must be in [0, 1]
    float repeat_penalty = 1.0f;     // 1 => off; logit > 0 ? logit / pen : logit * pen; must be > 0
    float presence_penalty = 0.0f;   // subtracted once from every token that appeared in the window
    float frequency_penalty = 0.0f;  // subtracted count times (count = occurrences in the window)
    int repeat_last_n = 64;          // window for all three penalties: -1 = whole history, 0 = off
    uint64_t seed = 0;               // same seed => same output

    // Throws markbase::Error naming the offending flag (e.g. "--top-p") and the value found.
    void validate() const;
};

// Step 1 of the chain, in place. logits.size() is the vocabulary; a history id outside it throws.
void apply_penalties(std::vector<float>& logits, const std::vector<int>& history,
                     const SamplingParams& params);

// The penalty window of step 1 as distinct ids (ascending) and how often each occurs in it; empty when the
// penalties are off. What a backend that applies the penalties itself (DeviceSelect) is given.
void penalty_window(const std::vector<int>& history, const SamplingParams& params, std::vector<int>* ids,
                    std::vector<int>* counts);

class Sampler {
  public:
    explicit Sampler(const SamplingParams& params);  // validates params

    // logits: [vocab] fp32, not modified; history: ids so far (prompt + generated), read by the penalties.
    // Throws markbase::Error on NaN or +inf logits, or when every logit is -inf.
    int sample(const float* logits, int64_t vocab, const std::vector<int>& history);

    // The same draw from a device-side selection: `top` holds the largest min(top_k, n_finite) penalised
    // logits in descending order (ties: lower id first), n_finite the count of logits that are not -inf after
    // the penalties. Gives exactly what sample() gives on the full row with the same state. Needs top_k > 0
    // (or temperature 0, where top[0] is the answer).
    struct Top {
        float logit;
        int id;
    };
    int sample_top(const std::vector<Top>& top, int64_t n_finite);

    // What sample() / sample_top() would draw from, without drawing (the random state is not touched): the
    // ids that survive steps 1-6 with their renormalised probabilities, in the order the draw walks them
    // (`before` order, probability descending then id ascending, when top_k cut something; else id order).
    // Temperature 0 gives the argmax alone with p = 1. Same checks and errors as sample() / sample_top().
    struct Prob {
        int id;
        double p;
    };
    std::vector<Prob> distribution(const float* logits, int64_t vocab, const std::vector<int>& history);
    std::vector<Prob> distribution_top(const std::vector<Top>& top, int64_t n_finite);

    const SamplingParams& params() const { return params_; }

  private:
    struct Candidate {
        float w;  // logit, then exp((logit - max) / T): unnormalised probability
        int id;
    };
    // Steps 1-3 into cands_; true when cands_ is in `before` order (else id order).
    bool load_row(const float* logits, int64_t vocab, const std::vector<int>& history);
    bool load_top(const std::vector<Top>& top, int64_t n_finite);
    void filter(bool sorted);                 // steps 4-6 over cands_: weights, min_p, top_p
    int pick();                               // step 7: renormalise and draw
    std::vector<Prob> probabilities() const;  // cands_ after filter(), renormalised
    void cut_top_p(double target);            // top_p on unsorted candidates, O(vocab)

    SamplingParams params_;
    std::mt19937_64 rng_;
    std::vector<float> work_;         // [vocab] penalised copy of the logits
    std::vector<Candidate> cands_;    // surviving tokens, in id order unless top_k sorted them
    std::vector<Candidate> scratch_;  // top_p's working copy
};

}  // namespace markbase
