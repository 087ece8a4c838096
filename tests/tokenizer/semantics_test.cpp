// HF `tokenizers` semantics that the Gemma files do not exercise but the loader accepts: merge order and
// ties, Split behaviors, normalized added tokens, Prepend, ignore_merges, decoders. Small hand-made
// tokenizers; every expected value here was checked against HF tokenizers 0.23.2 (Tokenizer.from_str of the
// same JSON).
#include "tokenizer_test_data.h"

namespace markbase::test {

namespace {

Tokenizer make(nlohmann::json model_vocab, nlohmann::json merges,
               nlohmann::json extra = nlohmann::json::object()) {
    nlohmann::json j = {{"model",
                         {{"type", "BPE"},
                          {"vocab", std::move(model_vocab)},
                          {"merges", std::move(merges)},
                          {"unk_token", nullptr},
                          {"byte_fallback", false}}},
                        {"decoder", {{"type", "Fuse"}}}};
    for (auto& [k, v] : extra.items()) j[k] = v;
    return Tokenizer::from_json(j.dump(), "synthetic.json");
}

}  // namespace

TEST(TokenizerSemantics, MergeRankThenLeftmost) {
    const nlohmann::json vocab = {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}, {"abc", 5}, {"aa", 6}};
    // Rank decides: b+c (rank 0) beats a+b (rank 1), then a+bc.
    auto merges = [](const char* list) { return nlohmann::json::parse(list); };
    EXPECT_EQ(make(vocab, merges(R"([["b", "c"], ["a", "b"], ["a", "bc"]])")).encode("abc"),
              (std::vector<int>{5}));
    EXPECT_EQ(make(vocab, merges(R"([["b", "c"], ["a", "b"]])")).encode("abc"), (std::vector<int>{0, 4}));
    EXPECT_EQ(make(vocab, merges(R"([["a", "b"], ["b", "c"]])")).encode("abc"), (std::vector<int>{3, 2}));
    // Ties go to the leftmost pair: "aaa" -> "aa" + "a".
    EXPECT_EQ(make(vocab, merges(R"([["a", "a"]])")).encode("aaa"), (std::vector<int>{6, 0}));
    // A repeated merge keeps its last rank (HF builds a map from the list).
    EXPECT_EQ(make(vocab, merges(R"([["a", "b"], ["b", "c"], ["a", "b"]])")).encode("abc"),
              (std::vector<int>{0, 4}));
}

TEST(TokenizerSemantics, IgnoreMerges) {
    nlohmann::json j = {{"model",
                         {{"type", "BPE"},
                          {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}, {"abab", 3}}},
                          {"merges", nlohmann::json::parse(R"([["a", "b"]])")},
                          {"ignore_merges", true}}}};
    const Tokenizer tok = Tokenizer::from_json(j.dump(), "x.json");
    EXPECT_EQ(tok.encode("abab"), std::vector<int>{3});  // whole word in the vocabulary: no merging
    EXPECT_EQ(tok.encode("ababa"), (std::vector<int>{2, 2, 0}));
}

TEST(TokenizerSemantics, SplitBehaviors) {
    const nlohmann::json vocab = {{"a", 0}, {"-", 1}, {"a-", 2}, {"-a", 3}, {"--", 4}};
    const nlohmann::json merges = nlohmann::json::array();
    auto with = [&](const std::string& behavior, const std::string& regex) {
        return make(vocab, merges,
                    {{"pre_tokenizer",
                      {{"type", "Split"},
                       {"pattern", {{"Regex", regex}}},
                       {"behavior", behavior},
                       {"invert", false}}}});
    };
    // Without merges every character is its own token, so the split shows only through which merges could
    // apply; check the piece boundaries through a vocabulary whose two-character tokens need merges.
    const nlohmann::json merges2 = nlohmann::json::parse(R"([["a", "-"], ["-", "a"], ["-", "-"]])");
    auto with2 = [&](const std::string& behavior) {
        return make(vocab, merges2,
                    {{"pre_tokenizer",
                      {{"type", "Split"},
                       {"pattern", {{"String", "-"}}},
                       {"behavior", behavior},
                       {"invert", false}}}});
    };
    EXPECT_EQ(with2("Isolated").encode("a-a"), (std::vector<int>{0, 1, 0}));
    EXPECT_EQ(with2("Removed").encode("a-a"), (std::vector<int>{0, 0}));
    EXPECT_EQ(with2("MergedWithPrevious").encode("a-a"), (std::vector<int>{2, 0}));
    EXPECT_EQ(with2("MergedWithNext").encode("a-a"), (std::vector<int>{0, 3}));
    EXPECT_EQ(with2("Contiguous").encode("a--a"), (std::vector<int>{0, 4, 0}));
    EXPECT_EQ(with2("Isolated").encode("a--a"), (std::vector<int>{0, 1, 1, 0}));
    EXPECT_EQ(with2("MergedWithPrevious").encode("a--a"), (std::vector<int>{2, 1, 0}));
    EXPECT_EQ(with("Isolated", "-+").encode("a--a"), (std::vector<int>{0, 1, 1, 0}));
    EXPECT_EQ(make(vocab, merges2,
                   {{"pre_tokenizer",
                     {{"type", "Split"},
                      {"pattern", {{"Regex", "-+"}}},
                      {"behavior", "Isolated"},
                      {"invert", false}}}})
                  .encode("a--a"),
              (std::vector<int>{0, 4, 0}));
}

TEST(TokenizerSemantics, NormalizedAddedTokensAndPrepend) {
    nlohmann::json added = nlohmann::json::array();
    added.push_back({{"id", 10},
                     {"content", " x"},
                     {"special", false},
                     {"normalized", true},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"single_word", false}});
    added.push_back({{"id", 11},
                     {"content", "<s>"},
                     {"special", true},
                     {"normalized", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"single_word", false}});
    const nlohmann::json vocab = {{"\u2581", 0}, {"a", 1}, {"x", 2}, {"\u2581x", 3}, {"<s>", 4}};
    const nlohmann::json normalizer = nlohmann::json::parse(R"({"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]})");
    const Tokenizer tok =
        make(vocab, nlohmann::json::array(), {{"added_tokens", added}, {"normalizer", normalizer}});
    // " x" (raw space) is not a vocabulary token, so it gets the next id past the vocabulary; "<s>" is one
    // (id 4).
    EXPECT_EQ(tok.token_id(" x"), 5);
    EXPECT_EQ(tok.token_id("<s>"), 4);
    // The normalized pattern is normalize(" x") = "▁▁x" (Prepend, then Replace). Prepend applies to each
    // stretch between raw added tokens: "a x" -> "▁a▁x" (no match), "a  x" -> "▁a▁▁x" (match), "a" -> "▁a".
    EXPECT_EQ(tok.encode("a x<s>a"), (std::vector<int>{0, 1, 0, 2, 4, 0, 1}));
    EXPECT_EQ(tok.encode("a  x"), (std::vector<int>{0, 1, 5}));
    EXPECT_TRUE(tok.is_special(4));
    EXPECT_FALSE(tok.is_special(5));
    // HF 0.23 decodes a normalized added token as its normalized form ("▁▁x" here).
    EXPECT_EQ(tok.decode(std::vector<int>{0, 1, 5, 4}),
              "\xE2\x96\x81"
              "a\xE2\x96\x81\xE2\x96\x81"
              "x<s>");
}

TEST(TokenizerSemantics, NoDecoderJoinsWithSpaces) {
    nlohmann::json j = {
        {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}}}, {"merges", nlohmann::json::array()}}}};
    const Tokenizer tok = Tokenizer::from_json(j.dump(), "x.json");
    EXPECT_EQ(tok.decode(std::vector<int>{0, 1, 0}), "a b a");
    StreamDecoder s(tok);
    std::string out;
    for (int id : {0, 1, 0}) out += s.push(id);
    EXPECT_EQ(out + s.flush(), "a b a");
}

}  // namespace markbase::test
