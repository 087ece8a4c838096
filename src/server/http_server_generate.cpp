// POST /v1/chat/completions and /v1/completions: parse, submit, then either wait for the whole reply or
// stream it as server-sent events from this HTTP thread, which waits on its own sink only.
#include <ctime>
#include <deque>
#include <memory>

#include "model/error.h"
#include "server/http_server_impl.h"
#include "server/openai_response.h"
#include "server/request_sink.h"

namespace markbase::server {

namespace {

// How often a waiting thread looks at its client while no event comes.
constexpr std::chrono::milliseconds kPoll{200};

// One streaming request, shared by the writer and the releaser that runs when the response is destroyed.
struct Stream {
    Engine& engine;
    uint64_t id = 0;
    std::shared_ptr<QueueSink> sink;
    ResponseMeta meta;
    const Tokenizer& tok;
    bool finished = false;   // the engine reported the end
    bool cancelled = false;  // we asked the engine to stop
    size_t offset = 0;       // bytes of text sent

    void cancel() {
        if (finished || cancelled) return;
        cancelled = true;
        engine.cancel(id);
    }
};

void trace_finish(const SinkEvent& e, int status) {
    RequestLog& log = current_trace().log;
    log.generated = true;
    log.prompt_tokens = e.usage.prompt_tokens;
    log.completion_tokens = e.usage.completion_tokens;
    log.ttft_s = e.usage.ttft_s;
    log.decode_tok_s = e.usage.decode_tok_s;
    log.finish = finish_reason_name(e.reason);
    log.status = status;
}

// The engine's end of a request as the error the client gets.
ApiError finish_error(const SinkEvent& e, bool draining) {
    if (e.reason == FinishReason::Cancelled) return ApiError(500, "the request was cancelled");
    return ApiError(draining ? 503 : 500, "generation failed: " + e.error);
}

// The last events of a stream: held-back text, the finish chunk, usage, [DONE]. False when a write failed.
bool write_end(Stream& st, const SinkEvent& e, bool draining, httplib::DataSink& out) {
    auto write = [&](const std::string& s) { return out.write(s.data(), s.size()); };
    if (e.reason == FinishReason::Stop || e.reason == FinishReason::Length) {
        if (!e.text.empty() && !write(sse_text_chunk(st.meta, e.text, nullptr, st.offset, st.tok)))
            return false;
        if (!write(sse_finish_chunk(st.meta, e.reason))) return false;
        if (st.meta.include_usage && !write(sse_usage_chunk(st.meta, e.usage))) return false;
    } else if (!write(sse_error(finish_error(e, draining)))) {
        return false;
    }
    if (!write(kSseDone)) return false;
    out.done();
    return true;
}

// The content provider: runs once, writing events as they come until the end or until the client is gone.
bool write_stream(Stream& st, const std::atomic<bool>& draining, httplib::DataSink& out) {
    auto write = [&](const std::string& s) { return out.write(s.data(), s.size()); };
    if (st.meta.kind == ApiKind::Chat && !write(sse_first_chunk(st.meta))) {
        st.cancel();
        return false;
    }
    std::deque<SinkEvent> events;
    while (true) {
        if (!st.sink->take(events, kPoll)) {
            if (!out.is_writable()) break;  // the client closed its end while nothing was written
            continue;
        }
        for (; !events.empty(); events.pop_front()) {
            const SinkEvent& e = events.front();
            if (e.finished) {
                st.finished = true;
                trace_finish(e, 200);
                return write_end(st, e, draining, out);
            }
            if (e.token.text.empty() && !st.meta.logprobs) continue;
            const TokenEvent* lp = st.meta.logprobs ? &e.token : nullptr;
            if (!write(sse_text_chunk(st.meta, e.token.text, lp, st.offset, st.tok))) {
                st.cancel();
                return false;
            }
            st.offset += e.token.text.size();
        }
    }
    st.cancel();
    return false;
}

// Waits for the whole reply. Nothing is written until the end, so the client is watched directly: once it has
// closed its connection the engine is told to stop (and the request ends as cancelled).
Reply collect(Engine& engine, uint64_t id, const ClientWatch& client, QueueSink& sink, bool logprobs,
              SinkEvent& end) {
    Reply reply;
    std::deque<SinkEvent> events;
    bool cancelled = false;
    auto next_look = std::chrono::steady_clock::now() + kPoll;
    while (true) {
        sink.take(events, kPoll);
        if (!cancelled && std::chrono::steady_clock::now() >= next_look) {  // tokens or not, every kPoll
            next_look += kPoll;
            if (client.gone()) {
                cancelled = true;
                engine.cancel(id);
            }
        }
        for (; !events.empty(); events.pop_front()) {
            SinkEvent& e = events.front();
            if (e.finished) {
                reply.text += e.text;
                reply.reason = e.reason;
                reply.usage = e.usage;
                end = std::move(e);
                return reply;
            }
            reply.text += e.token.text;
            if (logprobs) reply.tokens.push_back(std::move(e.token));
        }
    }
}

}  // namespace

void HttpServer::Impl::generate(ApiKind kind, const std::string& body, const httplib::Request& req,
                                httplib::Response& res) {
    const nlohmann::json j = parse_request_body(body);
    const ApiRequest r = kind == ApiKind::Chat ? parse_chat_request(j) : parse_completion_request(j);
    GenerationRequest g = build_generation(r, model, engine.vocab_size(), engine.limits().ctx_size);
    ResponseMeta meta{kind,
                      new_response_id(kind),
                      model.id,
                      static_cast<int64_t>(std::time(nullptr)),
                      r.top_logprobs >= 0,
                      r.include_usage};
    current_trace().log.id = meta.id;
    if (draining) throw ApiError(503, "the server is shutting down");
    auto sink = std::make_shared<QueueSink>();
    uint64_t id = 0;
    try {
        id = engine.submit(std::move(g), sink);
    } catch (const QueueFull& e) {
        throw ApiError(503, std::string("the server is busy: ") + e.what() + " (retry later)", "",
                       "queue_full");
    } catch (const Error& e) {
        throw ApiError(400, e.what(), kind == ApiKind::Chat ? "messages" : "prompt");
    }
    if (!r.stream) {
        SinkEvent end;
        const Reply reply = collect(engine, id, ClientWatch(req), *sink, meta.logprobs, end);
        trace_finish(end, 200);
        if (end.reason != FinishReason::Stop && end.reason != FinishReason::Length)
            throw finish_error(end, draining);
        respond_json(res, 200, completion_response(meta, reply, model.tokenizer));
        return;
    }
    auto st = std::make_shared<Stream>(Stream{engine, id, sink, meta, model.tokenizer});
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, st](size_t, httplib::DataSink& out) { return write_stream(*st, draining, out); },
        [st](bool) { st->cancel(); });  // never written, or cut short: the engine stops it
}

}  // namespace markbase::server
