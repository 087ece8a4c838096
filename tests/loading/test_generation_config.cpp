// generation_config.json: the checkpoint's sampling defaults and stop ids are checked when the file is read,
// and a bad value is reported against the file and its key (not as a command-line flag nobody gave).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loading/generation_config.h"
#include "model/error.h"
#include "support/tiny_models.h"

namespace markbase {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kModel = fs::path(MARKBASE_TEST_DATA) / ".." / ".." / "models" / "default";

// A folder holding the bundled model's config.json (vocab 8192) and the given generation_config.json text.
class GenerationConfig : public ::testing::Test {
  protected:
    std::string error_for(const std::string& text) {
        fs::copy_file(kModel / "config.json", dir.path() / "config.json",
                      fs::copy_options::overwrite_existing);
        std::ofstream(dir.path() / "generation_config.json") << text;
        try {
            read_generation_config(dir.path());
        } catch (const Error& e) {
            return e.what();
        } catch (const std::exception& e) {
            return std::string("(not a markbase::Error) ") + e.what();
        }
        return "(no error)";
    }
    void expect_error(const json& j, const std::string& key) {
        const std::string msg = error_for(j.dump());
        EXPECT_NE(msg.find((dir.path() / "generation_config.json").string()), std::string::npos) << msg;
        EXPECT_NE(msg.find(key), std::string::npos) << msg;
        EXPECT_EQ(msg.find("--"), std::string::npos) << "reads as a flag: " << msg;
    }
    testing::TempDir dir{"genconfig"};
};

TEST_F(GenerationConfig, TheBundledFileReads) {
    const GenerationDefaults g = read_generation_config(kModel);
    EXPECT_FLOAT_EQ(g.temperature.value(), 0.8f);
    EXPECT_EQ(g.top_k.value(), 64);
    EXPECT_FLOAT_EQ(g.top_p.value(), 0.95f);
    EXPECT_TRUE(g.do_sample);
    EXPECT_EQ(g.stop_ids, (std::vector<int>{1, 106, 50}));
    EXPECT_EQ(error_for(R"({"temperature": null, "top_k": 0, "top_p": 1.0, "min_p": 0})"), "(no error)");
}

TEST_F(GenerationConfig, OutOfRangeValuesNameTheFileAndKey) {
    expect_error({{"temperature", -1}}, "temperature");
    expect_error({{"top_p", 7}}, "top_p");
    expect_error({{"top_p", 0}}, "top_p");
    expect_error({{"top_k", -3}}, "top_k");
    expect_error({{"top_k", 4294967297ll}}, "top_k");  // wrapped to 1 through int
    expect_error({{"min_p", 2}}, "min_p");
    expect_error({{"repetition_penalty", 0}}, "repetition_penalty");
}

TEST_F(GenerationConfig, WrongTypesNameTheFileAndKey) {
    expect_error({{"temperature", "hot"}}, "temperature");
    expect_error({{"top_k", 2.5}}, "top_k");
    expect_error({{"do_sample", "yes"}}, "do_sample");
    expect_error({{"eos_token_id", "</s>"}}, "eos_token_id");
    expect_error({{"eos_token_id", json::array({1, "x"})}}, "eos_token_id");
    const std::string msg = error_for(R"({"temperature": 1e999})");
    EXPECT_NE(msg.find("generation_config.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find("temperature"), std::string::npos) << msg;
}

TEST_F(GenerationConfig, StopIdsOutsideTheVocabularyNameTheFile) {
    expect_error({{"eos_token_id", 8192}}, "eos_token_id");
    expect_error({{"eos_token_id", json::array({1, 9000})}}, "9000");
    expect_error({{"eos_token_id", -1}}, "eos_token_id");
    EXPECT_EQ(error_for(R"({"eos_token_id": [1, 8191]})"), "(no error)");
}

}  // namespace
}  // namespace markbase
