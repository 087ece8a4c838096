// ple_block (cuda/kernels/ple_block.cu), the per-layer-input block of a few tokens in one launch, against the
// five launches it replaces (Tuning::ple_block=0), at real widths (two layers, synthetic weights) of the two
// families with PLE: a prompt chunk of 24 (a partial cluster of 8 tokens) and a batched step of 20
// sequences. Over both bf16 halves the two agree to fp32 rounding (1e-4 of the range); over the one bf16
// operand a layer's input rounded to bf16 can land on the neighbouring value either way, so to the bf16
// path's bound (2e-2). Not bit-identical either way: the fused kernel ran.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "runtime/backend.h"
#include "runtime/tuning.h"
#include "support/exact_options.h"
#include "support/logits_compare.h"
#include "support/require_cuda.h"
#include "support/tiny_models.h"

#ifdef MARKBASE_HAS_CUDA
#include "cuda/backend.h"
#include "cuda/kernels/kernels.h"
#endif

namespace markbase {
namespace {

#ifdef MARKBASE_HAS_CUDA
struct Logits {
    std::vector<float> chunk, step;
};

Logits run(const std::string& variant, bool fused, bool halves) {
    constexpr int kSeqs = 20;
    BackendOptions o = halves ? testing::exact_options() : BackendOptions{};
    o.ctx_size = 128;
    o.chunk = 24;
    o.tuning.ple_block = fused;
    Logits l;
    int V = 0;
    {
        auto one = make_synthetic_cuda_backend(variant, 2, o, 43);
        V = static_cast<int>(one->config().vocab_size);
        const std::vector<int> prompt = testing::random_ids(24, V, 7);
        l.chunk.resize(static_cast<size_t>(V));
        one->eval(prompt.data(), 24, l.chunk.data(), false);
    }
    o.slots = kSeqs;  // a backend's slots or its one sequence, not both
    auto b = make_synthetic_cuda_backend(variant, 2, o, 43);
    std::vector<int> order(kSeqs), in(kSeqs);
    for (int s = 0; s < kSeqs; ++s) {
        const std::vector<int> p = testing::random_ids(3 + s % 5, V, 200 + s);
        b->slot_reset(s);
        b->slot_eval(s, p.data(), static_cast<int64_t>(p.size()));
        order[s] = kSeqs - 1 - s;
        in[s] = (11 * s + 5) % V;
    }
    l.step.resize(static_cast<size_t>(kSeqs) * V);
    b->decode_batch(order.data(), in.data(), kSeqs, l.step.data());
    return l;
}
#endif

class PleBlock : public ::testing::TestWithParam<const char*> {};

TEST_P(PleBlock, MatchesTheUnfusedBlock) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    for (const bool halves : {true, false}) {
        SCOPED_TRACE(halves ? "both halves" : "the bf16 operand");
        const Logits a = run(GetParam(), false, halves), b = run(GetParam(), true, halves);
        const double bound = halves ? 1e-4 : 2e-2;
        const double e = testing::rel_err(a.chunk, b.chunk);
        std::printf("  %s, %s: prompt chunk of 24 fused against unfused: rel err %.2e\n", GetParam(),
                    halves ? "halves" : "bf16", e);
        EXPECT_LT(e, bound) << "prompt chunk";
        EXPECT_NE(a.chunk, b.chunk) << "bit-identical: the chunk did not run ple_block";
        EXPECT_NE(a.step, b.step) << "bit-identical: the step did not run ple_block";
        const size_t V = a.chunk.size();
        for (size_t t = 0; t * V < a.step.size(); ++t) {
            const std::vector<float> x(a.step.begin() + t * V, a.step.begin() + (t + 1) * V);
            const std::vector<float> y(b.step.begin() + t * V, b.step.begin() + (t + 1) * V);
            EXPECT_LT(testing::rel_err(x, y), bound) << "batched row " << t;
        }
    }
#endif
}

std::string family_name(const ::testing::TestParamInfo<const char*>& p) {
    return testing::test_name(p.param);
}

INSTANTIATE_TEST_SUITE_P(Families, PleBlock, ::testing::Values("e2b", "e4b"), family_name);

TEST(PleBlockShapes, EligibilityByName) {
#ifndef MARKBASE_HAS_CUDA
    GTEST_SKIP() << "built without CUDA";
#else
    EXPECT_TRUE(cuda::ple_block_fits(1536, 256, 96)) << "E2B";
    EXPECT_TRUE(cuda::ple_block_fits(2560, 256, 1)) << "E4B";
    EXPECT_FALSE(cuda::ple_block_fits(1536, 256, cuda::kPleBlockMaxN + 1));
    EXPECT_FALSE(cuda::ple_block_fits(64, 16, 8)) << "the tiny test models take the five launches";
    try {
        cuda::ple_block(nullptr, nullptr, 0, nullptr, nullptr, nullptr, 2048, 256, 8, 1e-6f, 1.0f, true,
                        nullptr);
        ADD_FAILURE() << "hidden 2048 accepted";
    } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("ple_block takes hidden 1536 or 2560"), std::string::npos)
            << e.what();
    }
#endif
}

}  // namespace
}  // namespace markbase
