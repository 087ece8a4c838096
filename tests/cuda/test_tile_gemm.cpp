// tile_gemm (cuda/kernels/tile_gemm.cu), a serving step's projections over the one bf16 operand: every
// output of every K split against an fp64 host product of the same operands, with token counts that leave
// 16-token tiles partly empty, matrices whose rows end inside a 128-row tile, K ranges that leave a rank no
// stage, and three matrices in one launch; then the model both ways at real widths (tile_gemm=128 against
// cuBLAS over the same operand) on every family; the shape rule and the eligibility checks on the host.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
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
// mt x 64; the largest error of any output against the fp64 product, relative to the row's sum of |x| |w|.
double max_error(const std::vector<int>& rows, int K, int n, int ks, int mt, uint32_t seed) {
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

// The model both ways at real widths (two layers, synthetic weights): a prompt chunk of 24 and a batched step
// of 20 sequences with tile_gemm (tile_gemm=128) against cuBLAS over the same bf16 operand (tile_gemm=0).
// The two sum in different orders (q/k/v's K split across 8 blocks), and a layer's input rounded to bf16 can
// land on the neighbouring value (2^-8 relative) either way, so the logits agree to the bf16 path's bound
// (CudaGemmInputs: 2e-2 of the range), not to fp32 rounding; and they must not be bit-identical (so tile_gemm
// ran: with K = 64 both would sum in the same order, which is why tiny widths cannot tell). Not the 31B:
// every launch of its products is over tile_gemm_pays' 80 MB, so cuBLAS runs them all.
class TileGemmModel : public ::testing::TestWithParam<const char*> {};

TEST_P(TileGemmModel, MatchesCublasOverTheBf16Operand) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    constexpr int kSeqs = 20;
    std::vector<float> chunk[2], step[2];
    int64_t V = 0;
    for (int tile = 0; tile < 2; ++tile) {
        BackendOptions o;
        o.ctx_size = 128;
        o.chunk = 24;
        o.tuning.tile_gemm = tile ? cuda::kTileGemmMaxN : 0;
        {
            auto one = make_synthetic_cuda_backend(GetParam(), 2, o, 41);
            V = one->config().vocab_size;
            const std::vector<int> prompt = testing::random_ids(24, static_cast<int>(V), 5);
            chunk[tile].resize(V);
            one->eval(prompt.data(), 24, chunk[tile].data(), false);
        }
        o.slots = kSeqs;  // a backend's slots or its one sequence, not both
        auto b = make_synthetic_cuda_backend(GetParam(), 2, o, 41);
        std::vector<int> order(kSeqs), in(kSeqs);
        for (int s = 0; s < kSeqs; ++s) {
            const std::vector<int> p = testing::random_ids(3 + s % 5, static_cast<int>(V), 100 + s);
            b->slot_reset(s);
            b->slot_eval(s, p.data(), static_cast<int64_t>(p.size()));
            order[s] = kSeqs - 1 - s;
            in[s] = (7 * s + 3) % static_cast<int>(V);
        }
        step[tile].resize(kSeqs * V);
        b->decode_batch(order.data(), in.data(), kSeqs, step[tile].data());
    }
    const double e = testing::rel_err(chunk[0], chunk[1]);
    std::printf("  %s prompt chunk of 24, tile_gemm against cuBLAS: rel err %.2e\n", GetParam(), e);
    EXPECT_LT(e, 2e-2) << "prompt chunk of 24";
    EXPECT_NE(chunk[0], chunk[1]) << "bit-identical: the chunk did not run tile_gemm";
    EXPECT_NE(step[0], step[1]) << "bit-identical: the step did not run tile_gemm";
    for (int t = 0; t < kSeqs; ++t) {
        const std::vector<float> a(step[0].begin() + t * V, step[0].begin() + (t + 1) * V);
        const std::vector<float> b(step[1].begin() + t * V, step[1].begin() + (t + 1) * V);
        EXPECT_LT(testing::rel_err(a, b), 2e-2) << "batched row " << t;
    }
#endif
}

std::string family_name(const ::testing::TestParamInfo<const char*>& p) {
    return testing::test_name(p.param);
}

INSTANTIATE_TEST_SUITE_P(Families, TileGemmModel, ::testing::Values("e2b", "e4b", "26b-a4b"), family_name);

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
#endif
}

}  // namespace
}  // namespace markbase
