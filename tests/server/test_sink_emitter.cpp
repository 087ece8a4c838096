// The engine's emitter thread (server/sink_emitter.h): each request's events reach its sink in the order
// posted, across batches; stop() delivers everything queued first; a sink that throws costs only its own
// event.
#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "server/sink_emitter.h"

namespace markbase::server {
namespace {

class Record final : public RequestSink {
  public:
    explicit Record(bool throws = false) : throws_(throws) {}
    void on_token(const TokenEvent& ev) override {
        ids.push_back(ev.id);
        if (throws_) throw std::runtime_error("a sink that throws");
    }
    void on_finish(FinishReason r, const std::string& text, const Usage& u, const std::string&) override {
        ++finishes;
        reason = r;
        final_text = text;
        usage = u;
    }
    std::vector<int> ids;
    int finishes = 0;
    FinishReason reason = FinishReason::Error;
    std::string final_text;
    Usage usage;

  private:
    bool throws_;
};

Emission token(const std::shared_ptr<RequestSink>& s, int id) {
    Emission e;
    e.sink = s;
    e.token.id = id;
    return e;
}

TEST(SinkEmitter, DeliversEachSinksEventsInOrderAndDrainsOnStop) {
    auto a = std::make_shared<Record>(), b = std::make_shared<Record>(), bad = std::make_shared<Record>(true);
    {
        SinkEmitter em;
        for (int step = 0; step < 200; ++step) {
            std::vector<Emission> batch;
            batch.push_back(token(a, step));
            batch.push_back(token(bad, step));
            if (step % 3 == 0) batch.push_back(token(b, step));
            em.post(batch);
            EXPECT_TRUE(batch.empty()) << "post takes the batch";
        }
        std::vector<Emission> end;
        Emission f;
        f.sink = a;
        f.finish = true;
        f.reason = FinishReason::Length;
        f.text = "tail";
        f.usage.completion_tokens = 200;
        end.push_back(f);
        em.post(end);
        em.stop();
        em.stop();  // idempotent
    }
    std::vector<int> want_a, want_b;
    for (int i = 0; i < 200; ++i) {
        want_a.push_back(i);
        if (i % 3 == 0) want_b.push_back(i);
    }
    EXPECT_EQ(a->ids, want_a);
    EXPECT_EQ(b->ids, want_b);
    EXPECT_EQ(bad->ids, want_a) << "a sink that throws still gets every later event";
    EXPECT_EQ(a->finishes, 1);
    EXPECT_EQ(a->reason, FinishReason::Length);
    EXPECT_EQ(a->final_text, "tail");
    EXPECT_EQ(a->usage.completion_tokens, 200);
}

}  // namespace
}  // namespace markbase::server
