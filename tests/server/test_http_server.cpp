// markbase serve's HTTP layer in process, over the fake engine: the routes, their answers and every error
// status a client can provoke. Streaming, hang-ups, concurrency and shutdown: test_http_stream.cpp.
#include "server/http_fixture.h"

#ifdef MARKBASE_HAS_HTTP

namespace markbase::testing {
namespace {

using nlohmann::json;

json chat(int max_tokens) {
    return {{"model", "test-model"},
            {"messages", json::array({{{"role", "user"}, {"content", "Hello"}}})},
            {"max_tokens", max_tokens}};
}

// The error object of a response, checked for OpenAI's shape.
json error_of(const httplib::Result& r) {
    EXPECT_TRUE(r);
    if (!r) return {};
    const json j = json::parse(r->body, nullptr, false);
    EXPECT_TRUE(j.contains("error")) << r->body;
    if (!j.contains("error")) return {};
    for (const char* k : {"message", "type", "param", "code"}) EXPECT_TRUE(j["error"].contains(k)) << r->body;
    EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
    return j["error"];
}

TEST_F(HttpServerTest, ChatCompletion) {
    start();
    const auto r = post("/v1/chat/completions", chat(3));
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json j = json::parse(r->body);
    EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
    EXPECT_EQ(j["object"], "chat.completion");
    EXPECT_EQ(j["model"], "test-model");
    EXPECT_EQ(j["choices"][0]["message"], json({{"role", "assistant"}, {"content", " w0 w1 w2"}}));
    EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(j["usage"]["completion_tokens"], 3);
    EXPECT_EQ(j["usage"]["prompt_tokens"], engine_->last_request().prompt.size());
    EXPECT_EQ(engine_->last_request().max_tokens, 3);
    EXPECT_TRUE(eventually([&] { return !log().empty(); }));
    const std::string line = log().back();
    EXPECT_NE(line.find(j["id"].get<std::string>() + " POST /v1/chat/completions 200 prompt "),
              std::string::npos)
        << line;
    EXPECT_NE(line.find("gen 3 "), std::string::npos) << line;
    EXPECT_NE(line.find("finish length"), std::string::npos) << line;
}

TEST_F(HttpServerTest, CompletionWithTokenIdsStopsAndLogprobs) {
    FakeEngineOptions fo;
    fo.eos_after = 2;
    start(fo);
    auto r = post("/v1/completions", json{{"prompt", {2, 17, 300}}, {"max_tokens", 5}, {"logprobs", 2}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    json j = json::parse(r->body);
    EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
    EXPECT_EQ(j["object"], "text_completion");
    EXPECT_EQ(j["choices"][0]["text"], " w0 w1");
    EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");  // eos after 2
    EXPECT_EQ(j["choices"][0]["logprobs"]["token_logprobs"].size(), 2u);
    EXPECT_EQ(j["choices"][0]["logprobs"]["top_logprobs"][0].size(), 2u);
    EXPECT_EQ(j["usage"], json({{"prompt_tokens", 3}, {"completion_tokens", 2}, {"total_tokens", 5}}));
    EXPECT_EQ(engine_->last_request().prompt, (std::vector<int>{2, 17, 300}));

    r = post("/v1/completions", json{{"prompt", "Once"}, {"stop", "w1"}, {"max_tokens", 9}});
    ASSERT_TRUE(r);
    j = json::parse(r->body);
    EXPECT_EQ(j["choices"][0]["text"], " w0 ");
    EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
    EXPECT_EQ(engine_->last_request().prompt.front(), 2);  // BOS before a text prompt
    EXPECT_EQ(engine_->last_request().stop, std::vector<std::string>{"w1"});
}

TEST_F(HttpServerTest, ModelsHealthMetrics) {
    start();
    auto r = client().Get("/v1/models");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    const json j = json::parse(r->body);
    EXPECT_EQ(j["object"], "list");
    EXPECT_EQ(j["data"][0]["id"], "test-model");
    EXPECT_EQ(j["data"][0]["object"], "model");
    EXPECT_EQ(client().Get("/v1/models/test-model")->status, 200);
    EXPECT_EQ(error_of(client().Get("/v1/models/other"))["code"], "model_not_found");
    r = client().Get("/health");
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(json::parse(r->body), json({{"status", "ok"}}));
    ASSERT_EQ(post("/v1/chat/completions", chat(2))->status, 200);
    r = client().Get("/metrics");
    ASSERT_EQ(r->status, 200);
    EXPECT_NE(r->body.find("markbase_requests_total{status=\"ok\"} 1\n"), std::string::npos) << r->body;
    EXPECT_NE(r->body.find("markbase_generated_tokens_total 2\n"), std::string::npos) << r->body;
    EXPECT_NE(r->body.find("markbase_http_responses_total{code=\"200\"}"), std::string::npos) << r->body;
}

TEST_F(HttpServerTest, ApiKey) {
    server::ServerOptions so;
    so.api_key = "sk-test";
    start({}, so);
    auto r = post("/v1/chat/completions", chat(1));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401);
    EXPECT_EQ(error_of(r)["code"], "invalid_api_key");
    EXPECT_EQ(post("/v1/chat/completions", chat(1), {{"Authorization", "Bearer sk-wrong"}})->status, 401);
    EXPECT_EQ(client().Get("/v1/models")->status, 401);
    EXPECT_EQ(client().Get("/health")->status, 200);  // load balancers ask without a key
    EXPECT_EQ(post("/v1/chat/completions", chat(1), {{"Authorization", "Bearer sk-test"}})->status, 200);
    EXPECT_EQ(engine_->submitted(), 1);
}

TEST_F(HttpServerTest, UnknownRoutesAndWrongMethods) {
    start();
    auto r = client().Get("/v1/nothing");
    EXPECT_EQ(r->status, 404);
    EXPECT_EQ(error_of(r)["code"], "unknown_url");
    EXPECT_EQ(post("/v2/chat", json::object())->status, 404);
    r = client().Get("/v1/chat/completions");
    EXPECT_EQ(r->status, 405);
    EXPECT_EQ(r->get_header_value("Allow"), "POST");
    error_of(r);
    EXPECT_EQ(post("/health", json::object())->status, 405);
    EXPECT_EQ(client().Delete("/v1/models")->status, 405);
    EXPECT_EQ(client().Put("/v1/completions", "{}", "application/json")->status, 405);
}

TEST_F(HttpServerTest, BodyOverTheLimitIs413) {
    server::ServerOptions so;
    so.max_body_bytes = 1 << 20;
    start({}, so);
    const std::string big = "{\"prompt\": \"" + std::string(so.max_body_bytes + 10, 'a') + "\"}";
    auto r = post("/v1/completions", big);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 413);
    EXPECT_NE(error_of(r)["message"].get<std::string>().find("larger than 1048576 bytes"), std::string::npos);
    // the same body in chunks (no Content-Length): stopped at the limit as it is read
    r = client().Post(
        "/v1/completions",
        [&](size_t offset, httplib::DataSink& sink) {
            if (offset >= big.size()) {
                sink.done();
                return true;
            }
            return sink.write(big.data() + offset, std::min<size_t>(65536, big.size() - offset));
        },
        "application/json");
    if (r) {  // the server may close before the client finishes sending
        EXPECT_EQ(r->status, 413);
    }
    EXPECT_EQ(client().Get("/health")->status, 200);
    EXPECT_EQ(engine_->submitted(), 0);
}

TEST_F(HttpServerTest, BadJsonAndInvalidUtf8) {
    start();
    auto r = post("/v1/chat/completions", std::string("{\"messages\": ["));
    EXPECT_EQ(r->status, 400);
    EXPECT_NE(error_of(r)["message"].get<std::string>().find("not valid JSON"), std::string::npos);
    r = post("/v1/chat/completions",
             std::string("{\"messages\": [{\"role\": \"user\", \"content\": \"\xc3\x28\"}]}"));
    EXPECT_EQ(r->status, 400);
    EXPECT_NE(error_of(r)["message"].get<std::string>().find("not valid UTF-8"), std::string::npos);
    json bad = chat(1);
    bad["temperature"] = "warm";
    r = post("/v1/chat/completions", bad);
    EXPECT_EQ(r->status, 400);
    const json e = error_of(r);
    EXPECT_EQ(e["param"], "temperature");
    EXPECT_EQ(e["type"], "invalid_request_error");
    EXPECT_EQ(e["message"], "temperature: expected a number in [0, 2], found a string \"warm\"");
}

TEST_F(HttpServerTest, PromptLongerThanTheContext) {
    FakeEngineOptions fo;
    fo.limits.ctx_size = 8;
    start(fo);
    const auto r = post("/v1/completions", json{{"prompt", {2, 3, 4, 5, 6, 7, 8, 9}}});
    EXPECT_EQ(r->status, 400);
    EXPECT_EQ(error_of(r)["code"], "context_length_exceeded");
    EXPECT_EQ(post("/v1/completions", json{{"prompt", {2, 3, 4, 5, 6, 7, 8}}})->status, 200);
}

TEST_F(HttpServerTest, EngineFailureIs500) {
    FakeEngineOptions fo;
    fo.fail = true;
    start(fo);
    const auto r = post("/v1/chat/completions", chat(2));
    EXPECT_EQ(r->status, 500);
    EXPECT_EQ(error_of(r)["type"], "server_error");
}

TEST_F(HttpServerTest, QueueFullIs503) {
    FakeEngineOptions fo;
    fo.limits.max_sequences = 1;
    fo.limits.max_queue = 1;
    start(fo);
    engine_->hold(true);
    std::vector<std::thread> waiting;
    // Released and joined however the test ends: a failed assertion must not leave a joinable thread behind.
    struct Release {
        FakeEngine* engine;
        std::vector<std::thread>* threads;
        ~Release() {
            engine->hold(false);
            for (auto& t : *threads) t.join();
        }
    } release{engine_.get(), &waiting};
    // One request at a time, so the second finds the first admitted rather than racing it into the queue.
    for (int i = 1; i <= 2; ++i) {
        waiting.emplace_back([this] { EXPECT_EQ(post("/v1/chat/completions", chat(2))->status, 200); });
        ASSERT_TRUE(eventually([&] { return engine_->active() == i; })) << "request " << i << " not admitted";
    }
    const auto r = post("/v1/chat/completions", chat(2));
    EXPECT_EQ(r->status, 503);
    EXPECT_EQ(error_of(r)["code"], "queue_full");
    EXPECT_EQ(r->get_header_value("Retry-After"), "1");
}

TEST_F(HttpServerTest, FiftyMalformedRequestsEachGet4xx) {
    start();
    std::vector<std::string> bodies = {"",
                                       "null",
                                       "42",
                                       "\"x\"",
                                       "[]",
                                       "{",
                                       "}",
                                       "{\"messages\": 1}",
                                       "{\"messages\": []}",
                                       "{\"messages\": [1]}",
                                       "{\"messages\": [{}]}",
                                       "{\"messages\": [{\"role\": 5}]}",
                                       std::string(1000, '{'),
                                       "{\"messages\": \"\xff\xfe\"}",
                                       "{\"a\": \"\\ud800\"}",
                                       "\x00\x01"};
    const json base = chat(1);
    const std::vector<std::pair<const char*, json>> fields = {
        {"max_tokens", -5},
        {"max_tokens", "x"},
        {"temperature", -1},
        {"temperature", 1e9},
        {"top_p", 2},
        {"top_k", "k"},
        {"min_p", -0.5},
        {"presence_penalty", 9},
        {"frequency_penalty", json::object()},
        {"repetition_penalty", -1},
        {"seed", 1.5},
        {"stop", {1, 2}},
        {"stop", {"a", "b", "c", "d", "e"}},
        {"n", 3},
        {"logprobs", "yes"},
        {"top_logprobs", 50},
        {"stream", 1},
        {"stream_options", "x"},
        {"messages", {{{"role", "user"}, {"content", {1}}}}},
        {"tools", {{{"type", "function"}}}},
        {"response_format", {{"type", "json_schema"}}},
        {"max_completion_tokens", 0},
        {"model", {1}}};
    for (const auto& [k, v] : fields) {
        json b = base;
        b[k] = v;
        bodies.push_back(b.dump());
    }
    for (const char* p : {"{\"prompt\": {}}", "{\"prompt\": [[1, 2], [3]]}", "{\"prompt\": [-1]}",
                          "{\"prompt\": \"x\", \"echo\": true}", "{\"prompt\": [1e3]}", "{\"prompt\": null}",
                          "{\"prompt\": [99999999]}", "{\"prompt\": \"x\", \"best_of\": 2}",
                          "{\"prompt\": \"x\", \"logprobs\": true}", "{\"prompt\": \"x\", \"suffix\": \"y\"}",
                          "{\"prompt\": \"x\", \"logit_bias\": {\"1\": 2}}"})
        bodies.push_back(std::string("C") + p);  // marked: sent to /v1/completions
    ASSERT_GE(bodies.size(), 50u);
    for (const std::string& b : bodies) {
        const bool completion = !b.empty() && b[0] == 'C';
        const auto r =
            post(completion ? "/v1/completions" : "/v1/chat/completions", completion ? b.substr(1) : b);
        ASSERT_TRUE(r) << b;
        EXPECT_GE(r->status, 400) << b << " -> " << r->body;
        EXPECT_LT(r->status, 500) << b << " -> " << r->body;
        error_of(r);
    }
    EXPECT_EQ(engine_->submitted(), 0);
    EXPECT_EQ(client().Get("/health")->status, 200);
    EXPECT_EQ(post("/v1/chat/completions", chat(1))->status, 200);
}

}  // namespace
}  // namespace markbase::testing

#endif  // MARKBASE_HAS_HTTP
