// Which warp-per-row kernel each decode product runs (gemv_rows_plan, kernels.h): warps per row, chunks per
// lane, the split GeGLU and the lean kernel, as the H200 A/Bs chose them. Host code only; checked for every
// model's products without a GPU (tests/cuda/test_gemv_rows_plan.cpp).
#include <algorithm>

#include "cuda/kernels/gemv_rows.cuh"
#include "cuda/kernels/kernels.h"

namespace markbase::cuda {

namespace {

constexpr int kMinWavesMinK = 4096;  // GemvInput.min_waves applies from this input width
// Products whose K is at most this stream 4 16-byte chunks per lane per matrix instead of 8, with twice the
// warps per row (the GeGLU at 3 blocks per SM instead of 2). The H200 A/B: E2B -1.7% (plain products) and
// -3.6% (GeGLU, K = 1536); wider settings lost 2.4-5.4% on the 26B-A4B and the 31B.
constexpr int kU4MaxK = 2048;

// Warps per row: enough that each warp streams about one batch of U chunks per lane (one
// dependent load round), at most 8.
int warps_per_row(int K, int U = kU) {
    const int rounds = (K / 8 + 32 * U - 1) / (32 * U);
    int w = 1;
    while (w < rounds && w < 8) w <<= 1;
    return w;
}

}  // namespace

RowsPlan gemv_rows_plan(RowsProduct product, const GemvInput& in, int64_t rows, int sms) {
    const bool geglu = product == RowsProduct::kGeglu;
    RowsPlan plan;
    // 4 chunks per lane where K is narrow (kU4MaxK), else 8
    const bool u4 = in.K <= kU4MaxK;
    int w = warps_per_row(in.K, u4 ? 4 : kU);
    // The H200 A/B: at 4 chunks per lane (E2B's GeGLU, K = 1536) the split GeGLU cost +7.5% and the
    // fewer warps per row +1.4%, so both apply to the launches at 8 only.
    const bool split = geglu && in.geglu_split && !u4;
    // With the prenormed input: on E4B (K = 2560, its GeGLU 2 -> 1 warps per row) min_waves costs
    // +1.7%, on the 31B (K = 5376 and wider) it still gains, so it applies from K = 4096 (two full rounds of
    // 8 chunks per lane at one warp per row).
    if (in.min_waves > 0 && !u4 && in.K >= kMinWavesMinK) {  // fewer warps per row, >= min_waves waves
        const int64_t per_sm = geglu && !split ? 2 : 4;
        const int64_t slots = per_sm * sms;
        auto blocks = [&](int ww) {
            const int64_t row_warps = split ? 2 * ww : ww;
            return (rows * row_warps + kWarps - 1) / kWarps;
        };
        while (w > 1 && blocks(w / 2) >= in.min_waves * slots) w /= 2;
    }
    if (in.force_warps > 0) w = in.force_warps;
    plan.warps = w;
    plan.chunks = u4 ? 4 : kU;
    if (geglu) {
        if (split) {
            // the same W as kGeglu's (the sums identical while W <= 4; a row's 2W warps fit a block)
            // The split launch sized for 8 chunks per lane runs the lean split kernel at 4 (40 registers, 6
            // blocks per SM instead of 64 and 4), at the same W: the same sums. From K = 4096 (the H200 A/B:
            // the 31B's K = 5376 -0.6%, and +0.7% without it; E4B's K = 2560 +1.3% with it).
            plan.split = true;
            plan.warps = std::min(w, 4);
            plan.lean = !in.norm && in.K >= kMinWavesMinK;
            if (plan.lean) plan.chunks = 4;
        }
        return plan;
    }
    // The lean kernel is compiled at 4 chunks per lane only: at 8, without the norm, ptxas still holds 62-64
    // registers (and spills at 6 or 5 blocks per SM: 8 chunks in flight are 32 registers of weights). A
    // launch sized for 8 (its W) runs the lean kernel at 4 instead (the H200 A/B: 26B-A4B -4.4%, E2B -1.3%,
    // 31B -0.9%); each lane adds its chunks c_lo + lane + 32 j in the same order at any U, so the sums are
    // the same. Not at 8
    // warps per row (K > 8192 with too few rows for min_waves to cut W: E4B's down at K = 10240, E2B's
    // double-wide down at 12288), where a warp's share of the row is one round of 8 chunks per lane (up to
    // K = 16384) but two at 4: the H200 A/B with those two on the 8-chunk kernel measured E4B -1.2%
    // and E2B -0.1% (the kernel lab: E4B's down 17.1 -> 15.5 us), while moving the 31B's wide products (at 4
    // warps per row) to 8 chunks as well cost it +0.8%.
    const bool lean = !in.norm;
    if (u4) {
        plan.lean = lean;
    } else if (lean && w < 8) {
        plan.lean = true;
        plan.chunks = 4;
    }
    return plan;
}

}  // namespace markbase::cuda
