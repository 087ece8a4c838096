// config.json parsing: the released variants' layer plans, both config layouts and both override forms give
// the same plan, transformers' defaults, and clear errors naming the field.
#include <gtest/gtest.h>

#include "loading/config_json.h"
#include "model/error.h"
#include "model/variants.h"

namespace markbase {
namespace {

using nlohmann::json;

ModelConfig parse(const json& j) {
    return parse_config_text(j.dump(), "config.json");
}

std::string error_of(const json& j) {
    try {
        parse(j);
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

TEST(Config, E2BLayerPlan) {
    const ModelConfig c = parse(variant_config("e2b"));
    ASSERT_EQ(c.n_layers, 35);
    EXPECT_EQ(c.weight_prefix, "model.");
    EXPECT_EQ(c.embed_scale(), 39.25f);
    EXPECT_EQ(c.final_softcap, 30.0f);
    EXPECT_EQ(c.ple_dim, 256);
    for (int i = 0; i < 35; ++i) {
        const LayerSpec& s = c.layers[i];
        const bool full = (i + 1) % 5 == 0;
        EXPECT_EQ(s.kind == AttentionKind::Full, full) << i;
        EXPECT_EQ(s.head_dim, full ? 512 : 256) << i;
        EXPECT_EQ(s.n_kv_heads, 1) << i;  // num_global_key_value_heads is not applied without k_eq_v
        EXPECT_FALSE(s.k_eq_v);
        EXPECT_EQ(s.mlp_width, i >= 15 ? 12288 : 6144) << i;
        EXPECT_EQ(s.kv_source, i < 15 ? -1 : (full ? 14 : 13)) << i;
    }
}

TEST(Config, E4BSharesWithLayers22And23) {
    const ModelConfig c = parse(variant_config("e4b"));
    EXPECT_EQ(c.embed_scale(), 50.5f);
    for (int i = 24; i < 42; ++i)
        EXPECT_EQ(c.layers[i].kv_source, c.layers[i].kind == AttentionKind::Full ? 23 : 22);
    EXPECT_EQ(c.layers[23].mlp_width, 10240);
}

TEST(Config, MoEAndKeqV) {
    const ModelConfig c = parse(variant_config("26b-a4b"));
    EXPECT_TRUE(c.moe);
    EXPECT_EQ(c.n_experts, 128);
    EXPECT_EQ(c.top_k, 8);
    EXPECT_EQ(c.expert_width, 704);
    EXPECT_EQ(c.embed_scale(), 53.0f);
    EXPECT_EQ(c.ple_dim, 0);
    for (int i = 0; i < 30; ++i) {
        const bool full = (i + 1) % 6 == 0;
        EXPECT_EQ(c.layers[i].k_eq_v, full);
        EXPECT_EQ(c.layers[i].n_kv_heads, full ? 2 : 8);
        EXPECT_EQ(c.layers[i].head_dim, full ? 512 : 256);
    }
    EXPECT_EQ(parse(variant_config("31b")).embed_scale(), 73.5f);
}

TEST(Config, NestedLayoutAndPerLayerConfigGiveTheSamePlan) {
    json flat = variant_config("31b", 12);
    json text = flat;
    // the transformers >= 5.17 save form: zero-padded layer keys, global keys gone
    text.erase("global_head_dim");
    text.erase("num_global_key_value_heads");
    text["per_layer_config"] = {{"05", {{"head_dim", 512}, {"num_key_value_heads", 4}}},
                                {"11", {{"head_dim", 512}, {"num_key_value_heads", 4}}}};
    json nested = {{"model_type", "gemma4"},
                   {"architectures", {"Gemma4ForConditionalGeneration"}},
                   {"eos_token_id", {1, 106}},
                   {"text_config", text},
                   {"vision_config", {{"hidden_size", 768}}}};
    const ModelConfig a = parse(flat), b = parse(nested);
    EXPECT_EQ(b.weight_prefix, "model.language_model.");
    EXPECT_EQ(b.stop_ids, (std::vector<int>{1, 106}));
    ASSERT_EQ(a.layers.size(), b.layers.size());
    for (size_t i = 0; i < a.layers.size(); ++i) {
        EXPECT_EQ(a.layers[i].head_dim, b.layers[i].head_dim) << i;
        EXPECT_EQ(a.layers[i].n_kv_heads, b.layers[i].n_kv_heads) << i;
        EXPECT_EQ(a.layers[i].k_eq_v, b.layers[i].k_eq_v) << i;
    }
}

// Only the widths are required (test_config_values.cpp); every other key may be left to its default.
TEST(Config, TransformersDefaults) {
    json j = {{"model_type", "gemma4_text"},
              {"vocab_size", 1024},
              {"hidden_size", 64},
              {"num_hidden_layers", 6},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"head_dim", 256},
              {"intermediate_size", 128}};
    const ModelConfig c = parse(j);
    EXPECT_EQ(c.ple_dim, 256);         // hidden_size_per_layer_input defaults to 256: PLE on
    EXPECT_EQ(c.final_softcap, 0.0f);  // final_logit_softcapping defaults to None
    EXPECT_EQ(c.sliding_window, 512);
    EXPECT_EQ(c.layers[5].kind, AttentionKind::Full);  // default 5:1 pattern, last layer full
    EXPECT_EQ(c.layers[5].head_dim, 512);
    EXPECT_EQ(c.layers[0].head_dim, 256);
    EXPECT_TRUE(c.rope_full.proportional);
    EXPECT_DOUBLE_EQ(c.rope_full.partial_rotary_factor, 0.25);
}

TEST(Config, ExpertIntermediateSizeIsAccepted) {
    json j = variant_config("26b-a4b", 6);
    j.erase("moe_intermediate_size");
    j["expert_intermediate_size"] = 704;
    EXPECT_EQ(parse(j).expert_width, 704);
}

TEST(Config, ErrorsNameTheField) {
    json base = variant_config("e2b", 10);
    auto with = [&](const char* k, json v) {
        json j = base;
        j[k] = std::move(v);
        return j;
    };
    {
        EXPECT_NE(error_of(with("model_type", "llama")).find("model_type"), std::string::npos);
        EXPECT_NE(error_of(with("model_type", "gemma4_unified")).find("with a text_config"), std::string::npos);
        EXPECT_NE(error_of(with("hidden_size", -5)).find("hidden_size"), std::string::npos);
        EXPECT_NE(error_of(with("hidden_size", "big")).find("hidden_size"), std::string::npos);
        EXPECT_NE(error_of(with("hidden_activation", "silu")).find("hidden_activation"), std::string::npos);
        EXPECT_NE(error_of(with("query_pre_attn_scalar", 256)).find("query_pre_attn_scalar"),
                  std::string::npos);
        EXPECT_NE(error_of(with("layer_types", json::array({"sliding_attention"}))).find("layer_types"),
                  std::string::npos);
        EXPECT_NE(error_of(with("num_kv_shared_layers", 10)).find("num_kv_shared_layers"), std::string::npos);
        EXPECT_NE(error_of(with("per_layer_config", {{"x", {{"head_dim", 512}}}})).find("per_layer_config"),
                  std::string::npos);
        EXPECT_NE(
            error_of(with("per_layer_config", {{"04", {{"sliding_window", 5}}}})).find("sliding_window"),
            std::string::npos);
        json rope = base["rope_parameters"];
        rope["full_attention"]["rope_type"] = "yarn";
        EXPECT_NE(error_of(with("rope_parameters", rope)).find("rope_type"), std::string::npos);
    }
    json moe = variant_config("26b-a4b", 6);
    moe["top_k_experts"] = 200;
    EXPECT_NE(error_of(moe).find("top_k_experts"), std::string::npos);
    moe = variant_config("26b-a4b", 6);
    moe.erase("moe_intermediate_size");
    EXPECT_NE(error_of(moe).find("moe_intermediate_size"), std::string::npos);
    EXPECT_NE(std::string([] {
                  try {
                      parse_config_text("{not json", "/x/config.json");
                  } catch (const Error& e) {
                      return std::string(e.what());
                  }
                  return std::string();
              }())
                  .find("/x/config.json"),
              std::string::npos);
}

}  // namespace
}  // namespace markbase
