// Bad tokenizer files, unsupported tokenizer kinds and bad input all give markbase::Error with a message that
// says what is wrong; never a crash and never a silently wrong tokenisation.
#include <filesystem>

#include "model/error.h"
#include "tokenizer_test_data.h"

namespace markbase::test {

namespace {

// A minimal valid Gemma-style tokenizer.json, edited by each test.
nlohmann::json tiny() {
    return nlohmann::json::parse(R"({
      "version": "1.0", "truncation": null, "padding": null,
      "added_tokens": [{"id": 0, "content": "<bos>", "single_word": false, "lstrip": false, "rstrip": false,
                        "normalized": false, "special": true}],
      "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
      "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\n+"}, "behavior": "Isolated", "invert": false},
      "post_processor": null,
      "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"},
                  "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"}]},
      "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                "vocab": {"<bos>": 0, "<unk>": 1, "a": 2, "b": 3, "ab": 4, "\u2581": 5, "\u2581ab": 6, "\n": 7},
                "merges": [["a", "b"], ["\u2581", "ab"]]}
    })");
}

// Expects from_json to throw markbase::Error whose message contains every one of `needles`.
void expect_error(const std::string& json, const std::vector<std::string>& needles) {
    try {
        Tokenizer::from_json(json, "test.json");
        ADD_FAILURE() << "no error for: " << json.substr(0, 200);
    } catch (const Error& e) {
        const std::string msg = e.what();
        for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "message: " << msg;
    }
}

}  // namespace

TEST(TokenizerErrors, TinyFileWorks) {
    const Tokenizer tok = Tokenizer::from_json(tiny().dump(), "tiny.json");
    EXPECT_EQ(tok.encode("ab ab\n\nab<bos>"), (std::vector<int>{4, 6, 7, 7, 4, 0}));
    EXPECT_EQ(tok.decode(std::vector<int>{4, 6, 7, 0}), "ab ab\n<bos>");
    EXPECT_EQ(tok.encode("c"), std::vector<int>{1});    // no byte tokens in this vocab: <unk>
    EXPECT_EQ(tok.encode("ccc"), std::vector<int>{1});  // fuse_unk
}

TEST(TokenizerErrors, NotJson) {
    expect_error("", {"test.json", "empty"});
    expect_error("hello world", {"test.json", "invalid JSON", "line 1"});
    expect_error("[1, 2, 3]", {"test.json", "JSON object"});
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}", {"test.json", "invalid JSON"});
    expect_error(std::string("{\"a\": \"\xff\"}"), {"test.json", "UTF-8"});
    std::string truncated = tiny().dump();
    truncated.resize(truncated.size() / 2);
    expect_error(truncated, {"test.json", "invalid JSON"});
    expect_error(tiny().dump() + " {}", {"after the top-level value"});
}

TEST(TokenizerErrors, TruncatedRealFile) {
    const std::string json = read_xz(tokenizer_data("gemma4/tokenizer.json.xz"));
    expect_error(json.substr(0, json.size() - 1000), {"test.json", "invalid JSON"});
}

TEST(TokenizerErrors, WrongModelType) {
    auto j = tiny();
    j["model"] = {{"type", "WordPiece"}, {"unk_token", "[UNK]"}, {"vocab", {{"[UNK]", 0}, {"a", 1}}}};
    expect_error(j.dump(), {"WordPiece", "only BPE"});
    j["model"] =
        nlohmann::json::parse(R"({"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0], ["a", -1.5]]})");
    expect_error(j.dump(), {"Unigram", "only BPE"});
    j["model"] = nlohmann::json::parse(R"({"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"})");
    expect_error(j.dump(), {"WordLevel"});
    j.erase("model");
    expect_error(j.dump(), {"no \"model\""});
}

TEST(TokenizerErrors, MissingOrBrokenVocab) {
    auto j = tiny();
    j["model"].erase("vocab");
    expect_error(j.dump(), {"model.vocab is missing"});
    j = tiny();
    j["model"].erase("merges");
    expect_error(j.dump(), {"model.merges is missing"});
    j = tiny();
    j["model"]["vocab"]["a"] = "two";
    expect_error(j.dump(), {"integer id"});
    j = tiny();
    j["model"]["vocab"]["zz"] = 2;  // id of "a"
    expect_error(j.dump(), {"id 2", "two tokens"});
    j = tiny();
    j["model"]["vocab"]["zz"] = -5;
    expect_error(j.dump(), {"-5"});
    j = tiny();
    j["model"]["unk_token"] = "<nope>";
    expect_error(j.dump(), {"unk_token", "<nope>"});
}

TEST(TokenizerErrors, MergesReferencingUnknownTokens) {
    auto j = tiny();
    j["model"]["merges"].push_back({"a", "q"});
    expect_error(j.dump(), {"model.merges[2]", "\"q\"", "not in model.vocab"});
    j = tiny();
    j["model"]["merges"].push_back({"b", "a"});  // "ba" is not a token
    expect_error(j.dump(), {"model.merges[2]", "\"ba\"", "result"});
    j = tiny();
    j["model"]["merges"] = {"a b", "\u2581 ab"};  // the legacy string form is accepted
    EXPECT_NO_THROW(Tokenizer::from_json(j.dump(), "legacy.json"));
    j["model"]["merges"] = {"a b c"};
    expect_error(j.dump(), {"two tokens"});
}

TEST(TokenizerErrors, UnsupportedPipelines) {
    auto j = tiny();
    j["normalizer"] = {{"type", "NFKC"}};
    expect_error(j.dump(), {"normalizer", "NFKC"});
    j = tiny();
    j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}};
    expect_error(j.dump(), {"pre_tokenizer", "ByteLevel"});
    j = tiny();
    j["pre_tokenizer"]["pattern"] = {{"Regex", "\\s+"}};
    expect_error(j.dump(), {"regex", "\\s+"});
    j = tiny();
    j["pre_tokenizer"]["invert"] = true;
    expect_error(j.dump(), {"invert"});
    j = tiny();
    j["decoder"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}};
    expect_error(j.dump(), {"decoder", "Metaspace"});
    j = tiny();
    j["added_tokens"][0]["lstrip"] = true;
    expect_error(j.dump(), {"added_tokens[0]", "lstrip"});
    j = tiny();
    j["model"]["dropout"] = 0.1;
    expect_error(j.dump(), {"dropout"});
    j = tiny();
    j["model"]["continuing_subword_prefix"] = "##";
    expect_error(j.dump(), {"continuing_subword_prefix"});
}

TEST(TokenizerErrors, FilesAndFolders) {
    const auto dir =
        std::filesystem::temp_directory_path() / ("markbase_tok_errors_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    try {
        Tokenizer::load(dir);
        ADD_FAILURE() << "no error for a folder without tokenizer.json";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("has no tokenizer.json"), std::string::npos) << e.what();
    }
    EXPECT_THROW(Tokenizer::load(dir / "nope.json"), Error);
    std::ofstream(dir / "tokenizer.json") << tiny().dump();
    EXPECT_EQ(Tokenizer::load(dir).encode("ab"), std::vector<int>{4});  // a model folder works
    std::filesystem::remove_all(dir);
}

TEST(TokenizerErrors, InvalidUtf8Input) {
    const Tokenizer& tok = gemma4();
    const std::vector<std::pair<std::string, std::string>> bad = {
        {"abc\xff", "offset 3"},           // never valid
        {"\xc3", "offset 0"},              // truncated sequence
        {"ok \xed\xa0\x80", "offset 3"},   // UTF-16 surrogate
        {"\xc0\xaf", "offset 0"},          // overlong '/'
        {"\xf4\x90\x80\x80", "offset 0"},  // past U+10FFFF
        {"\x80", "offset 0"}};             // lone continuation byte
    for (const auto& [text, where] : bad) {
        try {
            tok.encode(text);
            ADD_FAILURE() << "no error for invalid UTF-8";
        } catch (const Error& e) {
            const std::string msg = e.what();
            EXPECT_NE(msg.find("not valid UTF-8"), std::string::npos) << msg;
            EXPECT_NE(msg.find(where), std::string::npos) << msg;
        }
    }
}

TEST(TokenizerErrors, IdsOutOfRange) {
    const Tokenizer& tok = gemma4();
    EXPECT_THROW(tok.decode(std::vector<int>{262144}), Error);
    EXPECT_THROW(tok.decode(std::vector<int>{-1}), Error);
    StreamDecoder s(tok);
    EXPECT_THROW(s.push(1 << 30), Error);
    EXPECT_EQ(tok.token_text(-3), "");
    EXPECT_FALSE(tok.is_special(999999));
}

}  // namespace markbase::test
