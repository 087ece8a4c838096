// stream_gemm (cuda/kernels/stream_gemm.cu), the batched step's projections: every output of every launch
// shape (row tiles per block or per warp x K splits per cluster; the warps splitting K over both bf16 halves
// or the one bf16 operand, or splitting rows over the one operand) against an fp64 host product of the same
// operands and weights, with token counts that leave token tiles partly empty, matrices whose rows end inside
// a block's tiles, and three matrices in one launch; the shape rule and the eligibility checks on the host
// (no device).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "loading/checkpoint.h"
#include "loading/random_checkpoint.h"
#include "runtime/backend.h"
#include "support/device_arrays.h"
#include "support/device_segments.h"
#include "support/exact_options.h"
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
// Runs one launch over matrices of `rows` (K columns each) at n tokens with the given shape and checks every
// output against the fp64 product; the largest error relative to the row's sum of |x| |w|. one: the tokens
// are one bf16 operand (lo null), else both halves.
double max_error(const std::vector<int>& rows, int K, int n, cuda::StreamGemmShape shape, uint32_t seed,
                 bool one = false) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<uint16_t> hl(2 * static_cast<size_t>(n) * K);  // [n][K] hi, then [n][K] lo
    std::vector<double> x(static_cast<size_t>(n) * K);         // what the kernel sums: hi + lo
    for (size_t i = 0; i < x.size(); ++i) {
        const float v = u(rng);
        hl[i] = to_bf16(v);
        hl[x.size() + i] = one ? 0 : to_bf16(v - from_bf16(hl[i]));
        x[i] = double(from_bf16(hl[i])) + double(from_bf16(hl[x.size() + i]));
    }
    uint16_t* d_hl = to_device(hl);
    testing::DeviceSegments segs(rows, K, n, rng);
    cuda::stream_gemm(segs.segs(), segs.count(), d_hl, one ? nullptr : d_hl + x.size(), n, K, shape, nullptr);
    const double worst = segs.worst_error(x);
    cudaFree(d_hl);
    return worst;
}
#endif

TEST(StreamGemm, EveryShapeMatchesTheFp64Product) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    // q/k/v-like segments whose rows end inside a 64-row block (80 = 5 tiles of 16), K over several chunks
    // per warp and an uneven split (K = 1056 = 33 chunks)
    const std::vector<int> rows = {208, 80, 48};
    for (int K : {256, 1056})
        for (int n : {1, 5, 8, 13, 32, 64})
            for (int mt : {1, 2, 4})
                for (int ks : {1, 2, 4, 8}) {
                    if (mt * ((n + 7) / 8) > 16) continue;
                    const double e =
                        max_error(rows, K, n, {mt, ks}, static_cast<uint32_t>(K + n * 7 + mt * 3 + ks));
                    EXPECT_LT(e, 1e-5) << "K " << K << ", " << n << " tokens, mt " << mt << ", ks " << ks;
                }
#endif
}

TEST(StreamGemm, OneBf16OperandMatchesTheFp64Product) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    const std::vector<int> rows = {208, 80, 48};
    for (int K : {256, 1056})
        for (int n : {1, 3, 16, 40, 64})
            for (int mt : {1, 2, 4})
                for (int ks : {1, 4, 8}) {
                    if (mt * ((n + 7) / 8) > 16) continue;
                    const double e =
                        max_error(rows, K, n, {mt, ks}, static_cast<uint32_t>(K + n * 5 + mt + ks), true);
                    EXPECT_LT(e, 1e-5) << "K " << K << ", " << n << " tokens, mt " << mt << ", ks " << ks;
                }
#endif
}

TEST(StreamGemm, ShapeRuleAndEligibility) {
#ifndef MARKBASE_HAS_CUDA
    GTEST_SKIP() << "built without CUDA";
#else
    EXPECT_TRUE(cuda::stream_gemm_fits(2048, 1536, 8));
    EXPECT_FALSE(cuda::stream_gemm_fits(2048, 1536, cuda::kStreamGemmMaxN + 1)) << "too many tokens";
    EXPECT_FALSE(cuda::stream_gemm_fits(2056, 1536, 8)) << "rows not a multiple of 16";
    EXPECT_FALSE(cuda::stream_gemm_fits(2048, 1520, 8)) << "K not a multiple of 32";
    EXPECT_FALSE(cuda::stream_gemm_fits(2048, 1536, 0));
    // the rule on an H200 (132 SMs): few rows get a K split, many rows none; a block's accumulators stay
    // within 16 tiles
    const cuda::GemvSeg qkv[3] = {{nullptr, nullptr, 2048, 0, {}, {}},
                                  {nullptr, nullptr, 256, 0, {}, {}},
                                  {nullptr, nullptr, 256, 0, {}, {}}};
    const cuda::GemvSeg lm{nullptr, nullptr, 262144, 0, {}, {}};
    for (int n : {1, 8, 16, 32, 64}) {
        const cuda::StreamGemmShape a = cuda::stream_gemm_shape(qkv, 3, 1536, n, 132);
        const cuda::StreamGemmShape b = cuda::stream_gemm_shape(&lm, 1, 1536, n, 132);
        EXPECT_GT(a.ks, 1) << n;
        EXPECT_EQ(b.ks, 1) << n;
        EXPECT_LE(a.mt * ((n + 7) / 8), 16) << n;
        EXPECT_LE(b.mt * ((n + 7) / 8), 16) << n;
    }
    // where it pays, from the kernel lab's H200 timings at 8 and 16 tokens
    const int64_t MB = int64_t{1} << 20;
    EXPECT_TRUE(cuda::stream_gemm_pays(int64_t{2} * 12288 * 1536 * 2, 2, 8, false))
        << "E2B gate+up at 8 (25.4 us against 28.5)";
    EXPECT_FALSE(cuda::stream_gemm_pays(int64_t{2} * 12288 * 1536 * 2, 2, 16, false))
        << "E2B gate+up at 16 (33.8 against 30.0)";
    EXPECT_FALSE(cuda::stream_gemm_pays(int64_t{2} * 10240 * 2560 * 2, 2, 8, false))
        << "E4B gate+up at 8 (37.1 against 34.6)";
    EXPECT_FALSE(cuda::stream_gemm_pays(int64_t{5376} * 8192 * 2, 1, 8, false))
        << "31B o_proj (32.9 against 27.6)";
    EXPECT_TRUE(cuda::stream_gemm_pays(8 * MB, 3, 16, false)) << "E2B q/k/v at 16 (8.4 against 19.2)";
    // over the one bf16 operand: the single small matrices (tile_gemm takes the rest)
    EXPECT_TRUE(cuda::stream_gemm_pays(int64_t{1536} * 2048 * 2, 1, 8, true))
        << "E2B o_proj (4.1 against 4.6)";
    EXPECT_TRUE(cuda::stream_gemm_pays(int64_t{128} * 2816 * 2, 1, 8, true))
        << "26B-A4B router (3.9 against 4.6)";
    EXPECT_FALSE(cuda::stream_gemm_pays(int64_t{2560} * 2048 * 2, 1, 8, true)) << "E4B o_proj (10.5 MB)";
    EXPECT_FALSE(cuda::stream_gemm_pays(int64_t{2560} * 1536 * 2, 3, 8, true))
        << "E2B q/k/v (tile_gemm 4.8 against 7.6)";
    // bad shapes are refused before any launch
    try {
        cuda::stream_gemm(qkv, 3, nullptr, nullptr, 8, 1536, {3, 1}, nullptr);
        ADD_FAILURE() << "mt 3 accepted";
    } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("stream_gemm shape"), std::string::npos) << e.what();
    }
#endif
}

// The whole model both ways: a prompt through the prefill in chunks of at most 8 tokens (every projection a
// stream_gemm launch) and then one step of three sequences, against the same with stream_gemm=0 (cuBLAS
// over the stacked halves): logits within 1e-4 of the range, the same greedy ids, on every family.
TEST(StreamGemm, ModelMatchesTheCublasProjections) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    for (const std::string family : {"e2b", "e4b", "26b-a4b", "31b"}) {
        SCOPED_TRACE(family);
        testing::TempDir dir("stream-gemm-" + family);
        write_random_checkpoint(dir.path(), testing::tiny_config(family), 31);
        auto ck = load_checkpoint(dir.path());
        const int64_t V = ck->config.vocab_size;
        const std::vector<std::vector<int>> prompts = {
            testing::random_ids(5, 256, 1), testing::random_ids(21, 256, 2), testing::random_ids(13, 256, 3)};
        std::vector<std::vector<float>> lg[2];
        std::vector<float> step[2];
        for (int sg = 0; sg < 2; ++sg) {
            BackendOptions o = testing::exact_options();
            o.ctx_size = 128;
            o.chunk = 8;
            o.slots = 3;
            o.tuning.stream_gemm = sg ? cuda::kStreamGemmMaxN : 0;
            o.kv_dtype = KvDtype::kF32;  // the exact cache: the projections' difference, not bf16 rounding's
            auto b = make_cuda_backend(*ck, o);
            std::vector<int> last(3);
            for (int s = 0; s < 3; ++s) {
                b->slot_reset(s);
                b->slot_eval(s, prompts[s].data(), static_cast<int64_t>(prompts[s].size()) - 1);
                last[s] = prompts[s].back();
            }
            const std::vector<int> order = {2, 0, 1};
            const std::vector<int> in = {last[2], last[0], last[1]};
            step[sg].resize(3 * V);
            b->decode_batch(order.data(), in.data(), 3, step[sg].data());
            // one prompt alone, its logits after each chunk
            b->reset();
            const std::vector<int> p = testing::random_ids(19, 256, 4);
            for (int at = 0; at < 19; at += 8) {
                std::vector<float> l(V);
                const int n = std::min(8, 19 - at);
                b->eval(p.data() + at, n, l.data(), false);
                lg[sg].push_back(l);
            }
        }
        for (size_t c = 0; c < lg[0].size(); ++c)
            EXPECT_LT(testing::rel_err(lg[0][c], lg[1][c]), 1e-4) << "prompt chunk " << c;
        for (int t = 0; t < 3; ++t) {
            const std::vector<float> a(step[0].begin() + t * V, step[0].begin() + (t + 1) * V);
            const std::vector<float> b(step[1].begin() + t * V, step[1].begin() + (t + 1) * V);
            EXPECT_LT(testing::rel_err(a, b), 1e-4) << "batched row " << t;
            EXPECT_EQ(std::max_element(a.begin(), a.end()) - a.begin(),
                      std::max_element(b.begin(), b.end()) - b.begin())
                << "batched row " << t;
        }
    }
#endif
}

}  // namespace
}  // namespace markbase
