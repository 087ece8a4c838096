#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>

#include "model/error.h"

namespace markbase {

namespace {

[[noreturn]] void bad_flag(const char* flag, double value, const char* expected) {
    std::ostringstream os;
    os << "invalid " << flag << " " << value << ": expected " << expected;
    throw Error(os.str());
}

// The total order used for every selection and sort: larger first, then lower id. Because no two candidates
// compare equal, nth_element and sort give the same result under every standard library.
template <class C>
bool before(const C& a, const C& b) {
    return a.w > b.w || (a.w == b.w && a.id < b.id);
}

// 53 random bits -> a double uniform in [0, 1), identical on every platform.
double uniform01(std::mt19937_64& rng) {
    return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

}  // namespace

void SamplingParams::validate() const {
    if (!(std::isfinite(temperature) && temperature >= 0.0f))
        bad_flag("--temperature", temperature, "a finite value >= 0 (0 = greedy)");
    if (top_k < 0) bad_flag("--top-k", top_k, "an integer >= 0 (0 = off)");
    if (!(top_p > 0.0f && top_p <= 1.0f)) bad_flag("--top-p", top_p, "a value in (0, 1] (1 = off)");
    if (!(min_p >= 0.0f && min_p <= 1.0f)) bad_flag("--min-p", min_p, "a value in [0, 1] (0 = off)");
    if (!(std::isfinite(repeat_penalty) && repeat_penalty > 0.0f))
        bad_flag("--repeat-penalty", repeat_penalty, "a finite value > 0 (1 = off)");
    if (!std::isfinite(presence_penalty)) bad_flag("--presence-penalty", presence_penalty, "a finite value");
    if (!std::isfinite(frequency_penalty))
        bad_flag("--frequency-penalty", frequency_penalty, "a finite value");
    if (repeat_last_n < -1) bad_flag("--repeat-last-n", repeat_last_n, "-1 (whole history), 0 (off) or > 0");
}

void apply_penalties(std::vector<float>& logits, const std::vector<int>& history,
                     const SamplingParams& params) {
    if (params.repeat_last_n == 0 || history.empty()) return;
    if (params.repeat_penalty == 1.0f && params.presence_penalty == 0.0f && params.frequency_penalty == 0.0f)
        return;
    const size_t n = params.repeat_last_n < 0
                         ? history.size()
                         : std::min(history.size(), static_cast<size_t>(params.repeat_last_n));
    const int64_t vocab = static_cast<int64_t>(logits.size());
    for (size_t i = history.size() - n; i < history.size(); ++i) {
        if (history[i] < 0 || history[i] >= vocab)
            throw Error("sampler: history contains token id " + std::to_string(history[i]) +
                        " outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }

    auto penalise = [&](int id, int count) {
        float& l = logits[static_cast<size_t>(id)];
        l = l > 0.0f ? l / params.repeat_penalty : l * params.repeat_penalty;
        // one rounding, spelled out: a compiler may or may not contract a*b+c, and a device-side copy of this
        // step (CudaModel::decode_select) must give the same float
        l -= std::fma(params.frequency_penalty, static_cast<float>(count), params.presence_penalty);
    };

    // Usual windows (64) sort a few ids; a whole long history counts into a dense table instead.
    if (n <= 4096) {
        std::vector<int> ids, counts;
        penalty_window(history, params, &ids, &counts);
        for (size_t i = 0; i < ids.size(); ++i) penalise(ids[i], counts[i]);
    } else {
        std::vector<int> counts(logits.size(), 0);
        std::vector<int> seen;
        for (size_t i = history.size() - n; i < history.size(); ++i) {
            if (counts[static_cast<size_t>(history[i])]++ == 0) seen.push_back(history[i]);
        }
        for (int id : seen) penalise(id, counts[static_cast<size_t>(id)]);
    }
}

void penalty_window(const std::vector<int>& history, const SamplingParams& params, std::vector<int>* ids,
                    std::vector<int>* counts) {
    ids->clear();
    counts->clear();
    if (params.repeat_last_n == 0 || history.empty()) return;
    if (params.repeat_penalty == 1.0f && params.presence_penalty == 0.0f && params.frequency_penalty == 0.0f)
        return;
    const size_t n = params.repeat_last_n < 0
                         ? history.size()
                         : std::min(history.size(), static_cast<size_t>(params.repeat_last_n));
    std::vector<int> w(history.end() - static_cast<std::ptrdiff_t>(n), history.end());
    std::sort(w.begin(), w.end());
    for (size_t a = 0; a < w.size();) {
        size_t b = a;
        while (b < w.size() && w[b] == w[a]) ++b;
        ids->push_back(w[a]);
        counts->push_back(static_cast<int>(b - a));
        a = b;
    }
}

// Without top_k the candidates are in id order, and a full sort of 262144 would dominate the step. Instead,
// select by mass on a copy: partition at a split point, sum the upper side, and keep narrowing to the side
// that holds the crossing token (the first split tries a prefix of 64, the common peaked case; then halves),
// so the cost is O(vocab). The crossing token fixes a cutoff in the total order; filtering cands_ against it
// keeps them in id order, so the draw never depends on how a library arranged the partitions.
void Sampler::cut_top_p(double target) {
    scratch_ = cands_;
    size_t lo = 0, hi = scratch_.size();  // the crossing token is in [lo, hi); acc = mass of [0, lo)
    double acc = 0.0;
    size_t split = std::min<size_t>(64, hi / 2);
    while (hi - lo > 64) {
        const auto mid = scratch_.begin() + static_cast<std::ptrdiff_t>(lo + split);
        std::nth_element(scratch_.begin() + static_cast<std::ptrdiff_t>(lo), mid,
                         scratch_.begin() + static_cast<std::ptrdiff_t>(hi), before<Candidate>);
        double mass = 0.0;
        for (auto it = scratch_.begin() + static_cast<std::ptrdiff_t>(lo); it != mid; ++it) mass += it->w;
        if (acc + mass >= target) {
            hi = lo + split;
        } else {
            acc += mass;
            lo += split;
        }
        split = (hi - lo) / 2;
    }
    const auto first = scratch_.begin() + static_cast<std::ptrdiff_t>(lo);
    const auto last = scratch_.begin() + static_cast<std::ptrdiff_t>(hi);
    std::sort(first, last, before<Candidate>);
    auto cut = last - 1;  // if rounding never reaches the target, everything up to hi stays
    for (auto it = first; it != last; ++it) {
        acc += it->w;
        if (acc >= target) {
            cut = it;
            break;
        }
    }
    const Candidate cutoff = *cut;
    cands_.erase(
        std::remove_if(cands_.begin(), cands_.end(), [&](const Candidate& c) { return before(cutoff, c); }),
        cands_.end());
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {
    params_.validate();
}

// Steps 1-3 on a full row: check it, copy and penalise it, and leave the tokens top_k keeps in cands_.
// Returns whether cands_ is in `before` order (top_k cut something) rather than id order. At temperature 0
// cands_ holds the argmax alone (ties: the lowest id).
bool Sampler::load_row(const float* logits, int64_t vocab, const std::vector<int>& history) {
    if (logits == nullptr || vocab <= 0)
        throw Error("sampler: expected a logits row of vocab > 0, got " + std::to_string(vocab));
    const size_t V = static_cast<size_t>(vocab);

    work_.assign(logits, logits + V);
    // One branch-free pass (it vectorises); the slow pass that names the id runs only when something is
    // wrong.
    float hi = -INFINITY;
    bool bad = false;
    for (size_t i = 0; i < V; ++i) {
        const float l = work_[i];
        bad |= !(l < INFINITY);  // NaN or +inf
        hi = l > hi ? l : hi;
    }
    if (bad) {
        for (size_t i = 0; i < V; ++i) {
            if (std::isnan(work_[i])) throw Error("sampler: logits contain NaN at id " + std::to_string(i));
            if (work_[i] == INFINITY) throw Error("sampler: logits contain +inf at id " + std::to_string(i));
        }
    }
    if (hi == -INFINITY) throw Error("sampler: every logit is -inf; nothing to sample");

    apply_penalties(work_, history, params_);

    cands_.clear();
    if (params_.temperature == 0.0f) {
        size_t best = 0;
        for (size_t i = 1; i < V; ++i)
            if (work_[i] > work_[best]) best = i;  // strict: ties keep the lowest id
        cands_.push_back({work_[best], static_cast<int>(best)});
        return true;
    }

    // Candidates: every token that can still be drawn (-inf is a mask and never can).
    for (size_t i = 0; i < V; ++i)
        if (work_[i] != -INFINITY) cands_.push_back({work_[i], static_cast<int>(i)});
    if (cands_.empty()) throw Error("sampler: every logit is -inf after the penalties; nothing to sample");

    if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < cands_.size()) {
        const auto kth = cands_.begin() + params_.top_k;
        std::nth_element(cands_.begin(), kth, cands_.end(), before<Candidate>);
        cands_.resize(static_cast<size_t>(params_.top_k));
        std::sort(cands_.begin(), cands_.end(), before<Candidate>);
        return true;
    }
    return false;
}

// load_row's result from a device-side selection: the same cands_ in the same order.
bool Sampler::load_top(const std::vector<Top>& top, int64_t n_finite) {
    if (top.empty() || n_finite <= 0)
        throw Error("sampler: every logit is -inf after the penalties; nothing to sample");
    cands_.clear();
    if (params_.temperature == 0.0f) {
        cands_.push_back({top.front().logit, top.front().id});
        return true;
    }
    if (params_.top_k <= 0) throw Error("internal: sample_top needs top_k > 0");
    const size_t want = static_cast<size_t>(std::min<int64_t>(params_.top_k, n_finite));
    if (top.size() != want)
        throw Error("internal: sample_top got " + std::to_string(top.size()) + " candidates, expected " +
                    std::to_string(want));
    for (const Top& t : top) cands_.push_back({t.logit, t.id});
    // load_row sorts only when top_k actually cut something; otherwise its candidates stay in id order.
    const bool sorted = static_cast<size_t>(params_.top_k) < static_cast<size_t>(n_finite);
    if (!sorted)
        std::sort(cands_.begin(), cands_.end(),
                  [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
    return sorted;
}

int Sampler::sample(const float* logits, int64_t vocab, const std::vector<int>& history) {
    const bool sorted = load_row(logits, vocab, history);
    if (params_.temperature == 0.0f) return cands_.front().id;
    filter(sorted);
    return pick();
}

int Sampler::sample_top(const std::vector<Top>& top, int64_t n_finite) {
    const bool sorted = load_top(top, n_finite);
    if (params_.temperature == 0.0f) return cands_.front().id;
    filter(sorted);
    return pick();
}

std::vector<Sampler::Prob> Sampler::distribution(const float* logits, int64_t vocab,
                                                 const std::vector<int>& history) {
    const bool sorted = load_row(logits, vocab, history);
    if (params_.temperature != 0.0f) filter(sorted);
    return probabilities();
}

std::vector<Sampler::Prob> Sampler::distribution_top(const std::vector<Top>& top, int64_t n_finite) {
    const bool sorted = load_top(top, n_finite);
    if (params_.temperature != 0.0f) filter(sorted);
    return probabilities();
}

std::vector<Sampler::Prob> Sampler::probabilities() const {
    if (params_.temperature == 0.0f) return {{cands_.front().id, 1.0}};
    double total = 0.0;
    for (const Candidate& c : cands_) total += c.w;
    std::vector<Prob> out;
    out.reserve(cands_.size());
    for (const Candidate& c : cands_) out.push_back({c.id, c.w / total});
    return out;
}

void Sampler::filter(bool sorted) {
    // Temperature and softmax. Subtracting the max before dividing keeps tiny T from overflowing to inf.
    float max_logit = cands_[0].w;
    for (const Candidate& c : cands_) max_logit = std::max(max_logit, c.w);
    const float inv_t = 1.0f / params_.temperature;
    double z = 0.0;
    for (Candidate& c : cands_) {
        c.w = std::exp((c.w - max_logit) * inv_t);
        z += c.w;
    }

    // min_p: p >= min_p * p_max, and p_max's weight is exp(0) = 1. remove_if keeps the order (and `sorted`).
    if (params_.min_p > 0.0f) {
        const float threshold = params_.min_p;
        cands_.erase(
            std::remove_if(cands_.begin(), cands_.end(), [&](const Candidate& c) { return c.w < threshold; }),
            cands_.end());
    }

    // top_p over the mass z of the tokens top_k kept: keep the shortest `before`-ordered prefix whose mass
    // reaches top_p * z.
    if (params_.top_p < 1.0f) {
        const double target = static_cast<double>(params_.top_p) * z;
        if (sorted) {
            double cum = 0.0;
            size_t keep = 0;
            while (keep < cands_.size() && cum < target) cum += cands_[keep++].w;
            cands_.resize(std::max<size_t>(keep, 1));
        } else {
            cut_top_p(target);
        }
    }
}

int Sampler::pick() {
    // Renormalise over the survivors and draw.
    double total = 0.0;
    for (const Candidate& c : cands_) total += c.w;
    const double r = uniform01(rng_) * total;
    double acc = 0.0;
    for (const Candidate& c : cands_) {
        acc += c.w;
        if (r < acc) return c.id;
    }
    // Rounding left r at the very top: the last token with any weight.
    for (auto it = cands_.rbegin(); it != cands_.rend(); ++it)
        if (it->w > 0.0f) return it->id;
    return cands_.front().id;
}

}  // namespace markbase
