// llama.cpp's 46 reference tokenisations for Gemma 4 (tests/data/tokenizer/gemma4/reference-tokenizations.*),
// which HF tokenizers also reproduces. The .inp file separates inputs with "\n__ggml_vocab_test__\n"; the
// .out file has one line of space-separated ids per input.
#include "tokenizer_test_data.h"

namespace markbase::test {

TEST(TokenizerReference, LlamaCppGemma4All46) {
    const std::string inp = read_file(tokenizer_data("gemma4/reference-tokenizations.inp"));
    const std::string sep = "\n__ggml_vocab_test__\n";
    std::vector<std::string> inputs;
    for (std::size_t p = 0;;) {
        const std::size_t q = inp.find(sep, p);
        inputs.push_back(inp.substr(p, q == std::string::npos ? std::string::npos : q - p));
        if (q == std::string::npos) break;
        p = q + sep.size();
    }
    std::vector<std::string> outputs;
    std::istringstream out(read_file(tokenizer_data("gemma4/reference-tokenizations.out")));
    for (std::string line; std::getline(out, line);) outputs.push_back(line);
    ASSERT_EQ(inputs.size(), 46u);
    ASSERT_EQ(outputs.size(), 46u);
    const Tokenizer& tok = gemma4();
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        const std::vector<int> ids = tok.encode(inputs[i]);
        EXPECT_EQ(ids_str(ids), outputs[i]) << "reference input #" << i << ": [" << inputs[i] << "]";
        EXPECT_EQ(tok.decode(ids), inputs[i]) << "round trip of reference input #" << i;
    }
}

TEST(TokenizerReference, Gemma4KnownIds) {
    const Tokenizer& tok = gemma4();
    EXPECT_EQ(tok.vocab_size(), 262144);
    EXPECT_EQ(tok.bos_id(), 2);
    const std::vector<std::pair<std::string, int>> known = {{"<pad>", 0},
                                                            {"<eos>", 1},
                                                            {"<bos>", 2},
                                                            {"<unk>", 3},
                                                            {"<mask>", 4},
                                                            {"<|tool>", 46},
                                                            {"<tool|>", 47},
                                                            {"<|tool_call>", 48},
                                                            {"<tool_call|>", 49},
                                                            {"<|tool_response>", 50},
                                                            {"<tool_response|>", 51},
                                                            {"<|\"|>", 52},
                                                            {"<|think|>", 98},
                                                            {"<|channel>", 100},
                                                            {"<channel|>", 101},
                                                            {"<|turn>", 105},
                                                            {"<turn|>", 106},
                                                            {"<|image>", 255999},
                                                            {"<|audio>", 256000},
                                                            {"<|image|>", 258880},
                                                            {"<|audio|>", 258881},
                                                            {"<image|>", 258882},
                                                            {"<audio|>", 258883},
                                                            {"<|video|>", 258884}};
    for (const auto& [text, id] : known) {
        EXPECT_EQ(tok.token_id(text), id) << text;
        EXPECT_EQ(tok.token_text(id), text);
        EXPECT_EQ(tok.encode(text), std::vector<int>{id}) << "added token inside text: " << text;
    }
    // Special vs non-special, as the file's added_tokens declare them.
    EXPECT_TRUE(tok.is_special(2));
    EXPECT_TRUE(tok.is_special(106));
    EXPECT_TRUE(tok.is_special(98));
    EXPECT_FALSE(tok.is_special(100));  // <|channel> is an added token but not special
    EXPECT_FALSE(tok.is_special(50));
    EXPECT_TRUE(tok.is_added(100));
    EXPECT_FALSE(tok.is_added(9259));
    EXPECT_TRUE(tok.is_byte_token(*tok.token_id("<0x0A>")));
    EXPECT_EQ(tok.token_text(9259), "Hello");
}

TEST(TokenizerReference, Gemma3Loads) {
    const Tokenizer& tok = gemma3();
    EXPECT_EQ(tok.vocab_size(), 262145);  // <image_soft_token> is an added token past the vocabulary
    EXPECT_EQ(tok.token_id("<image_soft_token>"), 262144);
    EXPECT_EQ(tok.token_id("<start_of_turn>"), 105);
    EXPECT_EQ(tok.token_id("<end_of_turn>"), 106);
    EXPECT_EQ(tok.encode("<start_of_turn>user\n"), (std::vector<int>{105, 2364, 107}));
}

}  // namespace markbase::test
