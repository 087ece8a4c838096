// The Gemma 4 chat formatter's rules, spelled out (the transformers goldens in goldens_test.cpp are the
// authority; these pin the shape so a failure says which rule broke).
#include "model/error.h"
#include "tokenizer/chat_format.h"
#include "tokenizer_test_data.h"

namespace markbase::test {

TEST(ChatFormat, UserTurnWithGenerationPrompt) {
    EXPECT_EQ(render_gemma4_chat({{"user", "Hello!"}}, true),
              "<bos><|turn>user\nHello!<turn|>\n<|turn>model\n<|channel>thought\n<channel|>");
    EXPECT_EQ(render_gemma4_chat({{"user", "Hello!"}}, true, true),
              "<bos><|turn>system\n<|think|><turn|>\n<|turn>user\nHello!<turn|>\n<|turn>model\n");
    EXPECT_EQ(render_gemma4_chat({{"user", "Hello!"}}, false), "<bos><|turn>user\nHello!<turn|>\n");
}

TEST(ChatFormat, SystemTurnAndAssistantAsModel) {
    const std::vector<ChatMessage> chat = {{"system", "  Be brief. "},
                                           {"user", "Hi"},
                                           {"assistant", "<|channel>thought\nplan<channel|>Hello!"},
                                           {"user", "Bye"}};
    EXPECT_EQ(
        render_gemma4_chat(chat, true, true),
        "<bos><|turn>system\n<|think|>Be brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\nHello!<turn|>\n"
        "<|turn>user\nBye<turn|>\n<|turn>model\n");
}

TEST(ChatFormat, EncodesWithOneBos) {
    const std::vector<int> ids = gemma4().encode(render_gemma4_chat({{"user", "Hi"}}, true));
    ASSERT_GE(ids.size(), 4u);
    EXPECT_EQ(ids[0], 2);
    EXPECT_EQ(ids[1], 105);
    EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 1);
    EXPECT_EQ(ids.back(), 101);  // <channel|>
}

TEST(ChatFormat, StripThinkingAndTrim) {
    EXPECT_EQ(strip_thinking("  A<|channel>x<channel|>B<|channel>y<channel|> C  "), "AB C");
    EXPECT_EQ(strip_thinking("Answer <|channel>never closed"), "Answer");
    EXPECT_EQ(strip_thinking("abc<channel|>def"), "abcdef");
    EXPECT_EQ(strip_thinking("\u3000\u00a0 x \u2028\n"), "x");  // Python's str.strip() whitespace set
    EXPECT_EQ(strip_thinking("\u200bx"), "\u200bx");            // U+200B is not whitespace to Python
}

TEST(ChatFormat, StopIdsAndErrors) {
    EXPECT_EQ(default_stop_ids(), (std::vector<int>{1, 106, 50}));
    EXPECT_THROW(render_gemma4_chat({}, true), Error);
}

TEST(ChatFormat, SplitModelReply) {
    ModelReply r = split_model_reply("<|channel>thought\nLet me add.\n<channel|>It is 4.");
    EXPECT_EQ(r.thinking, "Let me add.");
    EXPECT_EQ(r.answer, "It is 4.");
    r = split_model_reply("Just an answer.\n");
    EXPECT_EQ(r.thinking, "");
    EXPECT_EQ(r.answer, "Just an answer.");
    r = split_model_reply("<|channel>thought\nstill going");
    EXPECT_EQ(r.thinking, "still going");
    EXPECT_EQ(r.answer, "");
}

}  // namespace markbase::test
