// Which bf16 copies a quantised model drops under Tuning::quant_tiles (cuda/quant_weights.cu bf16_drop_plan,
// bf16_drop_names): host logic only, so it runs wherever the CUDA backend is built, GPU or not. The plan
// follows the tuning and the GPU (tile_gemm's wgmma needs sm_90a; moe_gemm must take the experts' widths);
// a class (the projections, the experts) goes whole, and not at all where one of its matrices has no
// quantised rows (a published checkpoint's ignored module).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "loading/checkpoint.h"
#include "loading/random_checkpoint.h"
#include "model/tensor_plan.h"
#include "support/tiny_models.h"
#ifdef MARKBASE_HAS_CUDA
#include "cuda/loader.h"
#endif

namespace markbase {
namespace {

#ifdef MARKBASE_HAS_CUDA
class Bf16Drop : public ::testing::Test {
  protected:
    void SetUp() override {
        write_random_checkpoint(dir.path(), testing::tiny_int4_config("26b-a4b"), 23);
        ck = load_checkpoint(dir.path(), LoadOptions{.quantize = WeightFormat::kFp8});
    }
    // the quantised matrices the checkpoint has: (projections, experts)
    std::pair<size_t, size_t> quantised() const {
        size_t dense = 0, experts = 0;
        Weights view = ck->weights;
        for (const PlannedTensor& p : plan_bound_tensors(ck->config, view))
            if (p.quant && p.quant->q) ++(p.name.find("experts.") != std::string::npos ? experts : dense);
        return {dense, experts};
    }
    testing::TempDir dir{"bf16_drop"};
    std::unique_ptr<Checkpoint> ck;
};

TEST_F(Bf16Drop, ThePlanFollowsTheTuningAndTheGpu) {
    const ModelConfig& c = ck->config;
    Tuning t;
    auto plan = [&](int major, int minor, WeightFormat f = WeightFormat::kFp8) {
        const cuda::Bf16Drop d = cuda::bf16_drop_plan(c, f, t, major, minor);
        return std::pair{d.dense, d.experts};
    };
    EXPECT_EQ(plan(9, 0), std::pair(false, false)) << "quant_tiles off: the copy stays";
    t.quant_tiles = true;
    EXPECT_EQ(plan(9, 0), std::pair(true, true)) << "the H200 with quant_tiles";
    EXPECT_EQ(plan(9, 0, WeightFormat::kInt4), std::pair(true, true)) << "int4 alike";
    EXPECT_EQ(plan(9, 0, WeightFormat::kBf16), std::pair(false, false)) << "a bf16 model has no rows to read";
    EXPECT_EQ(plan(8, 0), std::pair(false, false)) << "no wgmma: tile_gemm does not run";
    EXPECT_EQ(plan(10, 0), std::pair(false, false)) << "sm_90a's code only";
    t.moe_gemm = false;
    EXPECT_EQ(plan(9, 0), std::pair(true, false)) << "the grouped GEMVs read the experts' bf16 rows";
    t.moe_gemm = true;
    t.gemm_inputs = Tuning::GemmInputs::kHalves;
    EXPECT_EQ(plan(9, 0), std::pair(false, false)) << "tile_gemm takes the bf16 operand only";
    t.gemm_inputs = Tuning::GemmInputs::kBf16;
    t.tile_gemm = 0;
    EXPECT_EQ(plan(9, 0), std::pair(false, false)) << "tile_gemm=0";
}

TEST_F(Bf16Drop, AClassGoesWholeOrNotAtAll) {
    const auto [dense, experts] = quantised();
    ASSERT_GT(dense, 0u);
    ASSERT_GT(experts, 0u);
    auto count = [](const std::vector<std::string>& names) {
        const size_t e =
            static_cast<size_t>(std::count_if(names.begin(), names.end(), [](const std::string& n) {
                return n.find("experts.") != std::string::npos;
            }));
        return std::pair{names.size() - e, e};
    };
    cuda::Bf16Drop applied;
    auto names = cuda::bf16_drop_names(ck->config, ck->weights, {true, true}, &applied);
    EXPECT_EQ(count(names), std::pair(dense, experts));
    EXPECT_TRUE(applied.dense && applied.experts);
    names = cuda::bf16_drop_names(ck->config, ck->weights, {true, false}, &applied);
    EXPECT_EQ(count(names), std::pair(dense, size_t{0})) << "the experts kept";
    EXPECT_FALSE(applied.experts);
    // one projection without rows (a published checkpoint's ignored module): the projections all stay
    Weights ignored = ck->weights;
    ignored.quant[1].o_proj = QuantMatrix{};
    names = cuda::bf16_drop_names(ck->config, ignored, {true, true}, &applied);
    EXPECT_EQ(count(names), std::pair(size_t{0}, experts));
    EXPECT_FALSE(applied.dense);
    EXPECT_TRUE(applied.experts);
    // a bf16 model: nothing
    Weights plain = ck->weights;
    plain.quant.clear();
    EXPECT_TRUE(cuda::bf16_drop_names(ck->config, plain, {true, true}).empty());
}
#else
TEST(Bf16Drop, ThePlanFollowsTheTuningAndTheGpu) {
    GTEST_SKIP() << "built without CUDA";
}
#endif

}  // namespace
}  // namespace markbase
