// A batched step's sampled rows cut on the device (SlotWork::select through the CUDA slot backend,
// CudaModel::batch_select): two slot backends over the same synthetic weights at real widths (E2B, 262,144
// ids; two layers) take the same steps, one selecting on the device and one sending its rows. Their logits
// are the same bits, so the device's candidates must be exactly the host's over the other's row (testing::
// host_select: the penalties, then the k best), a row sent whole beside them must come back bit for bit, and
// the sampler's draw from the candidates must be its draw from the whole row. Without a GPU it skips.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include "runtime/backend.h"
#include "runtime/slot_backend.h"
#include "support/host_select.h"
#include "support/require_cuda.h"

namespace markbase {
namespace {

TEST(CudaBatchSelect, CandidatesAreTheHostsOverTheSameRow) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    constexpr int kSlots = 5;
    std::unique_ptr<SlotBackend> be[2];
    for (int i = 0; i < 2; ++i) {
        BackendOptions o;
        o.ctx_size = 128;
        o.chunk = 64;
        o.slots = kSlots;
        o.tuning.device_sampling = i == 0;  // backend 1 sends every row
        be[i] = make_cuda_slot_backend(make_synthetic_cuda_backend("e2b", 2, o, 41), kSlots);
    }
    ASSERT_EQ(be[0]->max_select_k(), 64);
    ASSERT_EQ(be[1]->max_select_k(), 0) << "device_sampling=0 must leave selection off";
    const int64_t V = be[0]->config().vocab_size;
    std::mt19937 rng(3);
    std::uniform_int_distribution<int> id(3, static_cast<int>(V) - 1);
    std::vector<std::vector<int>> prompts(kSlots);
    for (int s = 0; s < kSlots; ++s)
        for (int t = 0; t < 9 + 3 * s; ++t) prompts[s].push_back(id(rng));
    // requests: plain top-k; a window of penalties (one id twice, one at the vocabulary's end); k = 1 after
    // penalties (greedy with a repeat penalty); then an argmax-only row and a row sent whole
    DeviceSelect sel[3];
    sel[0].k = 64;
    sel[1].k = 20;
    sel[1].pen_ids = {prompts[1][0], prompts[1][1], static_cast<int>(V) - 1};
    std::sort(sel[1].pen_ids.begin(), sel[1].pen_ids.end());
    sel[1].pen_counts = {2, 1, 1};
    sel[1].repeat_penalty = 1.3f;
    sel[1].presence_penalty = 0.4f;
    sel[1].frequency_penalty = 0.25f;
    sel[2].k = 1;
    sel[2].pen_ids = {prompts[2][4]};
    sel[2].pen_counts = {3};
    sel[2].repeat_penalty = 1.5f;
    for (int step = 0; step < 3; ++step) {
        std::vector<std::vector<float>> rows(2, std::vector<float>(kSlots * V, -1.0f));
        std::vector<std::vector<int>> next(2, std::vector<int>(kSlots, -1));
        DeviceSelection got[3];
        for (int i = 0; i < 2; ++i) {
            std::vector<SlotWork> work;
            for (int s = 0; s < kSlots; ++s) {
                // the first step feeds the prompts (their last id's logits), then one id a step, in shifting
                // order
                const int slot = (s + step) % kSlots;
                SlotWork w{slot,
                           step == 0 ? std::span<const int>(prompts[slot])
                                     : std::span<const int>(&prompts[slot][step], 1),
                           true, slot == 3};
                if (i == 0 && slot < 3) {
                    w.select = &sel[slot];
                    w.selection = &got[slot];
                }
                work.push_back(w);
            }
            be[i]->eval_slots(work, rows[i].data(), next[i].data());
        }
        EXPECT_EQ(next[0], next[1]) << "step " << step << ": the argmaxes";
        for (int s = 0; s < kSlots; ++s) {
            const int slot = (s + step) % kSlots;
            const float* row = rows[1].data() + s * V;
            if (slot < 3) {
                const DeviceSelection want = testing::host_select(row, V, sel[slot]);
                ASSERT_TRUE(got[slot].ok) << "step " << step << ", slot " << slot;
                EXPECT_EQ(got[slot].n_finite, want.n_finite);
                ASSERT_EQ(got[slot].top.size(), want.top.size()) << "slot " << slot;
                for (size_t j = 0; j < want.top.size(); ++j) {
                    EXPECT_EQ(got[slot].top[j].id, want.top[j].id) << "slot " << slot << ", candidate " << j;
                    EXPECT_EQ(got[slot].top[j].logit, want.top[j].logit)
                        << "slot " << slot << ", candidate " << j;
                }
                if (slot == 0) {  // the draw: from the candidates as from the row (no penalties here)
                    SamplingParams sp;
                    sp.temperature = 0.9f;
                    sp.top_k = sel[0].k;
                    sp.top_p = 0.9f;
                    sp.seed = 11 + step;
                    Sampler a(sp), b(sp);
                    EXPECT_EQ(a.sample_top(got[0].top, got[0].n_finite), b.sample(row, V, {}))
                        << "step " << step;
                }
            } else if (slot == 4) {
                EXPECT_TRUE(std::equal(row, row + V, rows[0].data() + s * V))
                    << "step " << step << ": the row sent whole";
            }
        }
    }
#endif
}

}  // namespace
}  // namespace markbase
