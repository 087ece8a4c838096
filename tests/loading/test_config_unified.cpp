// config.json of the 12B (model_type gemma4_unified, Gemma4UnifiedForConditionalGeneration) and the presets
// of the 12B and the 26B-Standard: the released 12B config gives the layer plan GEMMA4.md states, the unified
// text config's own class defaults apply when a key is left out, what the 12B does not have is refused by
// name, and the 26B-Standard reads the bytes the 26B-A4B reads per token.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "loading/checkpoint.h"
#include "loading/config_json.h"
#include "model/error.h"
#include "model/variants.h"
#include "support/error_text.h"

namespace markbase {
namespace {

using nlohmann::json;
using testing::error_of;
using testing::expect_has;

ModelConfig parse(const json& j) {
    return parse_config_text(j.dump(), "config.json");
}

std::string error_of_config(const json& j) {
    return error_of([&] { parse(j); });
}

// The 12B's text_config as google/gemma-4-12B ships it (transformers 5.10 wrote it).
json released_12b_text() {
    json types = json::array();
    for (int i = 0; i < 48; ++i) types.push_back((i + 1) % 6 ? "sliding_attention" : "full_attention");
    return {{"attention_bias", false},
            {"attention_dropout", 0.0},
            {"attention_k_eq_v", true},
            {"bos_token_id", 2},
            {"enable_moe_block", false},
            {"eos_token_id", 1},
            {"final_logit_softcapping", 30.0},
            {"global_head_dim", 512},
            {"head_dim", 256},
            {"hidden_activation", "gelu_pytorch_tanh"},
            {"hidden_size", 3840},
            {"hidden_size_per_layer_input", 0},
            {"initializer_range", 0.02},
            {"intermediate_size", 15360},
            {"layer_types", types},
            {"max_position_embeddings", 262144},
            {"model_type", "gemma4_unified_text"},
            {"moe_intermediate_size", nullptr},
            {"num_attention_heads", 16},
            {"num_experts", nullptr},
            {"num_global_key_value_heads", 1},
            {"num_hidden_layers", 48},
            {"num_key_value_heads", 8},
            {"num_kv_shared_layers", 0},
            {"pad_token_id", 0},
            {"rms_norm_eps", 1e-06},
            {"rope_parameters",
             {{"full_attention",
               {{"partial_rotary_factor", 0.25}, {"rope_theta", 1000000.0}, {"rope_type", "proportional"}}},
              {"sliding_attention", {{"rope_theta", 10000.0}, {"rope_type", "default"}}}}},
            {"sliding_window", 1024},
            {"tie_word_embeddings", true},
            {"top_k_experts", nullptr},
            {"use_bidirectional_attention", "vision"},
            {"use_cache", true},
            {"use_double_wide_mlp", false},
            {"vocab_size", 262144},
            {"vocab_size_per_layer_input", 262144}};
}

json released_12b() {
    return {{"architectures", {"Gemma4UnifiedForConditionalGeneration"}},
            {"audio_config", {{"audio_embed_dim", 640}, {"model_type", "gemma4_unified_audio"}}},
            {"model_type", "gemma4_unified"},
            {"eos_token_id", {1, 106}},
            {"text_config", released_12b_text()},
            {"tie_word_embeddings", true},
            {"vision_config",
             {{"mm_embed_dim", 3840}, {"model_type", "gemma4_unified_vision"}, {"patch_size", 16}}}};
}

void expect_12b_plan(const ModelConfig& c) {
    EXPECT_TRUE(c.unified);
    ASSERT_EQ(c.n_layers, 48);
    EXPECT_EQ(c.hidden, 3840);
    EXPECT_EQ(c.n_heads, 16);
    EXPECT_EQ(c.sliding_window, 1024);
    EXPECT_EQ(c.max_positions, 262144);
    EXPECT_EQ(c.ple_dim, 0);
    EXPECT_FALSE(c.moe);
    EXPECT_EQ(c.embed_scale(), 62.0f);  // bf16(sqrt(3840) = 61.97)
    EXPECT_EQ(c.final_softcap, 30.0f);
    for (int i = 0; i < 48; ++i) {
        const LayerSpec& s = c.layers[i];
        const bool full = (i + 1) % 6 == 0;
        EXPECT_EQ(s.kind == AttentionKind::Full, full) << i;
        EXPECT_EQ(s.head_dim, full ? 512 : 256) << i;
        EXPECT_EQ(s.n_kv_heads, full ? 1 : 8) << i;
        EXPECT_EQ(s.k_eq_v, full) << i;
        EXPECT_EQ(s.mlp_width, 15360) << i;
        EXPECT_TRUE(s.has_own_kv()) << i;
    }
}

TEST(ConfigUnified, Released12BConfig) {
    const ModelConfig c = parse(released_12b());
    expect_12b_plan(c);
    EXPECT_EQ(c.weight_prefix, "model.language_model.");
    EXPECT_EQ(c.architecture, "Gemma4UnifiedForConditionalGeneration");
    EXPECT_EQ(c.stop_ids, (std::vector<int>{1, 106}));
}

TEST(ConfigUnified, FlatLayoutAndPresetGiveTheSamePlan) {
    json flat = released_12b_text();
    flat["architectures"] = {"Gemma4UnifiedForCausalLM"};
    const ModelConfig c = parse(flat);
    expect_12b_plan(c);
    EXPECT_EQ(c.weight_prefix, "model.");
    EXPECT_EQ(c.architecture, "Gemma4UnifiedForCausalLM");
    // the preset is written in Gemma 4's text layout, as make_random_ckpt.py writes it: the same plan
    const ModelConfig p = parse(variant_config("12b"));
    EXPECT_FALSE(p.unified);
    ASSERT_EQ(p.layers.size(), c.layers.size());
    for (size_t i = 0; i < c.layers.size(); ++i) {
        EXPECT_EQ(p.layers[i].head_dim, c.layers[i].head_dim) << i;
        EXPECT_EQ(p.layers[i].n_kv_heads, c.layers[i].n_kv_heads) << i;
        EXPECT_EQ(p.layers[i].k_eq_v, c.layers[i].k_eq_v) << i;
        EXPECT_EQ(p.layers[i].mlp_width, c.layers[i].mlp_width) << i;
    }
    EXPECT_NEAR(count_params(p).bytes_per_token, count_params(c).bytes_per_token, 1.0);
}

// Gemma4UnifiedTextConfig's class defaults are not Gemma4TextConfig's: window 1024, 262144 positions, no PLE.
TEST(ConfigUnified, ClassDefaults) {
    json t = released_12b_text();
    for (const char* k : {"sliding_window", "max_position_embeddings", "hidden_size_per_layer_input",
                          "vocab_size_per_layer_input", "enable_moe_block", "num_experts", "top_k_experts",
                          "moe_intermediate_size", "model_type"})
        t.erase(k);
    json j = released_12b();
    j["text_config"] = t;
    const ModelConfig c = parse(j);
    EXPECT_EQ(c.sliding_window, 1024);
    EXPECT_EQ(c.max_positions, 262144);
    EXPECT_EQ(c.ple_dim, 0);
    EXPECT_FALSE(c.moe);
}

// transformers' unified attention never reads query_pre_attn_scalar (its scaling is 1.0); some 12B configs
// carry it. A gemma4_text config with it still looks like another Gemma and is refused (test_config.cpp).
TEST(ConfigUnified, QueryPreAttnScalarIsIgnored) {
    json j = released_12b();
    j["text_config"]["query_pre_attn_scalar"] = 256;
    expect_12b_plan(parse(j));
}

TEST(ConfigUnified, RefusalsNameTheFieldAndTheModel) {
    auto text_with = [](const char* k, json v) {
        json j = released_12b();
        j["text_config"][k] = std::move(v);
        return j;
    };
    expect_has(
        error_of_config(text_with("hidden_size_per_layer_input", 256)),
        {"config.json (text_config)", "hidden_size_per_layer_input", "no per-layer embeddings", "256"});
    expect_has(error_of_config(text_with("enable_moe_block", true)),
               {"enable_moe_block", "gemma4_unified_text", "no experts"});
    expect_has(error_of_config(text_with("model_type", "gemma4_text")),
               {"text_config", "model_type", "must be gemma4_unified_text", "gemma4_text"});
    expect_has(error_of_config(text_with("attn_logit_softcapping", 50.0)), {"attn_logit_softcapping"});

    json j = released_12b();
    j["architectures"] = {"Gemma4ForConditionalGeneration"};
    expect_has(error_of_config(j), {"architectures", "Gemma4ForConditionalGeneration", "gemma4_unified",
                                    "expected Gemma4UnifiedForConditionalGeneration"});
    j = released_12b();
    j["model_type"] = "gemma4_unified_text";  // a text model_type on a nested config
    expect_has(error_of_config(j), {"model_type", "gemma4 or gemma4_unified", "gemma4_unified_text"});
    json flat = released_12b_text();
    flat["architectures"] = {"Gemma4ForCausalLM"};
    expect_has(error_of_config(flat), {"architectures", "expected Gemma4UnifiedForCausalLM"});
}

// The 12B golden checkpoint as transformers' save_pretrained wrote it: the text model binds, and the
// encoder-free embedders it carries are skipped and named as such (what `inspect` prints).
TEST(ConfigUnified, NestedCheckpointSkipsItsEmbedders) {
    const auto dir = std::filesystem::path(MARKBASE_TEST_DATA) / "models" / "12b-nested";
    auto ck = load_checkpoint(dir);
    EXPECT_TRUE(ck->config.unified);
    EXPECT_EQ(ck->config.architecture, "Gemma4UnifiedForConditionalGeneration");
    size_t vision = 0, audio = 0;
    for (const auto& [name, info] : ck->files.tensors()) {
        vision += name.rfind("model.vision_embedder.", 0) == 0 || name.rfind("model.embed_vision.", 0) == 0;
        audio += name.rfind("model.embed_audio.", 0) == 0;
    }
    ASSERT_GT(vision, 0u);
    ASSERT_GT(audio, 0u);
    std::map<std::string, size_t> groups;
    for (const auto& [kind, n] : skipped_groups(*ck)) groups[kind] = n;
    EXPECT_EQ(groups, (std::map<std::string, size_t>{{"encoder-free vision embedder", vision},
                                                     {"encoder-free audio embedder", audio}}));
}

TEST(ConfigPresets, TwelveBAndTwentySixBStandard) {
    const ModelConfig s = parse(variant_config("26b-standard"));
    const ModelConfig m = parse(variant_config("26b-a4b"));
    EXPECT_FALSE(s.moe);
    ASSERT_EQ(s.n_layers, 30);
    for (int i = 0; i < 30; ++i) {
        EXPECT_EQ(s.layers[i].mlp_width, 2112 + 8 * 704) << i;
        EXPECT_EQ(s.layers[i].head_dim, m.layers[i].head_dim) << i;
        EXPECT_EQ(s.layers[i].n_kv_heads, m.layers[i].n_kv_heads) << i;
    }
    // the same bytes per token: the dense MLP as wide as the active MoE path; only the router (128 x 2816 per
    // layer, 0.3% of the bytes) and the per-expert scales differ
    const double bs = count_params(s).bytes_per_token, bm = count_params(m).bytes_per_token;
    EXPECT_NEAR(bs / bm, 1.0, 0.005) << bs << " vs " << bm;
    // GEMMA4.md's figure for the 12B: about 23.9 GB per token (11.9 B parameters, lm_head included)
    EXPECT_NEAR(count_params(parse(variant_config("12b"))).bytes_per_token / 1e9, 23.9, 0.1);
    expect_has(error_of([] { variant_config("12b-it"); }),
               {"unknown variant '12b-it'", "12b", "26b-standard"});
}

}  // namespace
}  // namespace markbase
