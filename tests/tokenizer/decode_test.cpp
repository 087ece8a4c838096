// Round trips and the streaming decoder, on the corpus with both real tokenizers (no HF needed).
#include <random>

#include "tokenizer/utf8.h"
#include "tokenizer_test_data.h"

namespace markbase::test {

namespace {

bool valid_utf8(const std::string& s) {
    return tok::find_invalid_utf8(s) == std::string::npos;
}

std::string streamed(const Tokenizer& tok, const std::vector<int>& ids, bool skip, bool check_chunks = true) {
    StreamDecoder stream(tok, skip);
    std::string out;
    for (int id : ids) {
        const std::string chunk = stream.push(id);
        if (check_chunks) {
            EXPECT_TRUE(valid_utf8(chunk)) << "a pushed chunk splits a UTF-8 character";
        }
        out += chunk;
    }
    out += stream.flush();
    return out;
}

// Decoding gives back the text, except that the decoder turns a literal "▁" into a space (HF does the same).
std::string expected_round_trip(const std::string& text) {
    std::string out;
    for (std::size_t i = 0; i < text.size(); ++i) {
        if (text.compare(i, 3, "\xE2\x96\x81") == 0) {
            out.push_back(' ');
            i += 2;
        } else {
            out.push_back(text[i]);
        }
    }
    return out;
}

void corpus_round_trip(const Tokenizer& tok) {
    for (const auto& row : read_jsonl(tokenizer_data("corpus.jsonl"))) {
        const std::string text = row["text"].get<std::string>();
        const std::string name = row["name"].get<std::string>();
        const std::vector<int> ids =
            tok.encode(text);  // "<0x41>" typed as text stays text: BPE never builds it
        const std::string decoded = tok.decode(ids);
        EXPECT_EQ(decoded, expected_round_trip(text)) << name;
        EXPECT_EQ(streamed(tok, ids, false), decoded) << name;
        EXPECT_EQ(streamed(tok, ids, true), tok.decode(ids, true)) << name;
    }
}

}  // namespace

TEST(TokenizerRoundTrip, Gemma4Corpus) {
    corpus_round_trip(gemma4());
}
TEST(TokenizerRoundTrip, Gemma3Corpus) {
    corpus_round_trip(gemma3());
}

TEST(TokenizerRoundTrip, ByteFallbackReassembles) {
    const Tokenizer& tok = gemma4();
    // A character outside the vocabulary comes back through its <0xXX> tokens.
    const std::string rare =
        "\xF0\x9F\x80\x84 \xF0\xA0\x80\x80 \xF3\xB0\x80\x80";  // U+1F004, U+20000, U+F0000
    const std::vector<int> ids = tok.encode(rare);
    int bytes = 0;
    for (int id : ids) bytes += tok.is_byte_token(id);
    EXPECT_GT(bytes, 0) << "expected byte fallback for a private-use character";
    EXPECT_EQ(tok.decode(ids), rare);
    EXPECT_EQ(streamed(tok, ids, false), rare);
}

TEST(TokenizerRoundTrip, StreamHoldsByteRunsUntilComplete) {
    const Tokenizer& tok = gemma4();
    const int e2 = *tok.token_id("<0xE2>"), x9c = *tok.token_id("<0x9C>"), x85 = *tok.token_id("<0x85>");
    StreamDecoder s(tok);
    EXPECT_EQ(s.push(e2), "");
    EXPECT_EQ(s.push(x9c), "");
    EXPECT_EQ(s.push(x85), "");                    // a run ends only at the next ordinary token
    EXPECT_EQ(s.push(9259), "\xE2\x9C\x85Hello");  // U+2705 then "Hello"
    EXPECT_EQ(s.push(e2), "");
    EXPECT_EQ(s.flush(), "\xEF\xBF\xBD");  // an incomplete run becomes U+FFFD per byte, as HF
    EXPECT_EQ(s.flush(), "");
    // Metaspace pieces print as spaces; special tokens print unless skipped.
    StreamDecoder t(tok);
    EXPECT_EQ(t.push(2), "<bos>");
    EXPECT_EQ(t.push(*tok.token_id("\xE2\x96\x81Hello")), " Hello");
    StreamDecoder u(tok, true);
    EXPECT_EQ(u.push(2), "");
    EXPECT_EQ(u.push(100), "<|channel>");  // added but not special: HF prints it even when skipping specials
}

TEST(TokenizerRoundTrip, RandomIdStreamsEqualDecode) {
    // Model output can be any id sequence: byte tokens in odd orders, specials between them, invalid runs.
    for (const Tokenizer* tok : {&gemma4(), &gemma3()}) {
        std::mt19937 rng(7);
        const int first_byte = *tok->token_id("<0x00>");
        std::vector<int> pool;
        for (int b = 0; b < 256; ++b)
            pool.push_back(*tok->token_id([&] {
                char name[8];
                std::snprintf(name, sizeof name, "<0x%02X>", b);
                return std::string(name);
            }()));
        for (int id : {0, 1, 2, 100, 101, 105, 106, 107, 108, 138, 9259, 236743, 236800}) pool.push_back(id);
        (void)first_byte;
        for (int round = 0; round < 200; ++round) {
            std::vector<int> ids;
            const int n = 1 + static_cast<int>(rng() % 40);
            for (int k = 0; k < n; ++k) {
                const bool any = rng() % 4 == 0;
                ids.push_back(any ? static_cast<int>(rng() % tok->vocab_size()) : pool[rng() % pool.size()]);
            }
            for (bool skip : {false, true}) {
                const std::string whole = tok->decode(ids, skip);
                EXPECT_TRUE(valid_utf8(whole));
                EXPECT_EQ(streamed(*tok, ids, skip), whole) << "ids: " << ids_str(ids);
            }
        }
    }
}

TEST(TokenizerRoundTrip, EmptyAndWhitespace) {
    const Tokenizer& tok = gemma4();
    EXPECT_TRUE(tok.encode("").empty());
    EXPECT_EQ(tok.decode(std::vector<int>{}), "");
    for (const std::string& s :
         std::vector<std::string>{" ", "\n", "\t", "\r\n", "  \n\n  ", std::string(1, '\0')})
        EXPECT_EQ(tok.decode(tok.encode(s)), s);
}

}  // namespace markbase::test
