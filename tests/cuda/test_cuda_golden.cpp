// The CUDA backend against transformers directly: every golden checkpoint (tests/data/models: each family in
// both layouts, the 12B's gemma4_unified folders included) loads on the GPU, its prompt's logits match
// transformers' fp32 logits to 2e-4 of their largest magnitude batched and 1e-4 token by token through the
// decode graph over the fp32 KV cache (within the bounds below over the bf16 one), and greedy generation
// gives exactly transformers' ids over either cache. Without a GPU every test skips with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loading/checkpoint.h"
#include "loading/npy.h"
#include "runtime/backend.h"
#include "runtime/generate.h"
#include "support/exact_options.h"
#include "support/goldens.h"
#include "support/logits_compare.h"
#include "support/require_cuda.h"
#include "support/tiny_models.h"

namespace markbase {
namespace {

namespace fs = std::filesystem;

using testing::golden_models;

class CudaGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaGolden, LogitsAndGreedyIdsMatchTransformers) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    const fs::path dir = testing::golden_models_dir() / GetParam();
    const nlohmann::json g = nlohmann::json::parse(std::ifstream(dir / "golden.json"));
    const std::vector<int> prompt = g.at("prompt_ids").get<std::vector<int>>();
    const std::vector<int> greedy = g.at("greedy_ids").get<std::vector<int>>();
    const NpyArray ref = read_npy_f32((dir / g.value("logits_file", "logits.npy")).string());
    auto ck = load_checkpoint(dir);
    for (const KvDtype kv : {KvDtype::kF32, KvDtype::kBf16}) {
        const std::string label = GetParam() + ", " + gpu_kv_name(kv, 1) + " KV cache";
        BackendOptions o = testing::exact_options();
        o.ctx_size = static_cast<int64_t>(prompt.size() + greedy.size() + 1);
        o.chunk = 16;  // two prefill chunks: the sliding rings (window 8) wrap inside and between them
        o.kv_dtype = kv;
        auto be = make_cuda_backend(*ck, o);
        // fp32 cache: token by token, the decode graph's GEMVs read fp32 activations: 1e-4. Batched, the
        // prefill's GEMMs take the activations as bf16 hi + lo halves (16 significant bits, not fp32's 24),
        // which the depth compounds: 2e-4 (the H200 measured 1.15e-4 on the 31B goldens and 1.03e-4 on the
        // E4B's; the others were under 1e-4). bf16 cache: every key and value rounded to 8 significant bits
        // (and, batched, the queries and softmax weights of the attention GEMMs), which these small random
        // models amplify: the H200 measured 1.7e-2 to 7.1e-2 on the dense goldens and 4.0e-2 / 1.8e-1 (token
        // by token / batched) on the 26B's, whose router turns it into other experts; the greedy ids stay
        // transformers' on every golden.
        for (const bool one_by_one : {false, true}) {
            const double e = testing::rel_err(ref.data, testing::all_logits(*be, prompt, one_by_one));
            const double tol = kv == KvDtype::kBf16 ? (ck->config.moe ? 0.3 : 0.12)
                               : one_by_one         ? 1e-4
                                                    : 2e-4;
            std::printf("  %s %s: rel err %.2e\n", label.c_str(), one_by_one ? "token by token" : "batched",
                        e);
            EXPECT_LT(e, tol) << label << (one_by_one ? " token by token" : " batched");
        }
        be->reset();
        GenerateOptions go;
        go.max_new_tokens = static_cast<int>(greedy.size());
        go.sampling.temperature = 0;
        go.ignore_eos = true;
        std::vector<int> ours;
        generate(
            *be, prompt, go, [](int) { return true; }, &ours);
        EXPECT_EQ(ours, greedy) << label;
    }
#endif
}

INSTANTIATE_TEST_SUITE_P(Transformers, CudaGolden, ::testing::ValuesIn(golden_models()),
                         [](const auto& p) { return testing::test_name(p.param); });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CudaGolden);

}  // namespace
}  // namespace markbase
