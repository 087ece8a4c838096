// MarkBase's CPU forward against transformers: tiny random checkpoints of every family in both layouts
// (tools/make_goldens.py and, for the 12B's Gemma4Unified classes, tools/make_unified_goldens.py wrote them
// and transformers' fp32 logits and greedy continuation under tests/data/models/). Logits must agree to 1e-4
// of their largest magnitude (the CPU measures 4e-6 to 8e-6, so a small numeric bug such as an unrounded
// scale or a wrong norm epsilon fails); cached greedy decoding must give exactly the ids transformers got by
// full recomputation. Prompts at the sliding window's edges (1 token, the window, the window + 1, more than
// two prefill chunks; tools/make_edge_goldens.py) are checked batched and token by token through the cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "loading/checkpoint.h"
#include "loading/npy.h"
#include "runtime/backend.h"
#include "runtime/generate.h"
#include "support/goldens.h"
#include "support/logits_compare.h"
#include "support/tiny_models.h"

namespace markbase {
namespace {

namespace fs = std::filesystem;

fs::path models_dir() {
    return testing::golden_models_dir();
}

// max |logit - ref| <= 1e-4 * max |ref|, every logit finite; on failure, where the worst one is.
constexpr float kRelTol = 1e-4f;
void expect_logits_match(const std::vector<float>& ours, const NpyArray& ref, int64_t V,
                         const std::string& what) {
    ASSERT_EQ(ours.size(), ref.data.size()) << what;
    float max_ref = 0, max_err = 0;
    size_t worst = 0;
    for (size_t i = 0; i < ours.size(); ++i) {
        ASSERT_TRUE(std::isfinite(ours[i])) << what << ": non-finite logit at " << i;
        max_ref = std::max(max_ref, std::fabs(ref.data[i]));
        const float e = std::fabs(ours[i] - ref.data[i]);
        if (e > max_err) max_err = e, worst = i;
    }
    ASSERT_GT(max_ref, 1.0f) << what << ": the reference logits are suspiciously flat";
    EXPECT_LE(max_err, kRelTol * max_ref) << what << ": worst at token " << worst / V << ", id " << worst % V
                                          << ": ours " << ours[worst] << ", transformers " << ref.data[worst];
    ::testing::Test::RecordProperty(what + "_max_abs_err_rel", std::to_string(max_err / max_ref));
}

using testing::golden_models;

TEST(Golden, EveryFamilyInBothLayoutsIsPresent) {
    const auto names = golden_models();
    std::set<std::string> families, layouts;
    bool sharded = false;
    for (const auto& n : names) {
        families.insert(n.substr(0, n.find('-')));
        layouts.insert(n.substr(n.rfind('-') + 1));
        sharded |= fs::exists(models_dir() / n / "model.safetensors.index.json");
    }
    EXPECT_EQ(families, (std::set<std::string>{"12b", "26b", "31b", "e2b", "e4b"}))
        << "golden models found: " << names.size();
    EXPECT_EQ(layouts, (std::set<std::string>{"flat", "nested"}));
    EXPECT_TRUE(sharded) << "no sharded golden checkpoint";
}

class GoldenModel : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenModel, LogitsAndGreedyIdsMatchTransformers) {
    const fs::path dir = models_dir() / GetParam();
    nlohmann::json g = nlohmann::json::parse(std::ifstream(dir / "golden.json"));
    const std::vector<int> prompt = g.at("prompt_ids").get<std::vector<int>>();
    const std::vector<int> greedy = g.at("greedy_ids").get<std::vector<int>>();
    const NpyArray ref = read_npy_f32((dir / g.value("logits_file", "logits.npy")).string());

    auto ck = load_checkpoint(dir);
    const int64_t V = ck->config.vocab_size;
    ASSERT_EQ(ref.shape, (std::vector<int64_t>{static_cast<int64_t>(prompt.size()), V}));

    BackendOptions o;
    o.ctx_size = static_cast<int64_t>(prompt.size() + greedy.size() + 1);
    o.threads = 2;
    o.chunk = 16;  // several prefill chunks, so the sliding rings wrap mid-prompt
    auto be = make_cpu_backend(*ck, o);
    std::vector<float> logits(prompt.size() * V);
    be->eval(prompt.data(), static_cast<int64_t>(prompt.size()), logits.data(), true);

    expect_logits_match(logits, ref, V, "prompt");

    be->reset();
    GenerateOptions go;
    go.max_new_tokens = static_cast<int>(greedy.size());
    go.sampling.temperature = 0;
    go.ignore_eos = true;
    std::vector<int> ours;
    generate(
        *be, prompt, go, [](int) { return true; }, &ours);
    EXPECT_EQ(ours, greedy);
}

// The window-edge prompts: one batched pass in chunks of 16 (40 tokens = three chunks, the rings wrapping
// inside and between them) and one token at a time through the cache, both against transformers.
std::vector<std::string> edge_models() {
    std::vector<std::string> out;
    for (const auto& n : golden_models())
        if (fs::exists(models_dir() / n / "edges.json")) out.push_back(n);
    return out;
}

TEST(Golden, EveryFamilyHasWindowEdgeGoldens) {
    std::set<std::string> families;
    for (const auto& n : edge_models()) families.insert(n.substr(0, n.find('-')));
    EXPECT_EQ(families, (std::set<std::string>{"12b", "26b", "31b", "e2b", "e4b"}));
}

class GoldenEdges : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenEdges, WindowEdgePromptsMatchTransformersBatchedAndCached) {
    const fs::path dir = models_dir() / GetParam();
    nlohmann::json g = nlohmann::json::parse(std::ifstream(dir / "edges.json"));
    const int W = g.at("sliding_window").get<int>();
    std::set<int> lengths;
    auto ck = load_checkpoint(dir);
    ASSERT_EQ(ck->config.sliding_window, W);
    const int64_t V = ck->config.vocab_size;
    for (const auto& c : g.at("cases")) {
        const std::vector<int> ids = c.at("prompt_ids").get<std::vector<int>>();
        const NpyArray ref = read_npy_f32((dir / c.at("logits_file").get<std::string>()).string());
        ASSERT_EQ(ref.shape, (std::vector<int64_t>{static_cast<int64_t>(ids.size()), V}));
        lengths.insert(static_cast<int>(ids.size()));
        BackendOptions o;
        o.ctx_size = static_cast<int64_t>(ids.size());
        o.threads = 2;
        o.chunk = 16;
        auto be = make_cpu_backend(*ck, o);
        const std::string n = std::to_string(ids.size());
        expect_logits_match(testing::all_logits(*be, ids, false), ref, V, "batched_" + n);
        expect_logits_match(testing::all_logits(*be, ids, true), ref, V, "cached_" + n);
    }
    EXPECT_EQ(lengths, (std::set<int>{1, W, W + 1, 40}));
}

INSTANTIATE_TEST_SUITE_P(Transformers, GoldenModel, ::testing::ValuesIn(golden_models()), [](const auto& p) {
    std::string s = p.param;
    for (char& ch : s)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    return s;
});
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(
    GoldenModel);  // EveryFamilyInBothLayoutsIsPresent fails instead
INSTANTIATE_TEST_SUITE_P(Transformers, GoldenEdges, ::testing::ValuesIn(edge_models()),
                         [](const auto& p) { return testing::test_name(p.param); });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GoldenEdges);  // EveryFamilyHasWindowEdgeGoldens fails instead

}  // namespace
}  // namespace markbase
