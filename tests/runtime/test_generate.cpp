// How generation ends, on the bundled model against its transformers goldens (models/default/goldens.json):
// at the first stop id (included in the output, as transformers' generate includes it), at the token budget,
// and when the context is full, with the number of tokens pinned exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loading/checkpoint.h"
#include "model/error.h"
#include "runtime/backend.h"
#include "runtime/generate.h"
#include "tokenizer/chat_format.h"

namespace markbase {
namespace {

const std::string kModel = std::string(MARKBASE_TEST_DATA) + "/../../models/default";

class Stopping : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        ck = load_checkpoint(kModel).release();
        goldens = new nlohmann::json(nlohmann::json::parse(std::ifstream(kModel + "/goldens.json")));
    }
    static void TearDownTestSuite() {
        delete ck;
        delete goldens;
    }
    // The golden prompt with this text.
    static const nlohmann::json& prompt(const std::string& text) {
        for (const auto& p : goldens->at("prompts"))
            if (p.at("text") == text) return p;
        throw std::runtime_error("no golden prompt '" + text + "'");
    }
    static std::unique_ptr<Backend> backend(int64_t ctx) {
        BackendOptions o;
        o.threads = 2;
        o.ctx_size = ctx;
        return make_cpu_backend(*ck, o);
    }
    static GenerateStats greedy(Backend& be, const std::vector<int>& prompt, int n,
                                const std::vector<int>& stops, std::vector<int>* out) {
        GenerateOptions go;
        go.max_new_tokens = n;
        go.sampling.temperature = 0;
        go.stop_ids = stops;
        return generate(
            be, prompt, go, [](int) { return true; }, out);
    }
    static Checkpoint* ck;
    static nlohmann::json* goldens;
};
Checkpoint* Stopping::ck = nullptr;
nlohmann::json* Stopping::goldens = nullptr;

TEST_F(Stopping, AtTheFirstStopIdWhichIsIncluded) {
    const nlohmann::json p = prompt("And God said");
    const auto prompt_ids = p.at("prompt_ids").get<std::vector<int>>();
    const auto want = p.at("greedy_ids_full_recompute").get<std::vector<int>>();
    // Make a stop id of the token at step 6 (the first step that emits it) and of a later one: generation
    // ends at step 6, that token included.
    const size_t k = 6;
    ASSERT_EQ(std::find(want.begin(), want.end(), want[k]) - want.begin(), static_cast<std::ptrdiff_t>(k));
    auto be = backend(256);
    std::vector<int> got;
    GenerateStats st = greedy(*be, prompt_ids, 32, {want.back(), want[k]}, &got);
    EXPECT_EQ(got, std::vector<int>(want.begin(), want.begin() + k + 1));
    EXPECT_EQ(st.stop_reason, "stop id");
    EXPECT_EQ(st.generated, static_cast<int>(k + 1));

    // ignore_eos generates through the stop ids to the budget
    be->reset();
    got.clear();
    GenerateOptions go;
    go.max_new_tokens = 10;
    go.sampling.temperature = 0;
    go.stop_ids = {want[k]};
    go.ignore_eos = true;
    st = generate(
        *be, prompt_ids, go, [](int) { return true; }, &got);
    EXPECT_EQ(got, std::vector<int>(want.begin(), want.begin() + 10));
    EXPECT_EQ(st.stop_reason, "length");
}

TEST_F(Stopping, ChatStopsAtEndOfTurnAsTransformersGenerateDoes) {
    // generate_ids_stop: transformers' generate with eos_token_id = [1, 106, 50] (the chat stop ids)
    ASSERT_EQ(goldens->at("stop_ids").get<std::vector<int>>(), default_stop_ids());
    int chats = 0;
    for (const auto& p : goldens->at("prompts")) {
        if (p.at("kind") != "chat") continue;
        ++chats;
        const auto want = p.at("generate_ids_stop").get<std::vector<int>>();
        ASSERT_FALSE(p.at("first_stop_index").is_null()) << p.at("text");
        ASSERT_EQ(want.size(), p.at("first_stop_index").get<size_t>() + 1);
        std::vector<int> stops = ck->config.stop_ids;  // config.json's eos (1) ...
        for (int id : default_stop_ids()) stops.push_back(id);  // ... plus the chat's
        auto be = backend(256);
        std::vector<int> got;
        GenerateStats st = greedy(*be, p.at("prompt_ids").get<std::vector<int>>(), 64, stops, &got);
        EXPECT_EQ(got, want) << p.at("text");
        EXPECT_EQ(st.stop_reason, "stop id");
        // config.json's eos alone does not end the turn: the reply runs past it
        be->reset();
        got.clear();
        st = greedy(*be, p.at("prompt_ids").get<std::vector<int>>(), static_cast<int>(want.size()) + 2,
                    ck->config.stop_ids, &got);
        EXPECT_EQ(st.stop_reason, "length") << p.at("text");
        EXPECT_EQ(got.size(), want.size() + 2);
    }
    EXPECT_GE(chats, 2);
}

TEST_F(Stopping, ContextFullEndsAfterExactlyCtxMinusPromptPlusOneTokens) {
    // Each generated token but the last is fed back through the cache, so a context of C positions holding a
    // prompt of P yields C - P + 1 new tokens; the one after that would need position C.
    const nlohmann::json p = prompt("In the beginning");
    const auto prompt_ids = p.at("prompt_ids").get<std::vector<int>>();
    const auto want = p.at("greedy_ids_full_recompute").get<std::vector<int>>();
    const int64_t P = static_cast<int64_t>(prompt_ids.size());
    for (int64_t ctx : {P, P + 1, P + 9}) {
        auto be = backend(ctx);
        std::vector<int> got;
        GenerateStats st = greedy(*be, prompt_ids, -1, {}, &got);
        const size_t n = static_cast<size_t>(ctx - P + 1);
        EXPECT_EQ(got, std::vector<int>(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(n)))
            << "ctx " << ctx;
        EXPECT_EQ(st.stop_reason, "context full") << "ctx " << ctx;
        EXPECT_EQ(be->n_past(), ctx);
    }
    // a prompt that does not fit is refused before anything runs
    auto be = backend(P - 1);
    std::vector<int> got;
    EXPECT_THROW(greedy(*be, prompt_ids, 4, {}, &got), Error);
    EXPECT_TRUE(got.empty());
}

TEST_F(Stopping, TheBudgetCountsGeneratedTokens) {
    const nlohmann::json p = prompt("Blessed are the");
    const auto want = p.at("greedy_ids_full_recompute").get<std::vector<int>>();
    auto be = backend(256);
    for (int n : {1, 2, 7}) {
        be->reset();
        std::vector<int> got;
        GenerateStats st = greedy(*be, p.at("prompt_ids").get<std::vector<int>>(), n, {}, &got);
        EXPECT_EQ(got, std::vector<int>(want.begin(), want.begin() + n));
        EXPECT_EQ(st.stop_reason, "length");
        EXPECT_EQ(st.generated, n);
    }
}

}  // namespace
}  // namespace markbase
