// Which warp-per-row kernel each decode product of the four models launches on one H200 (132 SMs) with the
// one-GPU defaults (step.cu's gemv_input): the rules the H200 A/Bs chose, checked on the host, so a
// change that moves a product to another kernel fails here before any GPU run. No device is needed.
#include <gtest/gtest.h>

#include <cstdint>

#ifdef MARKBASE_HAS_CUDA
#include "cuda/kernels/kernels.h"
#endif

namespace markbase {
namespace {

#ifdef MARKBASE_HAS_CUDA
using cuda::GemvInput;
using cuda::RowsPlan;
using cuda::RowsProduct;

constexpr int kH200Sms = 132;

// One GPU's settings: min_waves 3 and the split GeGLU; the input already normalised by the update before
// (prenorm), so no norm in the product.
GemvInput one_gpu(int K) {
    GemvInput in;
    in.kernel = cuda::GemvKernel::kRows;
    in.min_waves = 3;
    in.geglu_split = true;
    in.K = K;
    return in;
}

RowsPlan plan(RowsProduct p, int64_t rows, int K) {
    return cuda::gemv_rows_plan(p, one_gpu(K), rows, kH200Sms);
}

void expect_plan(const RowsPlan& got, int warps, int chunks, bool lean, bool split, const char* what) {
    EXPECT_EQ(got.warps, warps) << what;
    EXPECT_EQ(got.chunks, chunks) << what;
    EXPECT_EQ(got.lean, lean) << what;
    EXPECT_EQ(got.split, split) << what;
}
#endif

TEST(GemvRowsPlan, NarrowProductsRunTheLeanKernelAtFourChunks) {
#ifndef MARKBASE_HAS_CUDA
    GTEST_SKIP() << "built without CUDA";
#else
    // E2B: K = 1536 and 2048 are at most 2048 (gemv_rows_plan.cu's kU4MaxK)
    expect_plan(plan(RowsProduct::kPlain, 2560, 1536), 2, 4, true, false, "E2B q/k/v");
    expect_plan(plan(RowsProduct::kPlain, 1536, 2048), 2, 4, true, false, "E2B o_proj (sliding)");
    expect_plan(plan(RowsProduct::kGeluMul, 256, 1536), 2, 4, true, false, "E2B PLE gate");
    expect_plan(plan(RowsProduct::kPlain, 1536, 256), 1, 4, true, false, "E2B PLE projection");
    // the GeGLU at 4 chunks per lane is neither split (+7.5% on E2B) nor lean
    expect_plan(plan(RowsProduct::kGeglu, 6144, 1536), 2, 4, false, false, "E2B gate/up");
    // with the input norm folded in (sharded models) the lean kernel does not apply
    GemvInput normed = one_gpu(1536);
    normed.norm = true;
    expect_plan(cuda::gemv_rows_plan(RowsProduct::kPlain, normed, 2560, kH200Sms), 2, 4, false, false,
                "E2B q/k/v with the norm");
#endif
}

TEST(GemvRowsPlan, LeanEightAppliesBelowEightWarpsPerRow) {
#ifndef MARKBASE_HAS_CUDA
    GTEST_SKIP() << "built without CUDA";
#else
    // sized for 8 chunks per lane, run by the lean kernel at 4 with the same warps per row
    expect_plan(plan(RowsProduct::kPlain, 3072, 2560), 2, 4, true, false, "E4B q/k/v");
    expect_plan(plan(RowsProduct::kPlain, 2560, 4096), 2, 4, true, false, "E4B o_proj (full)");
    expect_plan(plan(RowsProduct::kPlain, 1536, 6144), 4, 4, true, false, "E2B down");
    expect_plan(plan(RowsProduct::kPlain, 2816, 8192), 4, 4, true, false, "26B-A4B o_proj (full)");
    // min_waves cuts the 31B's wide products to 4 and then 1 warps per row: still lean at 4 chunks (+0.8%
    // on the 31B at 8)
    expect_plan(plan(RowsProduct::kPlain, 5376, 21504), 4, 4, true, false, "31B down");
    expect_plan(plan(RowsProduct::kPlain, 5376, 16384), 4, 4, true, false, "31B o_proj (full)");
    expect_plan(plan(RowsProduct::kPlain, 16384, 5376), 1, 4, true, false, "31B q/k/v");
    // at 8 warps per row the 8-chunk kernel streams a warp's share in one round (E4B -1.2%)
    expect_plan(plan(RowsProduct::kPlain, 2560, 10240), 8, 8, false, false, "E4B down");
    expect_plan(plan(RowsProduct::kPlain, 1536, 12288), 8, 8, false, false, "E2B down (double-wide)");
#endif
}

TEST(GemvRowsPlan, TheSplitGegluIsLeanFromK4096) {
#ifndef MARKBASE_HAS_CUDA
    GTEST_SKIP() << "built without CUDA";
#else
    // below K = 4096 the split GeGLU keeps 8 chunks per lane (E4B +1.3% with the lean one)
    expect_plan(plan(RowsProduct::kGeglu, 10240, 2560), 2, 8, false, true, "E4B gate/up");
    expect_plan(plan(RowsProduct::kGeglu, 2112, 2816), 2, 8, false, true, "26B-A4B dense gate/up");
    // the 31B (K = 5376): min_waves leaves one warp per row's gate (and one for its up), the lean split
    // kernel
    expect_plan(plan(RowsProduct::kGeglu, 21504, 5376), 1, 4, true, true, "31B gate/up");
    // the split never takes more than 4 warps per row's gate: a row's 2W warps fit a block
    GemvInput wide = one_gpu(16384);
    wide.min_waves = 0;
    const RowsPlan w = cuda::gemv_rows_plan(RowsProduct::kGeglu, wide, 1024, kH200Sms);
    EXPECT_TRUE(w.split);
    EXPECT_EQ(w.warps, 4);
#endif
}

TEST(GemvRowsPlan, ForcedWarpsAndTheRanks) {
#ifndef MARKBASE_HAS_CUDA
    GTEST_SKIP() << "built without CUDA";
#else
    GemvInput forced = one_gpu(2560);
    forced.force_warps = 4;  // the kernel lab's sweep
    EXPECT_EQ(cuda::gemv_rows_plan(RowsProduct::kPlain, forced, 3072, kH200Sms).warps, 4);
    // the ranks' settings: no min_waves, no split GeGLU
    GemvInput rank = one_gpu(5376);
    rank.min_waves = 0;
    rank.geglu_split = false;
    expect_plan(cuda::gemv_rows_plan(RowsProduct::kGeglu, rank, 10752, kH200Sms), 4, 8, false, false,
                "31B gate/up on a rank");
#endif
}

}  // namespace
}  // namespace markbase
