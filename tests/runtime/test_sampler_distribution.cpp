// The sampler's filtered distribution against an independent reference, and its draws against that
// distribution.
//
// Sampler::distribution / distribution_top give what the draw walks after steps 1-6 of the chain. The
// reference below recomputes it from the definitions, in double, with a full sort, so both top_p branches of
// the sampler are checked token by token: the sorted one, taken whenever top_k cut something (Gemma's default
// top_k 64 + top_p 0.95), and the O(vocab) selection by mass, taken without top_k. A chi-square test then
// checks that sample() and sample_top() draw with exactly those probabilities.
//
// Rows are built on a coarse grid of logits (multiples of 1/64 at the finest): equal logits are exact ties,
// which are common, so the top_p line often falls inside a run of ties; distinct logits are far enough apart
// that no two round to the same float weight, so the sampler's order (float) and the reference's (double)
// agree. A row whose mass lands too close to a min_p or top_p line for float rounding to be ruled out is
// skipped, and counted; the exact cases are built by hand in TopPKeepsTheTokenThatReachesTheLineExactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "runtime/sampler.h"

namespace markbase {
namespace {

using Prob = Sampler::Prob;

// Rows closer than this (relative) to a min_p or top_p line are ambiguous: the sampler sums float weights,
// whose rounding moves a mass by ~1e-7 relative (more at temperatures other than 1).
constexpr double kMargin = 1e-5;

struct Reference {
    std::vector<Prob> probs;   // survivors, probability descending then id ascending
    double margin = INFINITY;  // relative distance of the closest min_p or top_p decision to its line
};

// Steps 1-6 straight from their definitions, in double: penalties, top_k by a full sort, softmax(logit / T)
// over the kept tokens, min_p (p >= min_p * p_max) and top_p (the shortest prefix whose mass reaches top_p
// of the top_k-kept mass, the crossing token kept) each as a prefix of that sort, the shorter prefix wins,
// renormalised.
Reference reference(std::vector<float> logits, const std::vector<int>& history, const SamplingParams& prm) {
    apply_penalties(logits, history, prm);  // checked exactly by PenaltiesChangeLogitsExactlyAsSpecified
    Reference ref;
    const auto top = std::max_element(logits.begin(), logits.end());  // the first of equal maxima
    if (prm.temperature == 0.0f) {
        ref.probs = {{static_cast<int>(top - logits.begin()), 1.0}};
        return ref;
    }
    const double t = prm.temperature, lmax = *top;
    std::vector<Prob> toks;  // p: unnormalised until top_k is applied
    for (size_t i = 0; i < logits.size(); ++i)
        if (logits[i] != -INFINITY) toks.push_back({static_cast<int>(i), std::exp((logits[i] - lmax) / t)});
    std::sort(toks.begin(), toks.end(),
              [](const Prob& a, const Prob& b) { return a.p > b.p || (a.p == b.p && a.id < b.id); });
    if (prm.top_k > 0 && toks.size() > static_cast<size_t>(prm.top_k))
        toks.resize(static_cast<size_t>(prm.top_k));
    double z = 0.0;
    for (const Prob& x : toks) z += x.p;
    for (Prob& x : toks) x.p /= z;

    size_t n_min_p = toks.size();
    if (prm.min_p > 0.0f) {
        const double line = prm.min_p * toks.front().p;
        for (const Prob& x : toks) ref.margin = std::min(ref.margin, std::abs(x.p - line) / line);
        n_min_p = static_cast<size_t>(
            std::count_if(toks.begin(), toks.end(), [&](const Prob& x) { return x.p >= line; }));
    }
    size_t n_top_p = toks.size();
    if (prm.top_p < 1.0f) {
        const double target = prm.top_p;
        std::vector<double> cum(toks.size() + 1, 0.0);  // cum[n]: mass of the first n
        for (size_t i = 0; i < toks.size(); ++i) cum[i + 1] = cum[i] + toks[i].p;
        size_t n = 1;
        while (n < toks.size() && cum[n] < target) ++n;
        n_top_p = n;
        ref.margin = std::min(ref.margin, std::abs(cum[n] - target) / target);
        ref.margin = std::min(ref.margin, std::abs(cum[n - 1] - target) / target);
    }
    toks.resize(std::min(n_min_p, n_top_p));
    double kept = 0.0;
    for (const Prob& x : toks) kept += x.p;
    for (Prob& x : toks) x.p /= kept;
    ref.probs = std::move(toks);
    return ref;
}

// The sampler's distribution (in the order its draw walks) against the reference: the same survivors, each
// probability within 1e-6 relative, and the walk order sampler.h documents (probability descending then id
// ascending when top_k cut something, `sorted`; else ascending ids).
::testing::AssertionResult same_distribution(const std::vector<Prob>& got, const Reference& ref,
                                             bool sorted) {
    auto by_id = [](std::vector<Prob> v) {
        std::sort(v.begin(), v.end(), [](const Prob& a, const Prob& b) { return a.id < b.id; });
        return v;
    };
    const std::vector<Prob> a = by_id(got), b = by_id(ref.probs);
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
        if (a[i].id != b[i].id)
            return ::testing::AssertionFailure()
                   << "survivors differ (" << a.size() << " vs the reference's " << b.size()
                   << "): sampler id " << a[i].id << ", reference id " << b[i].id << " at rank " << i;
    if (a.size() != b.size())
        return ::testing::AssertionFailure()
               << a.size() << " survivors, the reference has " << b.size() << "; first extra id "
               << (a.size() > b.size() ? a[b.size()].id : b[a.size()].id);
    for (size_t i = 0; i < a.size(); ++i)
        if (!(std::abs(a[i].p - b[i].p) <= 1e-6 * b[i].p + 1e-12))
            return ::testing::AssertionFailure()
                   << "id " << a[i].id << ": p " << a[i].p << ", reference " << b[i].p;
    const std::vector<Prob>& order = sorted ? ref.probs : b;
    for (size_t i = 0; i < got.size(); ++i)
        if (got[i].id != order[i].id)
            return ::testing::AssertionFailure()
                   << "walk order differs at " << i << ": id " << got[i].id << ", expected " << order[i].id;
    return ::testing::AssertionSuccess();
}

// A block of tokens at random ids with logits uniform on lo + k * step, within [lo, hi].
struct Band {
    size_t count;
    float lo, hi, step;
};

// A row shaped like a language model's: every token first on the `background` band, then each band over
// random ids, then `masked` random ids at -inf. Portable: raw mt19937_64 bits only.
std::vector<float> lm_row(size_t vocab, Band background, const std::vector<Band>& bands, size_t masked,
                          uint64_t seed) {
    std::mt19937_64 rng(seed);
    auto value = [&](const Band& b) {
        const uint64_t steps = static_cast<uint64_t>((b.hi - b.lo) / b.step) + 1;
        return b.lo + b.step * static_cast<float>(rng() % steps);
    };
    std::vector<float> l(vocab);
    for (float& x : l) x = value(background);
    for (const Band& b : bands)
        for (size_t i = 0; i < b.count; ++i) l[rng() % vocab] = value(b);
    for (size_t i = 0; i < masked; ++i) l[rng() % vocab] = -INFINITY;
    return l;
}

// What a backend's device-side selection hands sample_top: the largest min(top_k, n_finite) penalised logits,
// descending, ties to the lower id.
std::vector<Sampler::Top> device_top(std::vector<float> logits, const std::vector<int>& history,
                                     const SamplingParams& prm, int64_t* n_finite) {
    apply_penalties(logits, history, prm);
    std::vector<Sampler::Top> all;
    for (size_t i = 0; i < logits.size(); ++i)
        if (logits[i] != -INFINITY) all.push_back({logits[i], static_cast<int>(i)});
    std::sort(all.begin(), all.end(), [](const Sampler::Top& a, const Sampler::Top& b) {
        return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
    });
    *n_finite = static_cast<int64_t>(all.size());
    const size_t keep = prm.temperature == 0.0f ? 1 : std::min(all.size(), static_cast<size_t>(prm.top_k));
    all.resize(keep);
    return all;
}

SamplingParams params(int top_k, float top_p, float min_p = 0.0f, float temperature = 1.0f) {
    SamplingParams p;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.temperature = temperature;
    return p;
}

// Dyadic penalties keep the penalised logits on a grid (exact), so the ordering argument above still holds.
SamplingParams with_penalties(SamplingParams p) {
    p.repeat_penalty = 2.0f;
    p.presence_penalty = 0.25f;
    p.frequency_penalty = 0.125f;
    p.repeat_last_n = 16;
    return p;
}

using RowMaker = std::function<std::vector<float>(uint64_t seed)>;

// Checks `rows` unambiguous rows made by `row` (seeds 1, 2, ...) under `prm`, every third one with
// penalties, through distribution() and, when top_k > 0, distribution_top(). `sorted`: whether top_k is meant
// to cut (the sampler's sorted branch) or not (the selection by mass); checked for every row.
void check_rows(const SamplingParams& prm, const RowMaker& row, int rows, bool sorted) {
    int checked = 0, skipped = 0;
    for (uint64_t seed = 1; checked < rows; ++seed) {
        if (skipped > 2 * rows + 4) {
            ADD_FAILURE() << "too many rows near a line (" << skipped << "); the shapes no longer suit top_k "
                          << prm.top_k << " top_p " << prm.top_p << " T " << prm.temperature;
            return;
        }
        const std::vector<float> l = row(seed);
        const size_t vocab = l.size();
        std::vector<int> history;
        for (uint64_t i = 0; i < 24; ++i)
            history.push_back(static_cast<int>((seed * 7919 + i * 104729) % vocab));
        history.push_back(static_cast<int>(std::max_element(l.begin(), l.end()) - l.begin()));  // hit the top
        const bool penalise = seed % 3 == 0;
        const SamplingParams p = penalise ? with_penalties(prm) : prm;
        const Reference ref = reference(l, history, p);
        if (ref.margin < kMargin) {
            ++skipped;
            continue;
        }
        ++checked;
        const std::string what = "top_k " + std::to_string(p.top_k) + " top_p " + std::to_string(p.top_p) +
                                 " min_p " + std::to_string(p.min_p) + " T " + std::to_string(p.temperature) +
                                 " vocab " + std::to_string(vocab) + " seed " + std::to_string(seed) +
                                 (penalise ? " penalised" : "");
        int64_t n_finite = 0;
        const std::vector<Sampler::Top> top = device_top(l, history, p, &n_finite);
        ASSERT_EQ(sorted, p.top_k > 0 && p.top_k < n_finite) << what;
        Sampler s(p);
        const std::vector<Prob> got = s.distribution(l.data(), std::ssize(l), history);
        EXPECT_TRUE(same_distribution(got, ref, sorted)) << what;
        if (p.top_k > 0) {
            const std::vector<Prob> dev = s.distribution_top(top, n_finite);
            EXPECT_TRUE(dev.size() == got.size() &&
                        std::equal(dev.begin(), dev.end(), got.begin(),
                                   [](const Prob& a, const Prob& b) { return a.id == b.id && a.p == b.p; }))
                << "distribution_top differs from distribution: " << what;
        }
    }
}

// Gemma-like rows for top_k: a head of 40 on a coarse grid (ties), 60 just below, the rest far below.
const std::vector<Band> kHead = {{40, 0.0f, 3.0f, 0.25f}, {60, -3.0f, 0.0f, 1.0f / 16}};
// For the selection by mass: a head of 100, a band of 3000 with many ties (top_p 0.95 crosses deep in it),
// everything else far below.
const std::vector<Band> kBand = {{100, 0.0f, 4.0f, 0.25f}, {3000, -1.0f, 1.0f, 1.0f / 64}};
const Band kFar{0, -20.0f, -12.0f, 1.0f / 64};

std::vector<float> gemma_vocab_row(uint64_t seed) {
    return lm_row(262144, kFar, kBand, 1000, seed);
}

TEST(Sampler, DistributionMatchesReferenceWhenTopKCuts) {
    const RowMaker row = [](uint64_t seed) {
        return lm_row(8192, {0, -14.0f, -6.0f, 1.0f / 64}, kHead, 200, seed);
    };
    // Gemma's defaults first; then other temperatures, min_p binding before or after top_p, and min_p alone.
    for (const SamplingParams& p :
         {params(64, 0.95f), params(64, 0.95f, 0.0f, 0.7f), params(64, 0.9f, 0.0f, 1.5f),
          params(64, 0.95f, 0.05f), params(40, 0.9f, 0.1f, 1.3f), params(64, 1.0f, 0.02f)}) {
        check_rows(p, row, 10, true);
    }
    check_rows(params(64, 0.95f), gemma_vocab_row, 1, true);  // Gemma's defaults on Gemma's vocabulary
}

TEST(Sampler, DistributionMatchesReferenceWithoutTopKOnALargeVocabulary) {
    // 65536 tokens: top_p 0.95 crosses deep in the band, so the selection by mass narrows over ten rounds;
    // top_p 0.2 crosses inside the first 64 tokens, the first split it tries.
    const RowMaker row = [](uint64_t seed) { return lm_row(65536, kFar, kBand, 500, seed); };
    for (const SamplingParams& p : {params(0, 0.95f), params(0, 0.9f, 0.0f, 1.5f),
                                    params(0, 0.9f, 0.0f, 0.7f), params(0, 0.2f), params(0, 0.95f, 0.02f)}) {
        check_rows(p, row, 3, false);
    }
    check_rows(params(0, 0.95f), gemma_vocab_row, 1, false);  // Gemma's vocabulary: twelve rounds
}

TEST(Sampler, DistributionMatchesReferenceWhenTopKKeepsEveryFiniteToken) {
    // 512 ids of which the 103 multiples of 5 are finite: top_k at or above 103 cuts nothing, so the
    // candidates stay in id order and the selection by mass runs (one round); top_k 64 cuts.
    const RowMaker row = [](uint64_t seed) {
        std::vector<float> l = lm_row(512, {0, -4.0f, -1.0f, 1.0f / 16}, {{60, 0.0f, 3.0f, 0.25f}}, 0, seed);
        for (size_t i = 0; i < l.size(); ++i)
            if (i % 5 != 0) l[i] = -INFINITY;
        return l;
    };
    for (int k : {64, 103, 200, 512}) {
        for (const SamplingParams& p : {params(k, 0.95f), params(k, 0.8f, 0.05f, 0.7f)})
            check_rows(p, row, 6, k == 64);
    }
}

// Masses that land exactly on the top_p line: tied tokens of weight exp(0) = 1, so every sum is an exact
// integer and top_p * z is exact too. The token that reaches the line is the last one kept.
TEST(Sampler, TopPKeepsTheTokenThatReachesTheLineExactly) {
    // Sorted branch: 8 ties at 0 and 4 tokens at -1 that top_k 8 cuts; top_p 0.5 reaches exactly 4 of 8.
    std::vector<float> l(64, -INFINITY);
    const std::vector<int> ties = {3, 9, 12, 20, 21, 30, 31, 40};
    for (int id : ties) l[static_cast<size_t>(id)] = 0.0f;
    for (int id : {1, 2, 50, 60}) l[static_cast<size_t>(id)] = -1.0f;
    for (auto [top_p, n] : {std::pair{0.5f, 4}, {0.25f, 2}, {0.625f, 5}, {0.75f, 6}, {0.125f, 1}}) {
        const SamplingParams p = params(8, top_p);
        Sampler s(p);
        const std::vector<Prob> got = s.distribution(l.data(), std::ssize(l), {});
        ASSERT_EQ(got.size(), static_cast<size_t>(n)) << "top_p " << top_p;
        for (int i = 0; i < n; ++i) {
            EXPECT_EQ(got[static_cast<size_t>(i)].id, ties[static_cast<size_t>(i)]) << "top_p " << top_p;
            EXPECT_EQ(got[static_cast<size_t>(i)].p, 1.0 / n) << "top_p " << top_p;
        }
        EXPECT_TRUE(same_distribution(got, reference(l, {}, p), true)) << "top_p " << top_p;
    }

    // Selection by mass: 1024 ties at scattered ids of 65536, the rest masked; top_p 0.5 reaches exactly 512
    // (the lowest ids) after several rounds of narrowing. Also with top_k above the finite count.
    std::vector<float> big(65536, -INFINITY);
    for (int i = 0; i < 1024; ++i) big[static_cast<size_t>((i * 40503 + 11) % 65536)] = 0.0f;
    for (auto [top_k, top_p, n] : {std::tuple{0, 0.5f, 512},
                                   {0, 0.75f, 768},
                                   {0, 0.03125f, 32},
                                   {4096, 0.5f, 512},
                                   {1024, 0.25f, 256}}) {
        const SamplingParams p = params(top_k, top_p);
        Sampler s(p);
        const std::vector<Prob> got = s.distribution(big.data(), std::ssize(big), {});
        EXPECT_EQ(got.size(), static_cast<size_t>(n)) << "top_k " << top_k << " top_p " << top_p;
        EXPECT_TRUE(same_distribution(got, reference(big, {}, p), false))
            << "top_k " << top_k << " top_p " << top_p;
        if (top_k > 0) {
            int64_t n_finite = 0;
            const std::vector<Sampler::Top> top = device_top(big, {}, p, &n_finite);
            EXPECT_TRUE(same_distribution(s.distribution_top(top, n_finite), reference(big, {}, p), false));
        }
    }

    // min_p 1 keeps exactly the tied maxima (p == min_p * p_max is on the line, and kept), on both branches.
    std::vector<float> m = {0.5f, 2.0f, 1.0f, 2.0f, -INFINITY, 2.0f, 1.9f};
    for (int top_k : {0, 5}) {
        const SamplingParams p = params(top_k, 1.0f, 1.0f);
        Sampler s(p);
        const std::vector<Prob> got = s.distribution(m.data(), std::ssize(m), {});
        EXPECT_TRUE(same_distribution(got, reference(m, {}, p), top_k > 0)) << "top_k " << top_k;
        EXPECT_EQ(got.size(), 3u) << "top_k " << top_k;
    }
}

TEST(Sampler, DistributionAtTemperatureZeroIsTheArgmax) {
    const std::vector<float> l = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
    SamplingParams p = params(64, 0.95f, 0.0f, 0.0f);
    p.repeat_penalty = 4.0f;
    Sampler s(p);
    const std::vector<Prob> got = s.distribution(l.data(), std::ssize(l), {1});  // 1 penalised: 3 wins
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].id, 3);
    EXPECT_EQ(got[0].p, 1.0);
    EXPECT_TRUE(same_distribution(got, reference(l, {1}, p), true));
}

// The chi-square quantile by the Wilson-Hilferty approximation: (X / df)^(1/3) is close to normal with mean
// 1 - 2 / (9 df) and variance 2 / (9 df). z is the standard normal quantile at the same probability
// (3.0902 at 0.999); within a fraction of a percent of the exact quantile for df >= 10.
double chi_square_quantile(int df, double z) {
    const double v = 2.0 / (9.0 * df);
    return df * std::pow(1.0 - v + z * std::sqrt(v), 3.0);
}

// Draws `n` ids with `draw` and tests them against the reference's probabilities: no id outside the
// survivors, and a chi-square statistic below its 0.999 quantile (a fixed seed, so deterministic; a correct
// sampler fails one seed in a thousand, a skewed draw fails by orders of magnitude).
template <class Draw>
void expect_fits(const Reference& ref, int n, Draw draw, const std::string& what) {
    std::vector<int> slot(1 << 20, -1);  // id -> index in ref.probs
    for (size_t i = 0; i < ref.probs.size(); ++i)
        slot[static_cast<size_t>(ref.probs[i].id)] = static_cast<int>(i);
    std::vector<int> counts(ref.probs.size(), 0);
    int outside = 0;
    for (int i = 0; i < n; ++i) {
        const int s = slot.at(static_cast<size_t>(draw()));
        if (s < 0)
            ++outside;
        else
            ++counts[static_cast<size_t>(s)];
    }
    EXPECT_EQ(outside, 0) << what << ": ids outside the survivors were drawn";
    double chi2 = 0.0;
    for (size_t i = 0; i < counts.size(); ++i) {
        const double e = n * ref.probs[i].p;
        ASSERT_GE(e, 5.0) << what << ": too few draws for a chi-square test";
        chi2 += (counts[i] - e) * (counts[i] - e) / e;
    }
    const int df = static_cast<int>(counts.size()) - 1;
    const double z999 = 3.090232306;  // standard normal quantile at 0.999
    EXPECT_LT(chi2, chi_square_quantile(df, z999)) << what << ": " << counts.size() << " survivors";
}

TEST(Sampler, DrawsFitTheReferenceDistributionChiSquare) {
    // A few dozen plausible survivors out of 1024: Gemma's defaults through sample() and through sample_top()
    // with a device-style selection, then top_k 0 (the selection by mass) through sample().
    const int n = 16000;
    const std::vector<float> l = lm_row(1024, Band{0, -30.0f, -20.0f, 1.0f / 64}, kHead, 20, 5);
    const std::vector<int> history = {7, 19, 7};
    for (const SamplingParams& base : {params(64, 0.95f), params(0, 0.95f)}) {
        SamplingParams p = base;
        p.seed = 2024;
        const Reference ref = reference(l, history, p);
        ASSERT_GE(ref.margin, kMargin);
        ASSERT_GE(ref.probs.size(), 24u);
        ASSERT_LE(ref.probs.size(), 64u);
        Sampler full(p);
        expect_fits(
            ref, n, [&] { return full.sample(l.data(), std::ssize(l), history); },
            "sample top_k " + std::to_string(p.top_k));
        if (p.top_k > 0) {
            int64_t n_finite = 0;
            const std::vector<Sampler::Top> top = device_top(l, history, p, &n_finite);
            Sampler device(p);
            expect_fits(
                ref, n, [&] { return device.sample_top(top, n_finite); }, "sample_top");
        }
    }
}

}  // namespace
}  // namespace markbase
