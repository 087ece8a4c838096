// JSON values nested 100,000 deep (or merely long) in every JSON file the loader reads: config.json, a
// safetensors header (a tensor entry, __metadata__), the shard index's weight_map and tokenizer.json. Each
// must give a markbase::Error naming the file and the field, short enough to read, never a stack overflow.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "loading/config_json.h"
#include "loading/json_excerpt.h"
#include "loading/safetensors.h"
#include "model/error.h"
#include "model/variants.h"
#include "support/error_text.h"
#include "support/tiny_models.h"
#include "tokenizer/tokenizer.h"

namespace markbase {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using nlohmann::json;

constexpr int kDeep = 100000;

std::string deep_array(int levels) {
    return std::string(size_t(levels), '[') + std::string(size_t(levels), ']');
}

// `j` serialised with the string "@DEEP@" replaced by `raw` (a value nlohmann could not hold while dumping).
std::string with_raw(const json& j, const std::string& raw) {
    std::string s = j.dump();
    const std::string mark = "\"@DEEP@\"";
    const size_t at = s.find(mark);
    EXPECT_NE(at, std::string::npos);
    s.replace(at, mark.size(), raw);
    return s;
}

void expect_names(const std::string& msg, const std::vector<std::string>& needles) {
    testing::expect_has(msg, needles);
    EXPECT_LT(msg.size(), 600u) << msg.substr(0, 600);
}

TEST(ConfigDeepJson, DeepValuesInFieldsAreErrorsNamingTheField) {
    const json base = variant_config("e2b", 10);
    for (const char* field : {"hidden_size", "rope_parameters", "layer_types"}) {
        for (int levels : {kDeep, 300}) {
            json j = base;
            if (std::string(field) == "rope_parameters")
                j[field]["full_attention"] = "@DEEP@";
            else if (std::string(field) == "layer_types")
                j[field][0] = "@DEEP@";
            else
                j[field] = "@DEEP@";
            const std::string text = with_raw(j, deep_array(levels));
            SCOPED_TRACE(std::string(field) + " " + std::to_string(levels));
            expect_names(error_of([&] { parse_config_text(text, "/m/config.json"); }),
                         {"/m/config.json", field});
        }
    }
}

TEST(ConfigDeepJson, LongValuesAreQuotedShortened) {
    json j = variant_config("e2b", 10);
    j["hidden_size"] = std::string(100000, 'x');
    expect_names(error_of([&] { parse_config_text(j.dump(), "config.json"); }),
                 {"config.json", "hidden_size"});
}

std::string header_file(const fs::path& p, const std::string& header) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[size_t(i)] = char(uint8_t(uint64_t(header.size()) >> (8 * i)));
    std::ofstream(p, std::ios::binary) << s << header;
    return p.string();
}

TEST(SafetensorsDeepJson, DeepHeaderValuesAreErrorsNamingTheTensor) {
    testing::TempDir dir("deepst");
    for (int levels : {kDeep, 300}) {
        const std::string f = header_file(dir.path() / "entry.safetensors",
                                          with_raw({{"deep_weight", "@DEEP@"}}, deep_array(levels)));
        expect_names(error_of([&] { SafetensorsSet::open(f); }), {f, "deep_weight"});
        const std::string m =
            header_file(dir.path() / "meta.safetensors",
                        with_raw({{"__metadata__", {{"k", "@DEEP@"}}}}, deep_array(levels)));
        expect_names(error_of([&] { SafetensorsSet::open(m); }), {m, "__metadata__", "k"});
    }
}

TEST(SafetensorsDeepJson, DeepWeightMapValueIsAnErrorNamingTheTensor) {
    testing::TempDir dir("deepidx");
    for (int levels : {kDeep, 300}) {
        const json index = {{"metadata", json::object()}, {"weight_map", {{"deep_weight", "@DEEP@"}}}};
        std::ofstream(dir.path() / "model.safetensors.index.json") << with_raw(index, deep_array(levels));
        expect_names(error_of([&] { SafetensorsSet::open(dir.path()); }),
                     {"model.safetensors.index.json", "weight_map", "deep_weight"});
    }
}

// A tokenizer.json normalizer Sequence nested 100,000 deep: each level would be one recursive call.
TEST(TokenizerDeepJson, DeeplyNestedSectionIsAnError) {
    std::string normalizer;
    for (int i = 0; i < kDeep; ++i) normalizer += R"({"type": "Sequence", "normalizers": [)";
    normalizer += R"({"type": "Prepend", "prepend": "x"})";
    for (int i = 0; i < kDeep; ++i) normalizer += "]}";
    const json tok = {{"normalizer", "@DEEP@"},
                      {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}}}, {"merges", json::array()}}}};
    const std::string text = with_raw(tok, normalizer);
    expect_names(error_of([&] { Tokenizer::from_json(text, "/m/tokenizer.json"); }),
                 {"/m/tokenizer.json", "normalizer"});
}

TEST(ConfigDeepJson, ExcerptIsBoundedAndIterative) {
    json v = json::array();
    for (int i = 0; i < kDeep; ++i) v = json::array({std::move(v)});
    const std::string e = json_excerpt(v);
    EXPECT_LT(e.size(), 200u);
    EXPECT_NE(e.find("100001"), std::string::npos) << e;
    EXPECT_EQ(json_excerpt(json(42)), "42");
    EXPECT_EQ(json_excerpt(json("big")), "\"big\"");
    EXPECT_LT(json_excerpt(json(std::string(10000, 'x'))).size(), 120u);
    EXPECT_EQ(json_excerpt(json::parse(R"({"a": [1, 2]})")), R"({"a":[1,2]})");
}

}  // namespace
}  // namespace markbase
