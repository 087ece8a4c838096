// What the warp-per-row GEMV kernels (gemv_rows.cu) and their plan (gemv_rows_plan.cu) share. (In an
// unnamed namespace, as when they were one file.)
#pragma once

namespace markbase::cuda {

namespace {

constexpr int kWarps = 8;  // warps per block
constexpr int kU = 8;      // 16-byte chunks per lane in flight per matrix

}  // namespace

}  // namespace markbase::cuda
