// tile_gemm (cuda/kernels/tile_gemm.cu), a serving step's projections over the one bf16 operand: every
// output of every K split against an fp64 host product of the same operands, with token counts that leave
// 16-token tiles partly empty, matrices whose rows end inside a 128-row tile, K ranges that leave a rank no
// stage, and three matrices in one launch, over bf16, FP8 and int4 rows; then the model both ways at real
// widths (tile_gemm=128 against cuBLAS over the same operand; quantised rows against the bf16 copy) on
// every family; the shape rule and the eligibility checks on the host.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "runtime/backend.h"
#include "support/device_arrays.h"
#include "support/device_segments.h"
#include "support/logits_compare.h"
#include "support/require_cuda.h"
#include "support/tiny_models.h"

#ifdef MARKBASE_HAS_CUDA
#include <cuda_runtime.h>

#include "cuda/backend.h"
#include "cuda/kernels/kernels.h"
#endif

namespace markbase {
namespace {

#ifdef MARKBASE_HAS_CUDA
using testing::from_bf16;
using testing::to_bf16;
using testing::to_device;

// One launch over matrices of `rows` (K columns each) at n tokens with K split ks ways and row tiles of
// mt x 64, over bf16 rows or quantised ones (int4 with zero points where `zeros`); the largest error of any
// output against the fp64 product of the rows' values, relative to the row's sum of |x| |w|.
double max_error(const std::vector<int>& rows, int K, int n, int ks, int mt, uint32_t seed,
                 WeightFormat f = WeightFormat::kBf16, bool zeros = false) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<uint16_t> x(static_cast<size_t>(n) * K);
    std::vector<double> xd(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        x[i] = to_bf16(u(rng));
        xd[i] = from_bf16(x[i]);
    }
    uint16_t* d_x = to_device(x);
    testing::DeviceSegments segs(rows, K, n, rng);
    if (f == WeightFormat::kFp8) segs.quantize_fp8();
    if (f == WeightFormat::kInt4) segs.quantize_int4(rng, zeros);
    cuda::tile_gemm(segs.segs(), segs.count(), d_x, n, K, {ks, mt}, nullptr);
    const double worst = segs.worst_error(xd);
    cudaFree(d_x);
    return worst;
}
#endif

TEST(TileGemm, EveryKSplitMatchesTheFp64Product) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    cuda::tile_gemm_prepare();
    // rows ending inside a 128-row and a 64-row tile (200, 72) and a matrix of one tile's part (16); K = 320
    // (5 stages: over 8 ranks of 1, three ranks hold none) and 1088 (17 stages); every ring depth (token
    // tiles 2..16) of both tile heights
    const std::vector<int> rows = {200, 72, 16};
    for (int K : {320, 1088})
        for (int n : {1, 17, 33, 64, 90, 96, 113, 128})
            for (int ks : {1, 2, 4, 8})
                for (int mt : {1, 2}) {
                    const double e =
                        max_error(rows, K, n, ks, mt, static_cast<uint32_t>(K + n * 7 + ks + mt));
                    EXPECT_LT(e, 1e-5) << "K " << K << ", " << n << " tokens, ks " << ks << ", mt " << mt;
                }
#endif
}

// Quantised rows (a quantised model's projections): the weights cross the ring as they are stored and each
// thread converts its A fragments in registers to the model's bf16 copy's values, so the products are the
// copy's: the same fp64 bound as bf16 rows, over every ring depth of both tile heights, K splits that leave
// ranks no stage, and rows that end inside a tile (whose scales must not be read). int4: K = 1088 ends in a
// short group (64 of 128), and K splits start ranks mid-group; zero points both stored and symmetric.
TEST(TileGemm, QuantisedRowsMatchTheFp64ProductOfTheirValues) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    cuda::tile_gemm_prepare();
    const std::vector<int> rows = {200, 72, 16};
    struct Case {
        WeightFormat f;
        bool zeros;
        const char* name;
    };
    for (const Case c : {Case{WeightFormat::kFp8, false, "FP8"}, Case{WeightFormat::kInt4, true, "int4"},
                         Case{WeightFormat::kInt4, false, "int4 symmetric"}})
        for (int K : {320, 1088})
            for (int n : {1, 17, 33, 64, 90, 96, 113, 128})
                for (int ks : {1, 2, 4, 8})
                    for (int mt : {1, 2}) {
                        const uint32_t seed = static_cast<uint32_t>(3 * K + n + ks + mt);
                        const double e = max_error(rows, K, n, ks, mt, seed, c.f, c.zeros);
                        EXPECT_LT(e, 1e-5)
                            << c.name << ", K " << K << ", " << n << " tokens, ks " << ks << ", mt " << mt;
                    }
#endif
}

#ifdef MARKBASE_HAS_CUDA
// A model at real widths (two layers, synthetic weights) under options o: the logits of a prompt chunk of 24
// and of a batched step of 20 sequences (prompts of 3-7 tokens in their slots).
struct ModelLogits {
    std::vector<float> chunk, step;
    int64_t V = 0;
};
constexpr int kModelSeqs = 20;
ModelLogits model_logits(const char* variant, BackendOptions o) {
    ModelLogits out;
    o.ctx_size = 128;
    o.chunk = 24;
    {
        auto one = make_synthetic_cuda_backend(variant, 2, o, 41);
        out.V = one->config().vocab_size;
        const std::vector<int> prompt = testing::random_ids(24, static_cast<int>(out.V), 5);
        out.chunk.resize(out.V);
        one->eval(prompt.data(), 24, out.chunk.data(), false);
    }
    o.slots = kModelSeqs;  // a backend's slots or its one sequence, not both
    auto b = make_synthetic_cuda_backend(variant, 2, o, 41);
    std::vector<int> order(kModelSeqs), in(kModelSeqs);
    for (int s = 0; s < kModelSeqs; ++s) {
        const std::vector<int> p = testing::random_ids(3 + s % 5, static_cast<int>(out.V), 100 + s);
        b->slot_reset(s);
        b->slot_eval(s, p.data(), static_cast<int64_t>(p.size()));
        order[s] = kModelSeqs - 1 - s;
        in[s] = (7 * s + 3) % static_cast<int>(out.V);
    }
    out.step.resize(kModelSeqs * out.V);
    b->decode_batch(order.data(), in.data(), kModelSeqs, out.step.data());
    return out;
}

// Two runs of one model whose products differ in kernels (so in summation order), not in values: the
// logits within the bf16 path's bound (CudaGemmInputs: 2e-2 of the range; a layer's input rounded to bf16
// can land on the neighbouring value either way), and not bit-identical (the kernel under test ran).
void expect_same_model(const ModelLogits& a, const ModelLogits& b, const char* what) {
    const double e = testing::rel_err(a.chunk, b.chunk);
    std::printf("  prompt chunk of 24, %s: rel err %.2e\n", what, e);
    EXPECT_LT(e, 2e-2) << "prompt chunk of 24";
    EXPECT_NE(a.chunk, b.chunk) << "bit-identical: the chunk did not run it";
    EXPECT_NE(a.step, b.step) << "bit-identical: the step did not run it";
    const int64_t V = a.V;
    for (int t = 0; t < kModelSeqs; ++t) {
        const std::vector<float> x(a.step.begin() + t * V, a.step.begin() + (t + 1) * V);
        const std::vector<float> y(b.step.begin() + t * V, b.step.begin() + (t + 1) * V);
        EXPECT_LT(testing::rel_err(x, y), 2e-2) << "batched row " << t;
    }
}
#endif

// The model both ways: tile_gemm (tile_gemm=128) against cuBLAS over the same bf16 operand (tile_gemm=0).
// With K = 64 both would sum in the same order, which is why tiny widths cannot tell. Not the 31B: every
// launch of its products is over tile_gemm_pays' 80 MB, so cuBLAS runs them all.
class TileGemmModel : public ::testing::TestWithParam<const char*> {};

TEST_P(TileGemmModel, MatchesCublasOverTheBf16Operand) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    BackendOptions o;
    o.tuning.tile_gemm = 0;
    const ModelLogits cublas = model_logits(GetParam(), o);
    o.tuning.tile_gemm = cuda::kTileGemmMaxN;
    expect_same_model(cublas, model_logits(GetParam(), o), "tile_gemm against cuBLAS");
#endif
}

// A model quantised on the device (FP8, int4): its projections of the chunk and the step through tile_gemm
// over the quantised rows (quant_tiles=1, wherever the kernel takes the shape) against the same model
// reading its bf16 copy (quant_tiles=0), which holds the rows' values: the 31B too (quantised rows go to
// tile_gemm at any size); then a chunk of 200 tokens, which takes them in slices.
using QuantModelCase = std::tuple<const char*, WeightFormat>;
class TileGemmQuantModel : public ::testing::TestWithParam<QuantModelCase> {};

TEST_P(TileGemmQuantModel, MatchesTheBf16Copy) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    const char* variant = std::get<0>(GetParam());
    BackendOptions o;
    o.weights = std::get<1>(GetParam());
    const ModelLogits copy = model_logits(variant, o);
    o.tuning.quant_tiles = true;
    expect_same_model(copy, model_logits(variant, o),
                      "quantised rows through tile_gemm against the bf16 copy");
    // a chunk of 200: the quantised rows in slices of 128 and 72 tokens, against cuBLAS over the copy
    std::vector<float> whole[2];
    for (int q = 0; q < 2; ++q) {
        o.tuning.quant_tiles = q == 1;
        o.ctx_size = 256;
        o.chunk = 200;
        auto b = make_synthetic_cuda_backend(variant, 2, o, 41);
        const int V = static_cast<int>(b->config().vocab_size);
        const std::vector<int> prompt = testing::random_ids(200, V, 9);
        whole[q].resize(V);
        b->eval(prompt.data(), 200, whole[q].data(), false);
    }
    const double e = testing::rel_err(whole[0], whole[1]);
    std::printf("  a chunk of 200 in slices, against the bf16 copy: rel err %.2e\n", e);
    EXPECT_LT(e, 2e-2) << "a chunk of 200";
    EXPECT_NE(whole[0], whole[1]) << "bit-identical: the chunk of 200 did not read the quantised rows";
#endif
}

std::string family_name(const ::testing::TestParamInfo<const char*>& p) {
    return testing::test_name(p.param);
}

INSTANTIATE_TEST_SUITE_P(Families, TileGemmModel, ::testing::Values("e2b", "e4b", "26b-a4b"), family_name);

std::string quant_case_name(const ::testing::TestParamInfo<QuantModelCase>& p) {
    return testing::test_name(std::get<0>(p.param)) +
           (std::get<1>(p.param) == WeightFormat::kInt4 ? "_int4" : "_fp8");
}
INSTANTIATE_TEST_SUITE_P(Families, TileGemmQuantModel,
                         ::testing::Combine(::testing::Values("e2b", "e4b", "26b-a4b", "31b"),
                                            ::testing::Values(WeightFormat::kFp8, WeightFormat::kInt4)),
                         quant_case_name);

TEST(TileGemm, ShapeRuleAndEligibility) {
#ifndef MARKBASE_HAS_CUDA
    GTEST_SKIP() << "built without CUDA";
#else
    EXPECT_TRUE(cuda::tile_gemm_fits(2056, 1536, 96)) << "any row count";
    EXPECT_TRUE(cuda::tile_gemm_fits(2048, 1536, cuda::kTileGemmMaxN));
    EXPECT_FALSE(cuda::tile_gemm_fits(2048, 1536, cuda::kTileGemmMaxN + 1)) << "too many tokens";
    EXPECT_FALSE(cuda::tile_gemm_fits(2048, 1504, 96)) << "K not a multiple of 64";
    EXPECT_FALSE(cuda::tile_gemm_fits(2048, 1536, 0));
    // the lab's K splits (H200, 132 SMs): few rows get 8, E2B's gate+up none
    const cuda::GemvSeg down{nullptr, nullptr, 1536, 0, {}, {}};
    const cuda::GemvSeg gate_up[2] = {{nullptr, nullptr, 12288, 0, {}, {}},
                                      {nullptr, nullptr, 12288, 0, {}, {}}};
    const cuda::GemvSeg qkv[3] = {{nullptr, nullptr, 2048, 0, {}, {}},
                                  {nullptr, nullptr, 256, 0, {}, {}},
                                  {nullptr, nullptr, 256, 0, {}, {}}};
    const cuda::GemvSeg lm{nullptr, nullptr, 262144, 0, {}, {}};
    const cuda::GemvSeg ple_proj{nullptr, nullptr, 1536, 0, {}, {}};
    EXPECT_EQ(cuda::tile_gemm_shape(gate_up, 2, 1536, 96, 132).ks, 1);
    EXPECT_EQ(cuda::tile_gemm_shape(&lm, 1, 1536, 8, 132).ks, 1);
    EXPECT_EQ(cuda::tile_gemm_shape(&down, 1, 12288, 8, 132).ks, 8);
    EXPECT_EQ(cuda::tile_gemm_shape(qkv, 3, 1536, 96, 132).ks, 8);
    EXPECT_EQ(cuda::tile_gemm_shape(&ple_proj, 1, 256, 8, 132).ks, 1) << "K = 256: 4 stages, no split";
    // where it pays, from the lab's timings
    const int64_t MB = int64_t{1} << 20;
    EXPECT_TRUE(cuda::tile_gemm_pays(int64_t{2} * 12288 * 1536 * 2, 2, 8, 132, gate_up))
        << "E2B gate+up at 8";
    const cuda::GemvSeg gate_up_31b[2] = {{nullptr, nullptr, 21504, 0, {}, {}},
                                          {nullptr, nullptr, 21504, 0, {}, {}}};
    EXPECT_FALSE(cuda::tile_gemm_pays(int64_t{2} * 21504 * 5376 * 2, 2, 16, 132, gate_up_31b))
        << "the 31B's launches (over 80 MB) lost in its step";
    EXPECT_FALSE(cuda::tile_gemm_pays(int64_t{1536} * 12288 * 2, 1, 8, 132, &down))
        << "E2B down at 8 (a tie: 12 tiles)";
    EXPECT_TRUE(cuda::tile_gemm_pays(int64_t{2} * 12288 * 1536 * 2, 2, 64, 132, gate_up))
        << "E2B gate+up at 64 (25.7 against 26.4)";
    EXPECT_FALSE(cuda::tile_gemm_pays(int64_t{2} * 12288 * 1536 * 2, 2, 96, 132, gate_up))
        << "E2B gate+up at 96 (27.5 against 26.9)";
    EXPECT_FALSE(cuda::tile_gemm_pays(int64_t{1536} * 2048 * 2, 1, 32, 132, &down))
        << "o_proj-sized single matrices past 16 tokens";
    EXPECT_TRUE(cuda::tile_gemm_pays(8 * MB, 3, 96, 132, qkv)) << "E2B q/k/v at 96 (10.9 against 15.0)";
    EXPECT_TRUE(cuda::tile_gemm_pays(int64_t{262144} * 1536 * 2, 1, 64, 132, &lm))
        << "lm_head at 64 (222 against 238)";
    EXPECT_FALSE(cuda::tile_gemm_pays(int64_t{262144} * 1536 * 2, 1, 96, 132, &lm))
        << "lm_head at 96 (254 against 236)";
    try {
        cuda::tile_gemm(&down, 1, nullptr, 96, 12288, {3}, nullptr);
        ADD_FAILURE() << "ks 3 accepted";
    } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("tile_gemm K split 3"), std::string::npos) << e.what();
    }
    try {
        cuda::tile_gemm(&down, 1, nullptr, 96, 12288, {1, 3}, nullptr);
        ADD_FAILURE() << "row tiles of 3 x 64 accepted";
    } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("row tiles of 3 x 64"), std::string::npos) << e.what();
    }
    cuda::GemvSeg int4 = down;
    int4.format = WeightFormat::kInt4;
    try {
        cuda::tile_gemm(&int4, 1, nullptr, 96, 12288, {}, nullptr);
        ADD_FAILURE() << "int4 rows without their bytes accepted";
    } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("int4, with their scales"), std::string::npos) << e.what();
    }
    cuda::GemvSeg no_scales = down;
    no_scales.format = WeightFormat::kFp8;
    no_scales.q.q = reinterpret_cast<const uint8_t*>(&no_scales);  // never read: the launch is refused
    try {
        cuda::tile_gemm(&no_scales, 1, nullptr, 96, 12288, {}, nullptr);
        ADD_FAILURE() << "FP8 rows without scales accepted";
    } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("FP8, with their scales"), std::string::npos) << e.what();
    }
#endif
}

}  // namespace
}  // namespace markbase
