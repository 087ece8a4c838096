// Exact agreement with HF `tokenizers` / `transformers` on the corpus, the decode cases and the chat
// conversations. The golden files are written by tools/make_tokenizer_goldens.py (run where HF is installed)
// into tests/data/tokenizer/goldens/. A missing or stale golden file is a failure, not a skip.
#include <filesystem>

#include "tokenizer/chat_format.h"
#include "tokenizer_test_data.h"

namespace markbase::test {

namespace {

const char* kHowTo =
    "generate it with `python3 tools/make_tokenizer_goldens.py --out OUT` on a machine with HF tokenizers "
    "and "
    "transformers, then copy OUT/*.jsonl to tests/data/tokenizer/goldens/";

std::vector<nlohmann::json> golden(const std::string& file) {
    const std::string path = tokenizer_data("goldens/" + file);
    if (!std::filesystem::exists(path)) {
        ADD_FAILURE() << "missing golden file " << path << ": " << kHowTo;
        return {};
    }
    return read_jsonl(path);
}

void check_encode(const Tokenizer& tok, const std::string& file) {
    const auto corpus = read_jsonl(tokenizer_data("corpus.jsonl"));
    const auto rows = golden(file);
    ASSERT_FALSE(rows.empty()) << file << " holds no rows: " << kHowTo;
    ASSERT_EQ(rows.size(), corpus.size()) << file << " is stale (corpus.jsonl changed): " << kHowTo;
    for (std::size_t i = 0; i < rows.size(); ++i) {
        const auto& row = rows[i];
        const std::string name = row["name"].get<std::string>();
        const std::string text = row["text"].get<std::string>();
        ASSERT_EQ(text, corpus[i]["text"].get<std::string>())
            << file << " is stale at " << name << ": " << kHowTo;
        const std::vector<int> want = row["ids"].get<std::vector<int>>();
        const std::vector<int> got = tok.encode(text);
        EXPECT_EQ(ids_str(got), ids_str(want)) << file << ": " << name;
        EXPECT_EQ(tok.decode(want), row["decoded"].get<std::string>()) << file << ": decode of " << name;
        EXPECT_EQ(tok.decode(want, true), row["decoded_skip"].get<std::string>())
            << file << ": decode(skip_special) of " << name;
    }
}

void check_decode(const Tokenizer& tok, const std::string& file) {
    const auto cases = read_jsonl(tokenizer_data("decode_cases.jsonl"));
    const auto rows = golden(file);
    ASSERT_FALSE(rows.empty()) << file << " holds no rows: " << kHowTo;
    ASSERT_EQ(rows.size(), cases.size()) << file << " is stale (decode_cases.jsonl changed): " << kHowTo;
    for (std::size_t i = 0; i < rows.size(); ++i) {
        const auto& row = rows[i];
        const std::string name = row["name"].get<std::string>();
        ASSERT_EQ(name, cases[i]["name"].get<std::string>()) << file << " is stale: " << kHowTo;
        if (row.contains("missing")) {
            for (const auto& piece : row["missing"])
                EXPECT_FALSE(tok.token_id(piece.get<std::string>()).has_value())
                    << name << ": HF has no token " << piece;
            continue;
        }
        const std::vector<int> ids = row["ids"].get<std::vector<int>>();
        if (cases[i].contains("pieces")) {
            const auto pieces = cases[i]["pieces"].get<std::vector<std::string>>();
            ASSERT_EQ(pieces.size(), ids.size());
            for (std::size_t k = 0; k < ids.size(); ++k)
                EXPECT_EQ(tok.token_id(pieces[k]), ids[k]) << pieces[k];
        }
        EXPECT_EQ(tok.decode(ids), row["decoded"].get<std::string>()) << file << ": " << name;
        EXPECT_EQ(tok.decode(ids, true), row["decoded_skip"].get<std::string>()) << file << ": skip " << name;
        for (bool skip : {false, true}) {  // streaming reproduces the same text
            StreamDecoder stream(tok, skip);
            std::string streamed;
            for (int id : ids) streamed += stream.push(id);
            streamed += stream.flush();
            EXPECT_EQ(streamed, row[skip ? "decoded_skip" : "decoded"].get<std::string>())
                << "stream " << name;
        }
    }
}

}  // namespace

TEST(TokenizerGoldens, Gemma4EncodeMatchesHF) {
    check_encode(gemma4(), "gemma4_encode.jsonl");
}
TEST(TokenizerGoldens, Gemma3EncodeMatchesHF) {
    check_encode(gemma3(), "gemma3_encode.jsonl");
}
TEST(TokenizerGoldens, Gemma4DecodeMatchesHF) {
    check_decode(gemma4(), "gemma4_decode.jsonl");
}
TEST(TokenizerGoldens, Gemma3DecodeMatchesHF) {
    check_decode(gemma3(), "gemma3_decode.jsonl");
}

TEST(ChatGoldens, Gemma4TemplateMatchesTransformers) {
    const auto cases = read_jsonl(tokenizer_data("gemma4/chat_cases.jsonl"));
    const auto rows = golden("gemma4_chat.jsonl");
    ASSERT_FALSE(rows.empty()) << "gemma4_chat.jsonl holds no rows: " << kHowTo;
    ASSERT_EQ(rows.size(), cases.size())
        << "gemma4_chat.jsonl is stale (chat_cases.jsonl changed): " << kHowTo;
    for (std::size_t i = 0; i < rows.size(); ++i) {
        const auto& row = rows[i];
        const std::string name = row["name"].get<std::string>();
        ASSERT_EQ(row["messages"], cases[i]["messages"]) << "gemma4_chat.jsonl is stale at " << name;
        std::vector<ChatMessage> messages;
        for (const auto& m : row["messages"])
            messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
        const std::string text = render_gemma4_chat(messages, row["add_generation_prompt"].get<bool>(),
                                                    row["enable_thinking"].get<bool>());
        EXPECT_EQ(text, row["text"].get<std::string>()) << name;
        EXPECT_EQ(ids_str(gemma4().encode(text)), ids_str(row["ids"].get<std::vector<int>>())) << name;
    }
}

}  // namespace markbase::test
