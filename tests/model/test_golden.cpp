// MarkBase's CPU forward against transformers: tiny random checkpoints of every family in both layouts
// (tools/make_goldens.py wrote them and transformers' fp32 logits and greedy continuation under
// tests/data/models/). Logits must agree to 1e-3 of their largest magnitude; cached greedy decoding must give
// exactly the ids transformers got by full recomputation.
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

namespace markbase {
namespace {

namespace fs = std::filesystem;

fs::path models_dir() {
    return fs::path(MARKBASE_TEST_DATA) / "models";
}

std::vector<std::string> golden_models() {
    std::vector<std::string> out;
    if (fs::is_directory(models_dir()))
        for (const auto& e : fs::directory_iterator(models_dir()))
            if (fs::exists(e.path() / "golden.json")) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
}

TEST(Golden, EveryFamilyInBothLayoutsIsPresent) {
    const auto names = golden_models();
    std::set<std::string> families, layouts;
    bool sharded = false;
    for (const auto& n : names) {
        families.insert(n.substr(0, n.find('-')));
        layouts.insert(n.substr(n.rfind('-') + 1));
        sharded |= fs::exists(models_dir() / n / "model.safetensors.index.json");
    }
    EXPECT_EQ(families, (std::set<std::string>{"26b", "31b", "e2b", "e4b"}))
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

    float max_ref = 0, max_err = 0;
    size_t worst = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
        ASSERT_TRUE(std::isfinite(logits[i])) << "non-finite logit at " << i;
        max_ref = std::max(max_ref, std::fabs(ref.data[i]));
        const float e = std::fabs(logits[i] - ref.data[i]);
        if (e > max_err) max_err = e, worst = i;
    }
    EXPECT_LE(max_err, 1e-3f * max_ref) << "worst at token " << worst / V << ", id " << worst % V << ": ours "
                                        << logits[worst] << ", transformers " << ref.data[worst];
    RecordProperty("max_abs_err_rel", std::to_string(max_err / max_ref));

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

INSTANTIATE_TEST_SUITE_P(Transformers, GoldenModel, ::testing::ValuesIn(golden_models()), [](const auto& p) {
    std::string s = p.param;
    for (char& ch : s)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    return s;
});
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(
    GoldenModel);  // EveryFamilyInBothLayoutsIsPresent fails instead

}  // namespace
}  // namespace markbase
