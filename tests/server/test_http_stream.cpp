// Streaming over the in-process server (fake engine): the SSE sequence, a client hanging up mid-stream or
// during a non-streaming request (the engine is told to cancel), 16 streams at once, and shutdown ending a
// stream with an error event.
#include "server/http_fixture.h"

#ifdef MARKBASE_HAS_HTTP

#include <atomic>

namespace markbase::testing {
namespace {

using nlohmann::json;

json stream_chat(int max_tokens, bool usage = false) {
    json j = {{"messages", json::array({{{"role", "user"}, {"content", "Hello"}}})},
              {"max_tokens", max_tokens},
              {"stream", true}};
    if (usage) j["stream_options"] = {{"include_usage", true}};
    return j;
}

// Every delta's content, joined; checks the chunk shapes on the way.
std::string joined_content(const std::vector<std::string>& data, std::string* finish) {
    std::string text;
    for (const std::string& d : data) {
        if (d == "[DONE]") continue;
        const json j = json::parse(d);
        if (j["choices"].empty()) continue;  // the usage chunk
        EXPECT_EQ(j["object"], "chat.completion.chunk");
        const json& c = j["choices"][0];
        if (c["delta"].contains("content")) text += c["delta"]["content"].get<std::string>();
        if (!c["finish_reason"].is_null()) *finish = c["finish_reason"];
    }
    return text;
}

TEST_F(HttpServerTest, ChatStream) {
    start();
    const auto r = post("/v1/chat/completions", stream_chat(4, true));
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
    const std::vector<std::string> data = sse_data(r->body);
    ASSERT_GE(data.size(), 4u);
    const json first = json::parse(data[0]);
    EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
    EXPECT_EQ(data.back(), "[DONE]");
    const json usage = json::parse(data[data.size() - 2]);
    EXPECT_TRUE(usage["choices"].empty());
    EXPECT_EQ(usage["usage"]["completion_tokens"], 4);
    const json fin = json::parse(data[data.size() - 3]);
    EXPECT_EQ(fin["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(fin["choices"][0]["delta"], json::object());
    std::string finish;
    EXPECT_EQ(joined_content(data, &finish), " w0 w1 w2 w3");
    EXPECT_EQ(finish, "length");
    for (const std::string& d : data) {  // one id for the whole stream
        if (d != "[DONE]") {
            EXPECT_EQ(json::parse(d)["id"], first["id"]);
        }
    }
}

TEST_F(HttpServerTest, CompletionStreamWithStop) {
    start();
    const auto r = post("/v1/completions",
                        json{{"prompt", {2, 5}}, {"stream", true}, {"stop", {"w3"}}, {"max_tokens", 10}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200);
    std::string text, finish;
    for (const std::string& d : sse_data(r->body)) {
        if (d == "[DONE]") continue;
        const json c = json::parse(d)["choices"][0];
        EXPECT_FALSE(c.contains("delta"));
        text += c["text"].get<std::string>();
        if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
    }
    EXPECT_EQ(text, " w0 w1 w2 ");
    EXPECT_EQ(finish, "stop");
}

TEST_F(HttpServerTest, ClientHangingUpCancelsTheRequest) {
    FakeEngineOptions fo;
    fo.token_delay = std::chrono::milliseconds(20);
    start(fo);
    {
        RawClient c(port_);
        ASSERT_TRUE(c.connected());
        ASSERT_TRUE(c.send_all(http_post("/v1/chat/completions", stream_chat(100000).dump())));
        ASSERT_TRUE(c.read_until(" w2", std::chrono::seconds(5))) << c.received();
    }  // closed mid-stream
    ASSERT_TRUE(eventually([&] { return !engine_->cancel_calls().empty(); })) << "no cancel";
    EXPECT_EQ(engine_->cancel_calls().size(), 1u);
    EXPECT_TRUE(eventually([&] { return engine_->active() == 0; }));
    EXPECT_EQ(client().Get("/health")->status, 200);
}

// Without a stream nothing is written until the reply is complete, so no failed write shows the hang-up: the
// server watches the connection itself.
TEST_F(HttpServerTest, ClientHangingUpOnANonStreamingRequestCancelsIt) {
    FakeEngineOptions fo;
    fo.token_delay = std::chrono::milliseconds(20);
    start(fo);
    {
        RawClient c(port_);
        ASSERT_TRUE(c.connected());
        json body = stream_chat(100000);
        body["stream"] = false;
        ASSERT_TRUE(c.send_all(http_post("/v1/chat/completions", body.dump())));
        ASSERT_TRUE(eventually([&] { return engine_->active() == 1; })) << "never admitted";
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // a few tokens in
        EXPECT_TRUE(engine_->cancel_calls().empty());
    }  // closed while the reply is being generated
    ASSERT_TRUE(eventually([&] { return !engine_->cancel_calls().empty(); })) << "no cancel";
    EXPECT_EQ(engine_->cancel_calls().size(), 1u);
    EXPECT_TRUE(eventually([&] { return engine_->active() == 0; }));
    EXPECT_EQ(client().Get("/health")->status, 200);
    // a client that stays gets its whole reply
    json stay = stream_chat(3);
    stay["stream"] = false;
    const auto r = post("/v1/chat/completions", stay);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(engine_->cancel_calls().size(), 1u);
}

TEST_F(HttpServerTest, ClientHangingUpWhileQueuedCancelsTheRequest) {
    FakeEngineOptions fo;
    fo.limits.max_sequences = 1;
    start(fo);
    engine_->hold(true);  // no token comes: the hang-up is seen while waiting, not by a failed write
    {
        RawClient c(port_);
        ASSERT_TRUE(c.send_all(http_post("/v1/chat/completions", stream_chat(10).dump())));
        ASSERT_TRUE(c.read_until("assistant", std::chrono::seconds(5))) << c.received();
    }
    EXPECT_TRUE(eventually([&] { return engine_->cancel_calls().size() == 1; }));
    EXPECT_TRUE(eventually([&] { return engine_->active() == 0; }));
}

TEST_F(HttpServerTest, SixteenConcurrentStreams) {
    FakeEngineOptions fo;
    fo.limits.max_sequences = 16;
    fo.token_delay = std::chrono::milliseconds(2);
    start(fo);
    std::atomic<int> ok{0};
    std::vector<std::thread> clients;
    for (int i = 0; i < 16; ++i)
        clients.emplace_back([&, i] {
            const auto r = post("/v1/chat/completions", stream_chat(20 + i));
            if (!r || r->status != 200) {
                ADD_FAILURE() << "stream " << i << ": " << (r ? r->body : httplib::to_string(r.error()));
                return;
            }
            const auto data = sse_data(r->body);
            std::string finish, want;
            for (int k = 0; k < 20 + i; ++k) want += " w" + std::to_string(k);
            const std::string got = joined_content(data, &finish);
            if (got == want && finish == "length" && data.back() == "[DONE]")
                ++ok;
            else
                ADD_FAILURE() << "stream " << i << ": " << r->body;
        });
    for (auto& t : clients) t.join();
    EXPECT_EQ(ok.load(), 16);
    EXPECT_EQ(engine_->cancel_calls().size(), 0u);
    if (ok.load() != 16)
        for (const auto& l : log()) ADD_FAILURE() << l;
}

TEST_F(HttpServerTest, ShutdownEndsStreamsWithAnErrorEvent) {
    FakeEngineOptions fo;
    fo.token_delay = std::chrono::milliseconds(20);
    start(fo);
    RawClient c(port_);
    ASSERT_TRUE(c.send_all(http_post("/v1/chat/completions", stream_chat(100000).dump())));
    ASSERT_TRUE(c.read_until(" w1", std::chrono::seconds(5)));
    std::thread stopper([this] { stop(); });
    EXPECT_TRUE(c.read_until("[DONE]", std::chrono::seconds(10))) << c.received();
    EXPECT_NE(c.received().find("server shutting down"), std::string::npos) << c.received();
    EXPECT_NE(c.received().find("\"error\""), std::string::npos);
    c.close();
    stopper.join();
    RawClient refused(port_);  // nothing listens any more
    EXPECT_FALSE(refused.connected());
}

}  // namespace
}  // namespace markbase::testing

#endif  // MARKBASE_HAS_HTTP
