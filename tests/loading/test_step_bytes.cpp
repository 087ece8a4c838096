// batched_step_bytes (loading/checkpoint.h): the bytes a batched decode step must read, the roofline that
// `bench -np` measures its step against. One sequence reads what count_params counts per token; the MoE's
// expected touched experts follow n (1 - (1 - k / n)^B) (the batched-step issue's "about 52 of 128" at 8
// sequences); the K/V bytes of E2B worked out by hand.
#include <gtest/gtest.h>

#include <cmath>

#include "loading/checkpoint.h"
#include "loading/config_json.h"
#include "model/variants.h"

namespace markbase {
namespace {

ModelConfig variant(const std::string& name) {
    return parse_config_text(variant_config(name).dump(), "config.json");
}

TEST(StepBytes, OneSequenceReadsWhatATokenReads) {
    for (const char* v : {"e2b", "e4b", "26b-a4b", "31b"}) {
        const ModelConfig c = variant(v);
        const StepBytes b = batched_step_bytes(c, 1, 0, 2);
        EXPECT_NEAR(b.weights / count_params(c).bytes_per_token, 1.0, 1e-12) << v;
        EXPECT_EQ(b.kv, 0.0) << v;
        EXPECT_NEAR(b.experts_touched, c.n_experts > 0 ? c.top_k : 0, 1e-9) << v;
    }
}

TEST(StepBytes, ExpertsTouchedGrowTowardsAll) {
    const ModelConfig c = variant("26b-a4b");
    const StepBytes one = batched_step_bytes(c, 1, 0, 2), eight = batched_step_bytes(c, 8, 0, 2),
                    all = batched_step_bytes(c, 100000, 0, 2);
    EXPECT_NEAR(eight.experts_touched, 128.0 * (1.0 - std::pow(120.0 / 128.0, 8)), 1e-9);
    EXPECT_NEAR(eight.experts_touched, 51.6, 0.05);
    EXPECT_NEAR(all.experts_touched, 128.0, 1e-9);
    // the dense part is read once whatever the count; the experts' bytes scale with the touched count
    const double per_expert = (all.weights - one.weights) / (128.0 - 8.0);
    EXPECT_GT(per_expert, 0.0);
    EXPECT_NEAR(eight.weights, one.weights + per_expert * (eight.experts_touched - 8.0), 1.0);
    EXPECT_EQ(batched_step_bytes(variant("31b"), 64, 0, 2).weights,
              batched_step_bytes(variant("31b"), 1, 0, 2).weights)
        << "a dense model's weights are read once per step, whatever the batch";
}

TEST(StepBytes, Fp8ExpertsCountOneByteAWeight) {
    const ModelConfig c = variant("26b-a4b");
    const StepBytes bf16 = batched_step_bytes(c, 96, 0, 2), fp8 = batched_step_bytes(c, 96, 0, 2, 1.0);
    const double expert_params = 128.0 * c.n_layers * 3.0 * c.expert_width * c.hidden;  // gate, up, down
    // every expert weight touched costs one byte less, the dense part the same
    EXPECT_NEAR(bf16.weights - fp8.weights, expert_params * bf16.experts_touched / 128.0, 1.0);
    EXPECT_EQ(batched_step_bytes(variant("31b"), 16, 0, 2, 1.0).weights,
              batched_step_bytes(variant("31b"), 16, 0, 2).weights)
        << "a dense model has no experts";
}

// E2B: 28 sliding layers (window 512) and 7 full ones, one KV head each, head dims 256 and 512; KV-shared
// layers read their source's rows, so every layer counts. Two sequences at 1,000 keys, bf16:
// sliding 28 x (K and V) 2 x 2 seqs x 512 keys x 256 x 2 B = 29,360,128; full 7 x 2 x 2 x 1000 x 512 x 2 B
// = 28,672,000.
TEST(StepBytes, KvBytesOfE2B) {
    const ModelConfig c = variant("e2b");
    EXPECT_EQ(batched_step_bytes(c, 2, 1000, 2).kv, 29360128.0 + 28672000.0);
    EXPECT_EQ(batched_step_bytes(c, 2, 1000, 4).kv, 2 * (29360128.0 + 28672000.0)) << "fp32 cache";
    // below the window: 2 x 2 seqs x 100 keys x (28 x 256 + 7 x 512) x 2 B
    EXPECT_EQ(batched_step_bytes(c, 2, 100, 2).kv, 8601600.0)
        << "below the window every layer sees all its keys";
}

}  // namespace
}  // namespace markbase
