// The engine's sampled rows cut on the backend (SlotWork::select, what the CUDA slot backend does on the
// device): the draws from the k candidates must be the host sampler's over the whole row, request by request,
// whatever else the step holds. A CPU slot backend wrapped to select on the host stands in for the device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "engine_fixture.h"
#include "support/host_select.h"

namespace markbase::server {
namespace {

// The CPU slot backend, selecting as CudaModel::batch_select does (testing::host_select). The selected rows
// are poisoned (NaN), so a draw that read them would fail; every third selection is refused (ok false, the
// row kept), the path a row with NaN or +inf takes on the device.
class SelectingBackend final : public SlotBackend {
  public:
    explicit SelectingBackend(std::unique_ptr<SlotBackend> inner) : in_(std::move(inner)) {}
    const ModelConfig& config() const override { return in_->config(); }
    std::string name() const override { return in_->name() + ", selecting"; }
    int slots() const override { return in_->slots(); }
    int64_t ctx_size() const override { return in_->ctx_size(); }
    int64_t n_past(int slot) const override { return in_->n_past(slot); }
    void reset_slot(int slot) override { in_->reset_slot(slot); }
    StepSeconds last_step_seconds() const override { return in_->last_step_seconds(); }
    int max_select_k() const override { return 64; }
    int max_select_penalty_ids() const override { return 1024; }

    void eval_slots(const std::vector<SlotWork>& work, float* logits, int* next) override {
        check_slot_work(*this, work);
        std::vector<SlotWork> plain = work;
        for (SlotWork& w : plain) w.select = nullptr, w.selection = nullptr;
        in_->eval_slots(plain, logits, next);
        const int64_t V = config().vocab_size;
        int64_t row = 0;
        for (const SlotWork& w : work) {
            if (!w.logits) continue;
            float* r = logits + row++ * V;
            if (!w.select) continue;
            w.selection->ok = ++asked_ % 3 != 0;
            if (!w.selection->ok) continue;
            *w.selection = testing::host_select(r, V, *w.select);
            std::fill(r, r + V, std::numeric_limits<float>::quiet_NaN());
            ++selected_;
        }
    }
    int selected() const { return selected_; }
    int asked() const { return asked_; }

  private:
    std::unique_ptr<SlotBackend> in_;
    int asked_ = 0, selected_ = 0;
};

TEST_F(EngineTest, RowsSelectedByTheBackendDrawTheHostSamplersIds) {
    SamplingParams top;  // Gemma 4's generation defaults
    top.temperature = 0.8f;
    top.top_k = 64;
    top.top_p = 0.95f;
    top.seed = 1234;
    SamplingParams penalised = top;  // penalties over a short window, min-p, a small k
    penalised.top_k = 20;
    penalised.min_p = 0.05f;
    penalised.repeat_penalty = 1.3f;
    penalised.presence_penalty = 0.4f;
    penalised.frequency_penalty = 0.2f;
    penalised.repeat_last_n = 16;
    penalised.seed = 7;
    SamplingParams greedy_penalised = greedy();  // k = 1 after the penalties
    greedy_penalised.repeat_penalty = 1.5f;
    SamplingParams whole = top;  // no top-k: the row goes to the host
    whole.top_k = 0;
    whole.seed = 5;
    const std::vector<SamplingParams> params = {top, penalised, greedy_penalised, whole};
    const std::vector<std::vector<int>> prompts = {prompt("The LORD is my shepherd"),
                                                   prompt("In the beginning")};

    SelectingBackend sb(make_cpu_slot_backend(*ck_, options(8)));
    auto engine = make_engine(sb, *tok_, ck_->config, limits(8));
    std::vector<std::shared_ptr<Collect>> got;
    std::vector<std::vector<int>> want;
    for (const SamplingParams& sp : params)
        for (const std::vector<int>& p : prompts) {
            got.push_back(std::make_shared<Collect>());
            engine->submit(request(p, sp, 24), got.back());
            want.push_back(alone(p, sp, 24));
        }
    for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_TRUE(got[i]->wait_done()) << "request " << i;
        EXPECT_EQ(got[i]->ids(), want[i]) << "request " << i << " (params " << i / prompts.size() << ")";
    }
    // every row of the three selecting requests' six replies (not `whole`'s: no top-k), a third refused
    EXPECT_EQ(sb.asked(), 6 * 24);
    EXPECT_EQ(sb.selected(), 4 * 24);
}

TEST_F(EngineTest, LogprobsKeepTheWholeRow) {
    SamplingParams sp;
    sp.temperature = 0.8f;
    sp.top_k = 64;
    sp.seed = 3;
    SelectingBackend sb(make_cpu_slot_backend(*ck_, options(2)));
    auto engine = make_engine(sb, *tok_, ck_->config, limits(2));
    GenerationRequest r = request(prompt("In the beginning"), sp, 8);
    r.top_logprobs = 3;
    auto c = std::make_shared<Collect>();
    engine->submit(r, c);
    ASSERT_TRUE(c->wait_done());
    EXPECT_EQ(c->ids(), alone(r.prompt, sp, 8));
    EXPECT_EQ(sb.asked(), 0) << "logprobs read the whole row: nothing may be selected";
    for (const TokenEvent& ev : c->events()) EXPECT_TRUE(std::isfinite(ev.logprob));
}

TEST(SlotWorkSelect, BadSelectionsAreRefusedByName) {
    // check_slot_work names what is wrong before anything runs
    const std::string dir = std::string(MARKBASE_TEST_DATA) + "/../../models/default";
    auto ck = load_checkpoint(dir);
    BackendOptions o;
    o.threads = 1;
    o.ctx_size = 64;
    o.slots = 2;
    SelectingBackend sb(make_cpu_slot_backend(*ck, o));
    const std::vector<int> ids = {2, 100};
    DeviceSelect s;
    DeviceSelection out;
    auto refused = [&](const SlotWork& w, const std::string& what) {
        try {
            check_slot_work(sb, {w});
            ADD_FAILURE() << "accepted: " << what;
        } catch (const std::exception& e) {
            EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
        }
    };
    SlotWork w{0, ids, true, false, &s, &out};
    s.k = 65;
    refused(w, "of k = 65; this backend selects 1 to 64");
    s.k = 8;
    s.pen_ids = {3, 9999999};
    s.pen_counts = {1, 1};
    refused(w, "penalty id 9999999 is outside the vocabulary");
    s.pen_ids = {3};
    refused(w, "with 1 penalty ids and 2 counts");
    s.pen_counts = {1};
    SlotWork argmax{0, ids, true, true, &s, &out};
    refused(argmax, "needs a logits row that is not argmax-only");
    EXPECT_NO_THROW(check_slot_work(sb, {w}));
}

}  // namespace
}  // namespace markbase::server
