// Response shapes (src/server/openai_response.h), error objects, /metrics text and the request log line.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands/model_options.h"
#include "server/openai_error.h"
#include "server/openai_response.h"
#include "server/serve_metrics.h"

namespace markbase::server {
namespace {

using nlohmann::json;

class OpenAiResponse : public ::testing::Test {
  protected:
    OpenAiResponse() : tok(Tokenizer::load(cli::default_model_dir())) {}
    ResponseMeta meta(ApiKind kind, bool logprobs = false, bool usage = false) const {
        return {kind, kind == ApiKind::Chat ? "chatcmpl-1" : "cmpl-1", "m", 1700000000, logprobs, usage};
    }
    // The JSON of one "data: ...\n\n" event.
    static json event(const std::string& sse) {
        EXPECT_EQ(sse.rfind("data: ", 0), 0u) << sse;
        EXPECT_EQ(sse.substr(sse.size() - 2), "\n\n");
        return json::parse(sse.substr(6, sse.size() - 8));
    }
    Tokenizer tok;
};

TEST_F(OpenAiResponse, ChatCompletionShape) {
    Reply r;
    r.text = "Hello";
    r.reason = FinishReason::Length;
    r.usage.prompt_tokens = 5;
    r.usage.completion_tokens = 2;
    const json j = completion_response(meta(ApiKind::Chat), r, tok);
    EXPECT_EQ(j["id"], "chatcmpl-1");
    EXPECT_EQ(j["object"], "chat.completion");
    EXPECT_EQ(j["created"], 1700000000);
    EXPECT_EQ(j["model"], "m");
    ASSERT_EQ(j["choices"].size(), 1u);
    const json& c = j["choices"][0];
    EXPECT_EQ(c["index"], 0);
    EXPECT_EQ(c["message"], json({{"role", "assistant"}, {"content", "Hello"}}));
    EXPECT_EQ(c["finish_reason"], "length");
    EXPECT_TRUE(c["logprobs"].is_null());
    EXPECT_EQ(j["usage"], json({{"prompt_tokens", 5}, {"completion_tokens", 2}, {"total_tokens", 7}}));
}

TEST_F(OpenAiResponse, LogprobsInBothShapes) {
    Reply r;
    TokenEvent t;
    t.id = 1000;
    t.text = "ab";
    t.logprob = -0.5f;
    t.top = {{7, -1.0f}};
    t.top_text = {{"x", -1.0f}};
    r.tokens = {t, t};
    r.text = "abab";
    const json chat = completion_response(meta(ApiKind::Chat, true), r, tok)["choices"][0]["logprobs"];
    ASSERT_EQ(chat["content"].size(), 2u);
    EXPECT_EQ(chat["content"][0]["logprob"], -0.5);
    EXPECT_TRUE(chat["content"][0]["bytes"].is_array());
    EXPECT_EQ(chat["content"][0]["top_logprobs"][0]["token"], "x");
    const json text = completion_response(meta(ApiKind::Completion, true), r, tok)["choices"][0]["logprobs"];
    EXPECT_EQ(text["token_logprobs"], json({-0.5, -0.5}));
    EXPECT_EQ(text["text_offset"], json({0, 2}));
    EXPECT_EQ(text["top_logprobs"][1], json({{"x", -1.0}}));
    EXPECT_EQ(text["tokens"].size(), 2u);
}

TEST_F(OpenAiResponse, ChatStreamChunks) {
    const ResponseMeta m = meta(ApiKind::Chat, false, true);
    const json first = event(sse_first_chunk(m));
    EXPECT_EQ(first["object"], "chat.completion.chunk");
    EXPECT_EQ(first["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
    EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
    EXPECT_TRUE(first.contains("usage") && first["usage"].is_null());  // include_usage: null until the end
    const json text = event(sse_text_chunk(m, "Hi", nullptr, 0, tok));
    EXPECT_EQ(text["choices"][0]["delta"], json({{"content", "Hi"}}));
    const json fin = event(sse_finish_chunk(m, FinishReason::Stop));
    EXPECT_EQ(fin["choices"][0]["delta"], json::object());
    EXPECT_EQ(fin["choices"][0]["finish_reason"], "stop");
    Usage u;
    u.prompt_tokens = 3;
    u.completion_tokens = 4;
    const json usage = event(sse_usage_chunk(m, u));
    EXPECT_EQ(usage["choices"], json::array());
    EXPECT_EQ(usage["usage"]["total_tokens"], 7);
    EXPECT_EQ(std::string(kSseDone), "data: [DONE]\n\n");
}

TEST_F(OpenAiResponse, CompletionStreamChunks) {
    const ResponseMeta m = meta(ApiKind::Completion);
    const json text = event(sse_text_chunk(m, " w1", nullptr, 0, tok));
    EXPECT_EQ(text["object"], "text_completion");
    EXPECT_EQ(text["choices"][0]["text"], " w1");
    EXPECT_FALSE(text.contains("usage"));
    EXPECT_EQ(event(sse_finish_chunk(m, FinishReason::Length))["choices"][0]["finish_reason"], "length");
}

TEST_F(OpenAiResponse, InvalidUtf8InTextIsReplacedNotThrown) {
    const json j = event(sse_text_chunk(meta(ApiKind::Chat), "a\xff", nullptr, 0, tok));
    EXPECT_EQ(j["choices"][0]["delta"]["content"], "a\xef\xbf\xbd");
}

TEST(OpenAiError, Shape) {
    const json j = error_body(ApiError(400, "temperature: expected ...", "temperature"));
    EXPECT_EQ(j["error"]["message"], "temperature: expected ...");
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_EQ(j["error"]["param"], "temperature");
    EXPECT_TRUE(j["error"]["code"].is_null());
    EXPECT_EQ(error_body(ApiError(503, "busy"))["error"]["type"], "server_error");
    EXPECT_EQ(new_response_id(ApiKind::Chat).size(), std::string("chatcmpl-").size() + 24);
    EXPECT_EQ(new_response_id(ApiKind::Completion).rfind("cmpl-", 0), 0u);
}

TEST(ServeMetrics, PrometheusText) {
    EngineMetrics m;
    m.requests_ok = 3;
    m.generated_tokens = 40;
    m.running = 2;
    m.kv_blocks_free = 7;
    m.ttft_bounds = {0.1, 1};
    m.ttft_counts = {1, 2};
    m.ttft_n = 3;
    m.ttft_sum = 2.5;
    m.step_decode_s = 1.5;
    m.step_mixed_s = 0.25;
    m.steps = 9;
    const std::string t = prometheus_text(m, {{200, 4}, {400, 1}});
    for (const char* line :
         {"markbase_requests_total{status=\"ok\"} 3\n", "markbase_generated_tokens_total 40\n",
          "markbase_time_to_first_token_seconds_bucket{le=\"0.1\"} 1\n",
          "markbase_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3\n",
          "markbase_time_to_first_token_seconds_count 3\n", "markbase_sequences_running 2\n",
          "markbase_kv_blocks_free 7\n", "markbase_http_responses_total{code=\"400\"} 1\n",
          "# TYPE markbase_time_per_output_token_seconds histogram\n",
          "markbase_step_seconds_total{phase=\"decode\"} 1.5\n",
          "markbase_step_seconds_total{phase=\"mixed\"} 0.25\n", "markbase_steps_total 9\n"})
        EXPECT_NE(t.find(line), std::string::npos) << line << "\nin\n" << t;
}

TEST(ServeMetrics, LogLine) {
    RequestLog r;
    r.id = "chatcmpl-1";
    r.method = "POST";
    r.path = "/v1/chat/completions\n";
    r.status = 200;
    r.generated = true;
    r.prompt_tokens = 12;
    r.completion_tokens = 34;
    r.ttft_s = 0.12;
    r.decode_tok_s = 45.6;
    r.finish = "stop";
    EXPECT_EQ(
        format_request_log(r),
        "serve: chatcmpl-1 POST /v1/chat/completions? 200 prompt 12 gen 34 ttft 0.120 s decode 45.6 tok/s "
        "finish stop (0.000 s)");
}

}  // namespace
}  // namespace markbase::server
