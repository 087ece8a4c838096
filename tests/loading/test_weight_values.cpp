// Weights that are not finite: a NaN or Inf in a small tensor (norm weights, layer_scalar, the router's
// scales) is found at load and named with its file, not later as "sampler: logits contain NaN".
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <ostream>
#include <vector>

#include "loading/checkpoint.h"
#include "loading/random_checkpoint.h"
#include "model/error.h"
#include "support/error_text.h"
#include "support/tiny_models.h"

namespace markbase {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::expect_has;

constexpr uint16_t kNaN = 0x7FC0, kInf = 0x7F80, kNegInf = 0xFF80;

// Rewrites dir/model.safetensors with element `index` of `tensor` set to the bf16 bits `value`.
void poison(const fs::path& dir, const std::string& tensor, size_t index, uint16_t value) {
    std::vector<TensorToWrite> tw;
    std::vector<std::vector<uint8_t>> keep;
    {
        SafetensorsSet s = SafetensorsSet::open(dir / "model.safetensors");
        keep.reserve(s.tensors().size());
        for (const auto& [name, t] : s.tensors()) {
            keep.emplace_back(t.data, t.data + t.nbytes);
            if (name == tensor) std::memcpy(keep.back().data() + 2 * index, &value, 2);
            tw.push_back({name, t.dtype, t.shape, keep.back().data()});
        }
        ASSERT_NE(s.find(tensor), nullptr) << tensor;
    }
    write_safetensors(dir / "model.safetensors", tw);
}

std::string load_error(const fs::path& dir, const LoadOptions& opt = {}) {
    return error_of([&] { load_checkpoint(dir, opt); });
}

struct Case {
    const char* family;
    const char* tensor;
    size_t index;
    uint16_t value;
    const char* shown;
};

void PrintTo(const Case& c, std::ostream* os) {
    *os << c.family << " " << c.tensor << " " << c.shown;
}

class CheckpointWeights : public ::testing::TestWithParam<Case> {};

TEST_P(CheckpointWeights, SmallTensorThatIsNotFiniteIsNamedAtLoad) {
    const Case& c = GetParam();
    testing::TempDir dir("nan");
    write_random_checkpoint(dir.path(), testing::tiny_config(c.family), 1);
    poison(dir.path(), c.tensor, c.index, c.value);
    expect_has(load_error(dir.path()), {(dir.path() / "model.safetensors").string(), c.tensor, c.shown,
                                        "index " + std::to_string(c.index)});
}

INSTANTIATE_TEST_SUITE_P(
    , CheckpointWeights,
    ::testing::Values(Case{"e2b", "model.layers.3.input_layernorm.weight", 5, kNaN, "NaN"},
                      Case{"e2b", "model.layers.0.layer_scalar", 0, kInf, "Inf"},
                      Case{"e2b", "model.norm.weight", 63, kNegInf, "-Inf"},
                      Case{"26b-a4b", "model.layers.1.router.scale", 2, kNaN, "NaN"},
                      Case{"26b-a4b", "model.layers.4.router.per_expert_scale", 7, kInf, "Inf"}),
    [](const ::testing::TestParamInfo<Case>& i) { return "case" + std::to_string(i.index); });

// A large tensor (the embedding, 128 Ki elements here) is scanned only when asked (check_weights reads the
// whole checkpoint); a small one (down_proj, 6 Ki) always.
TEST(CheckpointWeightsFull, LargeTensorsAreScannedWhenAsked) {
    testing::TempDir dir("naninf");
    nlohmann::json c = testing::tiny_config("31b");
    c["vocab_size"] = 2048;
    write_random_checkpoint(dir.path(), c, 1);
    poison(dir.path(), "model.embed_tokens.weight", 100000, kNaN);
    poison(dir.path(), "model.layers.2.mlp.down_proj.weight", 17, kInf);
    const std::string small_only = load_error(dir.path());
    expect_has(small_only, {"(1 tensor)", "model.layers.2.mlp.down_proj.weight", "index 17: Inf"});
    EXPECT_EQ(small_only.find("embed_tokens"), std::string::npos) << small_only;
    expect_has(load_error(dir.path(), LoadOptions{.check_weights = true}),
               {"(2 tensors)",
                "model.embed_tokens.weight: 1 of 131072 values not finite (first at index 100000: NaN)",
                "model.layers.2.mlp.down_proj.weight", "index 17: Inf"});
}

}  // namespace
}  // namespace markbase
