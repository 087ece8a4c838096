// A chat's next turn through the cache: the conversation so far stays cached, only the new part is fed, and
// the logits of that part must equal those of the whole conversation run from an empty cache. On the bundled
// model with its tokenizer and the Gemma 4 chat template, the first reply being transformers' (goldens.json).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "loading/checkpoint.h"
#include "runtime/backend.h"
#include "runtime/generate.h"
#include "runtime/prefix_reuse.h"
#include "support/exact_options.h"
#include "support/logits_compare.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/tokenizer.h"

namespace markbase {
namespace {

const std::string kModel = std::string(MARKBASE_TEST_DATA) + "/../../models/default";

struct Turns {
    size_t first_size = 0;        // turn 1's rendered prompt
    std::vector<int> second_ids;  // the whole conversation rendered for turn 2
    std::vector<int> fresh;       // what reuse_cached_prefix left to feed
    std::vector<float> logits;    // [fresh.size()][V] through the reused cache
};

// Turn 1 (first_user) from an empty cache, greedy until a chat stop id; then turn 2 through the cache.
Turns two_turns(const Checkpoint& ck, const Tokenizer& tok, const BackendOptions& o,
                const std::string& first_user, std::vector<int>* first_reply) {
    auto be = make_cpu_backend(ck, o);
    std::vector<ChatMessage> history{{"user", first_user}};
    const std::vector<int> first = tok.encode(render_gemma4_chat(history, true));
    std::vector<int> cached;
    const std::vector<int> fed = reuse_cached_prefix(*be, cached, first);
    EXPECT_EQ(fed, first);
    GenerateOptions go;
    go.max_new_tokens = 64;
    go.sampling.temperature = 0;
    go.stop_ids = default_stop_ids();
    generate(
        *be, fed, go, [](int) { return true; }, first_reply);
    cached = first;
    cached.insert(cached.end(), first_reply->begin(), first_reply->end() - 1);  // the last id is not fed

    std::vector<int> reply = *first_reply;
    if (!reply.empty() && reply.back() == 106) reply.pop_back();
    history.push_back({"assistant", tok.decode(reply)});
    history.push_back({"user", "Tell me about light."});
    Turns t;
    t.first_size = first.size();
    t.second_ids = tok.encode(render_gemma4_chat(history, true));
    t.fresh = reuse_cached_prefix(*be, cached, t.second_ids);
    EXPECT_EQ(be->n_past(), static_cast<int64_t>(t.second_ids.size() - t.fresh.size()));
    EXPECT_EQ(cached, std::vector<int>(t.second_ids.begin(), t.second_ids.end() - t.fresh.size()));
    t.logits.resize(t.fresh.size() * ck.config.vocab_size);
    be->eval(t.fresh.data(), static_cast<int64_t>(t.fresh.size()), t.logits.data(), true);
    return t;
}

// The rows of the whole conversation's logits (from an empty cache) for its last `n` ids.
std::vector<float> full_tail_logits(const Checkpoint& ck, const BackendOptions& o,
                                    const std::vector<int>& ids, size_t n) {
    auto be = make_cpu_backend(ck, o);
    const std::vector<float> all = testing::all_logits(*be, ids, false);
    const size_t V = static_cast<size_t>(ck.config.vocab_size);
    return std::vector<float>(all.end() - static_cast<std::ptrdiff_t>(n * V), all.end());
}

TEST(PrefixReuse, SecondChatTurnThroughTheCacheEqualsTheWholeConversation) {
    auto ck = load_checkpoint(kModel);
    const Tokenizer tok = Tokenizer::load(kModel);
    const nlohmann::json g = nlohmann::json::parse(std::ifstream(kModel + "/goldens.json"));
    BackendOptions o = testing::exact_options();  // chunkings compared at 1e-5: the exact products
    o.threads = 2;
    o.ctx_size = 512;
    std::vector<int> reply;
    const Turns t = two_turns(*ck, tok, o, "Who are you?", &reply);
    for (const auto& p : g.at("prompts")) {
        if (p.at("text") == "Who are you?") {
            EXPECT_EQ(reply, p.at("generate_ids_stop").get<std::vector<int>>());
        }
    }

    // the first turn stayed cached up to its generation prompt's empty thought channel, which the template
    // does not re-render for an earlier reply: from there on the reply and the new turn are fed
    const size_t thought = tok.encode("<|channel>thought\n<channel|>").size();
    EXPECT_EQ(t.second_ids.size() - t.fresh.size(), t.first_size - thought);
    const std::vector<float> want = full_tail_logits(*ck, o, t.second_ids, t.fresh.size());
    EXPECT_LE(testing::rel_err(want, t.logits), 1e-5);
}

TEST(PrefixReuse, WhenTheRingsCannotRollBackItStartsOverAndStillAgrees) {
    // Chunks of 1 leave the sliding rings (window 128) one slot of slack, and a first turn longer than the
    // window wraps them, so going back to where the reply began is refused: the cache is reset and the whole
    // conversation fed again.
    auto ck = load_checkpoint(kModel);
    const Tokenizer tok = Tokenizer::load(kModel);
    BackendOptions o = testing::exact_options();  // chunkings compared at 1e-5: the exact products
    o.threads = 2;
    o.ctx_size = 512;
    o.chunk = 1;
    std::string long_turn;
    for (int i = 0; i < 30; ++i) long_turn += "And God said, let there be light. ";
    std::vector<int> reply;
    const Turns t = two_turns(*ck, tok, o, long_turn, &reply);
    ASSERT_GT(t.second_ids.size(), 200u);
    EXPECT_EQ(t.fresh, t.second_ids) << "expected a reset: " << t.fresh.size() << " of "
                                     << t.second_ids.size();
    o.chunk = 256;
    EXPECT_LE(testing::rel_err(full_tail_logits(*ck, o, t.second_ids, t.fresh.size()), t.logits), 1e-5);
}

TEST(PrefixReuse, APromptEqualToTheCacheStillFeedsItsLastId) {
    auto ck = load_checkpoint(kModel);
    BackendOptions o = testing::exact_options();  // chunkings compared at 1e-5: the exact products
    o.threads = 1;
    auto be = make_cpu_backend(*ck, o);
    const std::vector<int> ids{2, 677, 540, 705};
    be->eval(ids.data(), 4, nullptr, false);
    std::vector<int> cached = ids;
    EXPECT_EQ(reuse_cached_prefix(*be, cached, ids), std::vector<int>{705});
    EXPECT_EQ(be->n_past(), 3);
    // a `cached` that does not describe the cache is not trusted
    cached = {2, 677};
    EXPECT_EQ(reuse_cached_prefix(*be, cached, ids), ids);
    EXPECT_EQ(be->n_past(), 0);
}

}  // namespace
}  // namespace markbase
