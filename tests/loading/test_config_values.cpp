// config.json values that parse but cannot be right: numbers JSON cannot hold (1e999), values of the wrong
// type inside nested sections, integers that would wrap, norms and RoPE bases out of range, a required width
// left out (reported once, before any tensor is looked at), and stop ids outside the vocabulary. Each is a
// markbase::Error naming the file and the field.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loading/checkpoint.h"
#include "loading/config_json.h"
#include "loading/random_checkpoint.h"
#include "model/error.h"
#include "model/variants.h"
#include "support/error_text.h"
#include "support/tiny_models.h"

namespace markbase {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::expect_has;
using nlohmann::json;

std::string config_error(const json& j) {
    return error_of([&] { parse_config_text(j.dump(), "/m/config.json"); });
}

TEST(ConfigValues, NumbersJsonCannotHoldNameTheFileAndField) {
    std::string text = variant_config("e2b", 10).dump();
    const std::string key = "\"hidden_size\":";
    const size_t at = text.find(key);
    ASSERT_NE(at, std::string::npos);
    text.replace(at + key.size(), text.find_first_of(",}", at) - at - key.size(), "1e999");
    expect_has(error_of([&] { parse_config_text(text, "/m/config.json"); }),
               {"/m/config.json", "hidden_size"});
}

TEST(ConfigValues, WrongTypesInsideRopeParametersNameTheField) {
    json j = variant_config("e2b", 10);
    j["rope_parameters"]["full_attention"]["rope_type"] = 7;
    expect_has(config_error(j), {"/m/config.json", "rope_parameters.full_attention.rope_type"});
    j = variant_config("e2b", 10);
    j["rope_parameters"]["full_attention"]["partial_rotary_factor"] = "quarter";
    expect_has(config_error(j), {"/m/config.json", "partial_rotary_factor"});
    j = variant_config("e2b", 10);
    j["rope_parameters"]["sliding_attention"]["rope_theta"] = "big";
    expect_has(config_error(j), {"/m/config.json", "rope_theta", "\"big\""});
}

TEST(ConfigValues, IntegersDoNotWrap) {
    json j = variant_config("e2b", 10);
    j["hidden_size"] = 18446744073709551615ull;
    expect_has(config_error(j), {"hidden_size", "18446744073709551615"});
    j = variant_config("e2b", 10);
    j["bos_token_id"] = 4294967297ll;  // 2^32 + 1: wraps to 1 through int
    expect_has(config_error(j), {"/m/config.json", "bos_token_id", "4294967297"});
    j = variant_config("e2b", 10);
    j["pad_token_id"] = -1;
    expect_has(config_error(j), {"pad_token_id"});
}

TEST(ConfigValues, NormEpsilonAndRopeBaseMustBeUsable) {
    for (double eps : {-1e-6, 0.0}) {
        json j = variant_config("e2b", 10);
        j["rms_norm_eps"] = eps;
        expect_has(config_error(j), {"/m/config.json", "rms_norm_eps"});
    }
    for (double theta : {0.0, -10000.0}) {
        json j = variant_config("e2b", 10);
        j["rope_parameters"]["sliding_attention"]["rope_theta"] = theta;
        expect_has(config_error(j), {"/m/config.json", "rope_parameters.sliding_attention.rope_theta"});
    }
}

TEST(ConfigValues, StopIdsMustBeTokenIdsOfTheVocabulary) {
    json j = variant_config("e2b", 10);  // vocab 262144
    j["eos_token_id"] = 262144;
    expect_has(config_error(j), {"/m/config.json", "eos_token_id", "262144"});
    j["eos_token_id"] = json::array({1, 300000});
    expect_has(config_error(j), {"eos_token_id", "300000"});
    j["eos_token_id"] = "</s>";
    expect_has(config_error(j), {"eos_token_id", "</s>"});
    j["eos_token_id"] = json::array({1, 2.5});
    expect_has(config_error(j), {"eos_token_id", "2.5"});
    j["eos_token_id"] = -1;
    expect_has(config_error(j), {"eos_token_id"});
    // the nested layout's top-level list is held to the text model's vocabulary
    json nested = {{"model_type", "gemma4"},
                   {"text_config", variant_config("e2b", 10)},
                   {"eos_token_id", json::array({1, 262144})}};
    expect_has(config_error(nested), {"/m/config.json", "eos_token_id", "262144"});
    nested["eos_token_id"] = json::array({1, 106});
    EXPECT_EQ(parse_config_text(nested.dump(), "c").stop_ids, (std::vector<int>{1, 106}));
}

TEST(ConfigValues, EachMissingWidthIsNamedOnce) {
    for (const char* key : {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                            "num_key_value_heads", "head_dim", "intermediate_size"}) {
        json j = variant_config("e2b", 10);
        j.erase(key);
        const std::string msg = config_error(j);
        expect_has(msg, {"/m/config.json", std::string(key) + " is missing"});
        j[key] = nullptr;  // null is what transformers writes for "not set"
        expect_has(config_error(j), {std::string(key) + " is missing"});
    }
    json j = variant_config("e2b", 10);
    j.erase("hidden_size");
    j.erase("head_dim");
    expect_has(config_error(j), {"hidden_size", "head_dim", "are missing"});
}

// Through the whole loader: the missing key is the whole message, not a list of tensor shape mismatches.
TEST(ConfigValues, MissingHiddenSizeIsTheOnlyProblemReported) {
    testing::TempDir dir("nohidden");
    write_random_checkpoint(dir.path(), testing::tiny_config("e2b"), 1);
    json c = json::parse(std::ifstream(dir.path() / "config.json"));
    c.erase("hidden_size");
    std::ofstream(dir.path() / "config.json") << c.dump();
    const std::string msg = error_of([&] { load_checkpoint(dir.path()); });
    expect_has(msg, {(dir.path() / "config.json").string(), "hidden_size is missing"});
    EXPECT_EQ(msg.find("expected shape"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("problem"), std::string::npos) << msg;
}

// A config that leaves out every key whose transformers default is Gemma 4's own value still loads.
TEST(ConfigValues, DefaultValuedKeysMayStillBeLeftOut) {
    const fs::path dir = fs::path(MARKBASE_TEST_DATA) / "models" / "e4b-flat";
    const ModelConfig c = parse_config_file((dir / "config.json").string());
    EXPECT_EQ(c.hidden, 88);
    EXPECT_FLOAT_EQ(c.rms_eps, 1e-6f);
    EXPECT_EQ(c.stop_ids, std::vector<int>{1});
    EXPECT_EQ(c.bos_id, 2);
}

}  // namespace
}  // namespace markbase
