// What a client sees of a reply: the streaming text equals the tokenizer's decode, a multi-byte character is
// never split, a stop string is found across token boundaries and never shown, a possible start of one is
// held back and released when it turns out not to be one; and the logprobs are a tempered log-softmax.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "server/logprobs.h"
#include "server/reply_text.h"
#include "tokenizer/tokenizer.h"

namespace markbase::server {
namespace {

const std::string kTokenizer = std::string(MARKBASE_TEST_DATA) + "/../../models/default/tokenizer.json";

const Tokenizer& tok() {
    static const Tokenizer t = Tokenizer::load(kTokenizer);
    return t;
}

struct Streamed {
    std::vector<std::string> pieces;  // per token
    std::string final_text;
    int stopped_at = -1;  // the token index whose push reported the stop
    std::string all() const {
        std::string s;
        for (const auto& p : pieces) s += p;
        return s + final_text;
    }
};

Streamed stream(const std::vector<int>& ids, const std::vector<std::string>& stop) {
    ReplyText rt(tok(), stop);
    Streamed out;
    for (size_t i = 0; i < ids.size(); ++i) {
        bool stopped = false;
        out.pieces.push_back(rt.push(ids[i], &stopped));
        if (stopped && out.stopped_at < 0) out.stopped_at = static_cast<int>(i);
    }
    out.final_text = rt.finish();
    return out;
}

TEST(ReplyText, StreamsExactlyTheDecodedText) {
    const std::string text =
        "And God said, Let there be light: and there was light. \xF0\x9D\x84\x9E caf\xC3\xA9";
    const std::vector<int> ids = tok().encode(text);
    const Streamed s = stream(ids, {});
    EXPECT_EQ(s.all(), tok().decode(ids, true));
    EXPECT_EQ(s.stopped_at, -1);
    for (const std::string& p : s.pieces)  // every piece is whole UTF-8 characters (encode checks)
        EXPECT_NO_THROW(tok().encode(p)) << "a piece splits a character";
}

TEST(ReplyText, FindsAStopStringSplitAcrossTokensAndNeverShowsIt) {
    const std::string text = "And God said, Let there be light: and there was light.";
    const std::vector<int> ids = tok().encode(text);
    // a stop string made of the end of one token and the start of the next
    size_t k = 0;
    std::string a, b;
    for (k = 2; k + 1 < ids.size(); ++k) {
        a = tok().decode(std::vector<int>(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k)));
        b = tok().decode(std::vector<int>(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k + 1)));
        if (b.size() - a.size() >= 3 && a.size() >= 3) break;
    }
    ASSERT_LT(k + 1, ids.size());
    const std::string stop = a.substr(a.size() - 2) + b.substr(a.size(), 2);
    ASSERT_EQ(text.find(stop), a.size() - 2) << "the stop string must first occur at the boundary";
    const Streamed s = stream(ids, {"never there", stop});
    EXPECT_EQ(s.stopped_at, static_cast<int>(k));
    EXPECT_EQ(s.all(), text.substr(0, a.size() - 2));
    for (size_t i = s.stopped_at + 1; i < s.pieces.size(); ++i) EXPECT_EQ(s.pieces[i], "");
    for (const std::string& p : s.pieces) EXPECT_EQ(p.find(stop), std::string::npos);
}

TEST(ReplyText, HoldsBackAPossibleStopAndReleasesIt) {
    const std::vector<int> ids = tok().encode("light and light");
    // "light!" starts like every "light" but never completes: held back each time, all of it shown in the end
    const Streamed s = stream(ids, {"light!"});
    EXPECT_EQ(s.stopped_at, -1);
    EXPECT_EQ(s.all(), "light and light");
    EXPECT_NE(s.final_text.find("light"), std::string::npos) << "the last 'light' was held to the end";
}

TEST(Logprobs, TemperedLogSoftmaxWithSortedAlternatives) {
    const std::vector<float> logits = {1.0f, 3.0f, -INFINITY, 3.0f, 0.5f};
    const Logprobs lp = compute_logprobs(logits.data(), 5, 0.5f, 4, 3);
    double z = 0;
    for (float x : logits) z += std::exp(static_cast<double>(x) / 0.5);
    EXPECT_NEAR(lp.chosen, 0.5 / 0.5 - std::log(z), 1e-5);
    ASSERT_EQ(lp.top.size(), 3u);
    EXPECT_EQ(lp.top[0].first, 1);  // ties: lower id first
    EXPECT_EQ(lp.top[1].first, 3);
    EXPECT_EQ(lp.top[2].first, 0);
    EXPECT_NEAR(lp.top[0].second, 3.0 / 0.5 - std::log(z), 1e-5);
    // temperature 0 (greedy) reports the untempered distribution
    const Logprobs g = compute_logprobs(logits.data(), 5, 0.0f, 1, 0);
    EXPECT_TRUE(g.top.empty());
    double z1 = 0;
    for (float x : logits) z1 += std::exp(static_cast<double>(x));
    EXPECT_NEAR(g.chosen, 3.0 - std::log(z1), 1e-5);
    EXPECT_EQ(compute_logprobs(logits.data(), 5, 1.0f, 2, 0).chosen, -INFINITY);
}

}  // namespace
}  // namespace markbase::server
