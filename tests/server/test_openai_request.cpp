// Request parsing and validation (src/server/openai_request.h, openai_prompt.h): every field's wrong type or
// range is a 400 naming the field, what was expected and what was found; valid requests become the plain
// structs and the engine's GenerationRequest.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands/model_options.h"
#include "server/openai_error.h"
#include "server/openai_prompt.h"
#include "server/openai_request.h"

namespace markbase::server {
namespace {

using nlohmann::json;

json chat_body() {
    return {{"model", "m"}, {"messages", json::array({{{"role", "user"}, {"content", "Hi"}}})}};
}

// The ApiError a chat body with `field` set to `value` gives (status 0: none).
ApiError chat_error(const std::string& field, const json& value) {
    json b = chat_body();
    b[field] = value;
    try {
        parse_chat_request(b);
    } catch (const ApiError& e) {
        return e;
    }
    return ApiError(0, "accepted");
}

TEST(OpenAiRequest, ParsesEveryChatField) {
    json b = chat_body();
    b["messages"] = json::array(
        {{{"role", "system"}, {"content", "Be brief."}},
         {{"role", "user"},
          {"content", json::array({{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}})}},
         {{"role", "assistant"}, {"content", "ok"}},
         {{"role", "developer"}, {"content", "later"}}});
    b.update({{"stream", true},
              {"stream_options", {{"include_usage", true}}},
              {"max_completion_tokens", 7},
              {"temperature", 0.5},
              {"top_p", 0.9},
              {"top_k", 40},
              {"min_p", 0.05},
              {"presence_penalty", 0.1},
              {"frequency_penalty", -0.2},
              {"repetition_penalty", 1.1},
              {"seed", 42},
              {"stop", {"x", "y"}},
              {"n", 1},
              {"logprobs", true},
              {"top_logprobs", 3},
              {"ignore_eos", true},
              {"user", "u"}});
    const ApiRequest r = parse_chat_request(b);
    ASSERT_EQ(r.messages.size(), 4u);
    EXPECT_EQ(r.messages[1].content, "a\nb");
    EXPECT_EQ(r.messages[3].role, "system");  // a developer message after the first is a system turn
    EXPECT_TRUE(r.stream);
    EXPECT_TRUE(r.include_usage);
    EXPECT_EQ(r.max_tokens, 7);
    EXPECT_FLOAT_EQ(*r.temperature, 0.5f);
    EXPECT_EQ(r.top_k, 40);
    EXPECT_EQ(r.seed, 42u);
    EXPECT_EQ(r.stop, (std::vector<std::string>{"x", "y"}));
    EXPECT_EQ(r.top_logprobs, 3);
    EXPECT_TRUE(r.ignore_eos);
    EXPECT_FALSE(parse_chat_request(chat_body()).ignore_eos);
}

TEST(OpenAiRequest, EveryBadFieldIsNamed) {
    struct Case {
        const char* field;
        json value;
        const char* expected;  // part of the message
    };
    const Case cases[] = {
        {"messages", "hi", "a non-empty array"},
        {"messages", json::array(), "a non-empty array"},
        {"model", 3, "a string"},
        {"stream", "yes", "a boolean"},
        {"stream_options", 1, "an object"},
        {"max_tokens", 0, "an integer in [1,"},
        {"max_tokens", 2.5, "an integer"},
        {"max_tokens", "10", "an integer"},
        {"max_completion_tokens", -1, "an integer in [1,"},
        {"max_tokens", 1e30, "an integer"},
        {"temperature", 3, "a number in [0, 2]"},
        {"temperature", "hot", "a number in [0, 2]"},
        {"top_p", 0, "a number in (0, 1]"},
        {"top_p", 1.5, "a number in (0, 1]"},
        {"top_k", -2, "an integer in [-1,"},
        {"top_k", 1.5, "an integer"},
        {"min_p", 2, "a number in [0, 1]"},
        {"presence_penalty", 3, "a number in [-2, 2]"},
        {"frequency_penalty", -2.5, "a number in [-2, 2]"},
        {"repetition_penalty", 0, "a number in (0, 100]"},
        {"seed", "x", "an integer"},
        {"seed", 1.5, "an integer"},
        {"stop", 5, "a non-empty string or an array of at most 4"},
        {"stop", "", "a non-empty string"},
        {"stop", json::array({"a", "b", "c", "d", "e"}), "a non-empty string or an array of at most 4"},
        {"n", 0, "an integer in [1,"},
        {"logprobs", 1, "a boolean"},
        {"top_logprobs", 21, "an integer in [0, 20]"},
        {"ignore_eos", 1, "a boolean"},
    };
    for (const Case& c : cases) {
        const ApiError e = chat_error(c.field, c.value);
        EXPECT_EQ(e.status, 400) << c.field << " = " << c.value.dump();
        EXPECT_EQ(e.param, c.field) << e.what();
        EXPECT_NE(std::string(e.what()).find(std::string(c.field) + ": expected " + c.expected),
                  std::string::npos)
            << e.what();
        EXPECT_NE(std::string(e.what()).find("found"), std::string::npos) << e.what();
    }
    EXPECT_EQ(chat_error("stop", json::array({"a", 3})).param, "stop[1]");
}

TEST(OpenAiRequest, UnsupportedSettingsAreRefusedByName) {
    EXPECT_EQ(chat_error("n", 2).param, "n");
    EXPECT_NE(std::string(chat_error("n", 2).what()).find("only 1"), std::string::npos);
    EXPECT_EQ(chat_error("top_logprobs", 2).param, "top_logprobs");  // without logprobs: true
    EXPECT_EQ(chat_error("stream_options", json{{"include_usage", true}}).param, "stream_options");
    EXPECT_EQ(chat_error("tools", json::array({{{"type", "function"}}})).param, "tools");
    EXPECT_EQ(chat_error("logit_bias", json{{"5", 1}}).param, "logit_bias");
    EXPECT_EQ(chat_error("response_format", json{{"type", "json_object"}}).param, "response_format");
    EXPECT_EQ(chat_error("tools", json::array()).status, 0);  // empty: nothing asked
    EXPECT_EQ(chat_error("temperature", nullptr).status, 0);  // null: the default
}

TEST(OpenAiRequest, MessagesAreCheckedOneByOne) {
    auto message_error = [](const json& message) {
        json b = chat_body();
        b["messages"].push_back(message);
        try {
            parse_chat_request(b);
        } catch (const ApiError& e) {
            return std::make_pair(e.param, std::string(e.what()));
        }
        return std::make_pair(std::string("accepted"), std::string());
    };
    EXPECT_EQ(message_error("hi").first, "messages[1]");
    EXPECT_EQ(message_error({{"content", "x"}}).first, "messages[1].role");
    EXPECT_EQ(message_error({{"role", "tool"}, {"content", "x"}}).first, "messages[1].role");
    EXPECT_EQ(message_error({{"role", "user"}}).first, "messages[1].content");
    EXPECT_EQ(message_error({{"role", "user"}, {"content", 5}}).first, "messages[1].content");
    const auto image = message_error(
        {{"role", "user"}, {"content", json::array({{{"type", "image_url"}, {"image_url", "x"}}})}});
    EXPECT_EQ(image.first, "messages[1].content[0].type");
    EXPECT_NE(image.second.find("\"image_url\""), std::string::npos) << image.second;
    EXPECT_EQ(message_error({{"role", "user"}, {"content", json::array({{{"type", "text"}}})}}).first,
              "messages[1].content[0].text");
    EXPECT_EQ(message_error({{"role", "assistant"}, {"content", nullptr}}).first, "accepted");
}

TEST(OpenAiRequest, CompletionPrompts) {
    ApiRequest r = parse_completion_request({{"prompt", "Once"}});
    EXPECT_FALSE(r.prompt_is_ids);
    EXPECT_EQ(r.prompt_text, "Once");
    r = parse_completion_request({{"prompt", {2, 17, 300}}, {"logprobs", 2}});
    EXPECT_TRUE(r.prompt_is_ids);
    EXPECT_EQ(r.prompt_ids, (std::vector<int>{2, 17, 300}));
    EXPECT_EQ(r.top_logprobs, 2);
    r = parse_completion_request({{"prompt", json::array({json::array({5, 6})})}});
    EXPECT_EQ(r.prompt_ids, (std::vector<int>{5, 6}));
    auto error_param = [](const json& body) {
        try {
            parse_completion_request(body);
        } catch (const ApiError& e) {
            return e.param;
        }
        return std::string("accepted");
    };
    EXPECT_EQ(error_param(json::object()), "prompt");
    EXPECT_EQ(error_param({{"prompt", json::array()}}), "prompt");
    EXPECT_EQ(error_param({{"prompt", {"a", "b"}}}), "prompt");
    EXPECT_EQ(error_param({{"prompt", {1, -2}}}), "prompt[1]");
    EXPECT_EQ(error_param({{"prompt", {1, "x"}}}), "prompt[1]");
    EXPECT_EQ(error_param({{"prompt", "x"}, {"echo", true}}), "echo");
    EXPECT_EQ(error_param({{"prompt", "x"}, {"logprobs", 21}}), "logprobs");
    EXPECT_EQ(error_param({{"prompt", "x"}, {"suffix", "y"}}), "suffix");
}

TEST(OpenAiRequest, BodiesThatAreNotJsonObjects) {
    auto message = [](const std::string& body) {
        try {
            parse_request_body(body);
        } catch (const ApiError& e) {
            EXPECT_EQ(e.status, 400);
            return std::string(e.what());
        }
        return std::string("accepted");
    };
    EXPECT_NE(message("{\"a\":").find("not valid JSON"), std::string::npos);
    EXPECT_NE(message("[1, 2]").find("expected a JSON object, found an array"), std::string::npos);
    EXPECT_NE(message("{\"a\": \"\xff\"}").find("not valid UTF-8 (byte 7)"), std::string::npos);
    EXPECT_NE(message(std::string(100000, '[')).find("levels deep"), std::string::npos);
    EXPECT_EQ(message("{\"a\": \"\\u00e9\"}"), "accepted");
}

TEST(OpenAiRequest, Utf8Validation) {
    EXPECT_EQ(invalid_utf8_offset("plain \xc3\xa9 \xe2\x9c\x85 \xf0\x9f\x98\x80"), std::string_view::npos);
    EXPECT_EQ(invalid_utf8_offset("a\xc0\xaf"), 1u);         // overlong '/'
    EXPECT_EQ(invalid_utf8_offset("ab\xed\xa0\x80"), 2u);    // a surrogate
    EXPECT_EQ(invalid_utf8_offset("\xf4\x90\x80\x80"), 0u);  // past U+10FFFF
    EXPECT_EQ(invalid_utf8_offset("abc\xe2\x9c"), 3u);       // cut short
    EXPECT_EQ(invalid_utf8_offset("\x80"), 0u);              // a lone continuation byte
}

class OpenAiPrompt : public ::testing::Test {
  protected:
    OpenAiPrompt()
        : model{"m", 0, Tokenizer::load(cli::default_model_dir()), SamplingParams{}, std::vector<int>{1}} {}
    ServedModel model;
};

TEST_F(OpenAiPrompt, ChatRendersTheTemplateAndAddsTheTurnStops) {
    const GenerationRequest g = build_generation(parse_chat_request(chat_body()), model, 262144, 4096);
    EXPECT_EQ(g.prompt, model.tokenizer.encode(render_gemma4_chat({{"user", "Hi"}}, true)));
    EXPECT_EQ(g.max_tokens, 4096 - static_cast<int>(g.prompt.size()));  // no max_tokens: to the context's end
    EXPECT_NE(std::find(g.stop_ids.begin(), g.stop_ids.end(), 106), g.stop_ids.end());
    EXPECT_EQ(g.top_logprobs, -1);
}

TEST_F(OpenAiPrompt, CompletionPrependsBosAndTakesSampling) {
    json b = {{"prompt", "Once upon"}, {"temperature", 0}, {"top_k", 5}, {"seed", 9}, {"stop", "x"}};
    const GenerationRequest g = build_generation(parse_completion_request(b), model, 262144, 4096);
    ASSERT_FALSE(g.prompt.empty());
    EXPECT_EQ(g.prompt[0], 2);
    EXPECT_EQ(g.max_tokens, kDefaultCompletionTokens);
    EXPECT_EQ(g.sampling.temperature, 0.0f);
    EXPECT_EQ(g.sampling.top_k, 5);
    EXPECT_EQ(g.sampling.seed, 9u);
    EXPECT_EQ(g.stop, std::vector<std::string>{"x"});
    EXPECT_EQ(g.stop_ids, std::vector<int>{1});
}

TEST_F(OpenAiPrompt, IdsOutsideTheVocabularyAndLongPromptsAreRefused) {
    try {
        build_generation(parse_completion_request({{"prompt", {2, 300}}}), model, 256, 4096);
        FAIL() << "accepted";
    } catch (const ApiError& e) {
        EXPECT_EQ(e.param, "prompt[1]");
        EXPECT_NE(std::string(e.what()).find("[0, 255], found 300"), std::string::npos) << e.what();
    }
    try {
        build_generation(parse_completion_request({{"prompt", {2, 3, 4, 5}}}), model, 256, 4);
        FAIL() << "accepted";
    } catch (const ApiError& e) {
        EXPECT_EQ(e.status, 400);
        EXPECT_EQ(e.code, "context_length_exceeded");
    }
}

}  // namespace
}  // namespace markbase::server
