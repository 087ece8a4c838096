// Binding a checkpoint to its config: what loads, what is skipped, and that every mismatch is reported with
// the file, the tensor, what was expected and what was found — never a crash.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>

#include "loading/checkpoint.h"
#include "loading/random_checkpoint.h"
#include "model/error.h"
#include "support/tiny_models.h"

namespace markbase {
namespace {

namespace fs = std::filesystem;

// Rewrites dir/model.safetensors through `edit`, which may drop, add or replace tensors.
void rewrite(
    const fs::path& dir,
    const std::function<void(std::vector<TensorToWrite>&, std::vector<std::vector<uint8_t>>&)>& edit) {
    std::vector<TensorToWrite> tw;
    std::vector<std::vector<uint8_t>> keep;
    {
        SafetensorsSet s = SafetensorsSet::open(dir / "model.safetensors");
        keep.reserve(s.tensors().size() + 8);
        for (const auto& [name, t] : s.tensors()) {
            keep.emplace_back(t.data, t.data + t.nbytes);
            tw.push_back({name, t.dtype, t.shape, keep.back().data()});
        }
        edit(tw, keep);
    }
    write_safetensors(dir / "model.safetensors", tw);
}

std::string load_error(const fs::path& dir) {
    try {
        load_checkpoint(dir);
    } catch (const Error& e) {
        return e.what();
    }
    return "(loaded without error)";
}

class CheckpointTest : public ::testing::Test {
  protected:
    void SetUp() override { write_random_checkpoint(dir.path(), testing::tiny_config("e2b"), 3); }
    testing::TempDir dir{"ckpt"};
};

TEST_F(CheckpointTest, LoadsAndBindsEveryTensor) {
    auto ck = load_checkpoint(dir.path());
    ASSERT_EQ(ck->weights.layers.size(), 10u);
    // Each binding is the named tensor's bytes as the file holds them (a swapped or shifted binding fails).
    SafetensorsSet file = SafetensorsSet::open(dir.path() / "model.safetensors");
    auto same_bytes = [&](const bf16* bound, const std::string& name) {
        const auto it = file.tensors().find(name);
        if (it == file.tensors().end()) return ::testing::AssertionFailure() << name << " is not in the file";
        if (bound == nullptr) return ::testing::AssertionFailure() << name << " is not bound";
        if (std::memcmp(bound, it->second.data, it->second.nbytes) != 0)
            return ::testing::AssertionFailure() << name << " is bound to other bytes";
        return ::testing::AssertionSuccess();
    };
    for (int i = 0; i < 10; ++i) {
        const auto& l = ck->weights.layers[static_cast<size_t>(i)];
        const std::string p = "model.layers." + std::to_string(i) + ".";
        EXPECT_TRUE(same_bytes(l.q_proj, p + "self_attn.q_proj.weight"));
        EXPECT_TRUE(same_bytes(l.o_proj, p + "self_attn.o_proj.weight"));
        EXPECT_TRUE(same_bytes(l.gate_proj, p + "mlp.gate_proj.weight"));
        EXPECT_TRUE(same_bytes(l.up_proj, p + "mlp.up_proj.weight"));
        EXPECT_TRUE(same_bytes(l.down_proj, p + "mlp.down_proj.weight"));
        EXPECT_TRUE(same_bytes(l.layer_scalar_raw, p + "layer_scalar"));
        EXPECT_EQ(l.layer_scalar, bf16_to_float(*l.layer_scalar_raw)) << i;
        if (ck->config.layers[static_cast<size_t>(i)].has_own_kv())
            EXPECT_TRUE(same_bytes(l.k_proj, p + "self_attn.k_proj.weight"));
        else
            EXPECT_EQ(l.k_proj, nullptr) << "layer " << i << " is KV-shared";
    }
    EXPECT_EQ(ck->weights.layers[9].k_proj, nullptr);  // KV-shared
    EXPECT_TRUE(same_bytes(ck->weights.embed, "model.embed_tokens.weight"));
    EXPECT_TRUE(same_bytes(ck->weights.ple_embed, "model.embed_tokens_per_layer.weight"));
}

TEST_F(CheckpointTest, SkipsOtherModalitiesAndUnusedSharedKv) {
    std::vector<uint16_t> junk(64, 0x3f80);
    rewrite(dir.path(), [&](auto& tw, auto&) {
        tw.push_back({"model.vision_tower.encoder.w", DType::BF16, {8, 8}, junk.data()});
        tw.push_back({"model.embed_audio.embedding_projection.weight", DType::BF16, {8, 8}, junk.data()});
        tw.push_back({"model.layers.9.self_attn.k_proj.weight", DType::BF16, {8, 8}, junk.data()});
        tw.push_back({"lm_head.weight", DType::BF16, {8, 8}, junk.data()});
    });
    auto ck = load_checkpoint(dir.path());
    std::vector<std::string> skipped = ck->skipped;
    std::sort(skipped.begin(), skipped.end());
    EXPECT_EQ(skipped, (std::vector<std::string>{"lm_head.weight", "model.embed_audio.embedding_projection.weight",
                                                 "model.layers.9.self_attn.k_proj.weight",
                                                 "model.vision_tower.encoder.w"}));
}

TEST_F(CheckpointTest, MissingTensorIsNamed) {
    rewrite(dir.path(), [](auto& tw, auto&) {
        std::erase_if(tw,
                      [](const TensorToWrite& t) { return t.name == "model.layers.3.mlp.up_proj.weight"; });
    });
    const std::string e = load_error(dir.path());
    EXPECT_NE(e.find("missing tensor model.layers.3.mlp.up_proj.weight"), std::string::npos) << e;
    EXPECT_NE(e.find("[96, 64]"), std::string::npos) << e;
}

TEST_F(CheckpointTest, WrongShapeSaysExpectedAndFound) {
    std::vector<uint16_t> small(64 * 95, 0x3f80);
    rewrite(dir.path(), [&](auto& tw, auto&) {
        for (auto& t : tw)
            if (t.name == "model.layers.2.mlp.gate_proj.weight")
                t = {t.name, DType::BF16, {95, 64}, small.data()};
    });
    const std::string e = load_error(dir.path());
    EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
    EXPECT_NE(e.find("model.layers.2.mlp.gate_proj.weight: expected shape [96, 64], found [95, 64]"),
              std::string::npos)
        << e;
}

TEST_F(CheckpointTest, WrongDtypeIsNamed) {
    std::vector<float> f32(64, 1.0f);
    rewrite(dir.path(), [&](auto& tw, auto&) {
        for (auto& t : tw)
            if (t.name == "model.norm.weight") t = {t.name, DType::F32, {64}, f32.data()};
    });
    const std::string e = load_error(dir.path());
    EXPECT_NE(e.find("model.norm.weight: expected dtype BF16, found F32"), std::string::npos) << e;
}

TEST_F(CheckpointTest, UnexpectedTextTensorMeansConfigMismatch) {
    std::vector<uint16_t> junk(16, 0x3f80);
    rewrite(dir.path(), [&](auto& tw, auto&) {
        tw.push_back({"model.layers.0.router.proj.weight", DType::BF16, {4, 4}, junk.data()});
    });
    const std::string e = load_error(dir.path());
    EXPECT_NE(e.find("unexpected tensor model.layers.0.router.proj.weight"), std::string::npos) << e;
}

TEST_F(CheckpointTest, ConfigThatDisagreesWithWeightsListsEveryProblem) {
    nlohmann::json c = testing::tiny_config("e2b");
    c["intermediate_size"] = 100;
    std::ofstream(dir.path() / "config.json") << c.dump();
    const std::string e = load_error(dir.path());
    EXPECT_NE(e.find("problems"), std::string::npos) << e;
    EXPECT_NE(e.find("expected shape [100, 64], found [96, 64]"), std::string::npos) << e;
}

TEST(Checkpoint, MissingFolderOrConfig) {
    EXPECT_NE(load_error("/nonexistent/model").find("/nonexistent/model"), std::string::npos);
    testing::TempDir empty("empty");
    EXPECT_NE(load_error(empty.path()).find("config.json"), std::string::npos);
}

}  // namespace
}  // namespace markbase
