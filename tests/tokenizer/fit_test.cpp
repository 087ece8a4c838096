// A tokenizer whose ids exceed the model's vocabulary is reported where both are loaded, naming
// tokenizer.json, its largest id and the model's vocab_size.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "loading/checkpoint.h"
#include "loading/random_checkpoint.h"
#include "loading/tokenizer_fit.h"
#include "model/error.h"
#include "support/tiny_models.h"
#include "tokenizer/tokenizer.h"

namespace markbase {
namespace {

namespace fs = std::filesystem;

// A BPE tokenizer.json whose vocabulary's largest id is `largest`.
std::string tokenizer_json(int largest) {
    const nlohmann::json j = {{"model",
                               {{"type", "BPE"},
                                {"vocab", {{"a", 0}, {"b", 1}, {"<extra>", largest}}},
                                {"merges", nlohmann::json::array()}}}};
    return j.dump();
}

TEST(TokenizerFits, IdsBeyondTheVocabularyNameTheFileTheIdAndTheVocabulary) {
    testing::TempDir dir("tokfit");
    write_random_checkpoint(dir.path(), testing::tiny_config("e2b"), 1);  // vocab_size 256
    const auto ck = load_checkpoint(dir.path());
    const Tokenizer too_big = Tokenizer::from_json(tokenizer_json(300), "/m/tokenizer.json");
    try {
        check_tokenizer_fits(too_big, *ck);
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        const std::string msg = e.what();
        for (const std::string& n :
             {std::string("/m/tokenizer.json"), std::string("300"), std::string("<extra>"),
              (dir.path() / "config.json").string(), std::string("vocab_size 256")})
            EXPECT_NE(msg.find(n), std::string::npos) << "missing '" << n << "' in: " << msg;
    }
    EXPECT_NO_THROW(check_tokenizer_fits(Tokenizer::from_json(tokenizer_json(255)), *ck));
    EXPECT_NO_THROW(check_tokenizer_fits(Tokenizer::from_json(tokenizer_json(100)), ck->config));
}

TEST(TokenizerFits, TheBundledModelFits) {
    const fs::path model = fs::path(MARKBASE_TEST_DATA) / ".." / ".." / "models" / "default";
    const auto ck = load_checkpoint(model);
    EXPECT_NO_THROW(check_tokenizer_fits(Tokenizer::load(model), *ck));
}

}  // namespace
}  // namespace markbase
