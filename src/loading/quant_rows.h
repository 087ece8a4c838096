// The row work behind quantised weights at load (loading/quant_checkpoint.h), FP8 or int4: quantising bf16
// rows, gathering published rows into the fused expert layout, and dequantising every row to the bf16 the
// bf16 slots read. A 31B checkpoint holds 30 G weights, so the rows of all matrices are cut into pieces of
// about a million weights and shared by one thread per core.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/bf16.h"
#include "model/weights.h"

namespace markbase {

// One matrix's rows [rows, K] in `format` (kFp8: model/fp8.h, a byte a weight and a scale per row; kInt4:
// model/int4.h, half a byte a weight and a scale, and maybe a zero point, per group of 128). Either src is
// set (quantise each row into q_out, scale and, int4 with zero set, zero points: asymmetric), or parts holds
// the published rows, part_rows per pointer (a plain matrix: one part; experts: one per expert's tensor),
// copied into q_out when it is set (the gathered experts) and read in place when it is not. Every row is then
// dequantised into out.
struct RowJob {
    WeightFormat format = WeightFormat::kFp8;
    std::string name;  // the tensor, for the non-finite report
    std::string file;
    int64_t rows = 0, K = 0;
    const bf16* src = nullptr;
    std::vector<const uint8_t*> parts;
    int64_t part_rows = 0;
    // Bytes from one published row to the next (0: row_bytes). int4 rows are whole int32 words, so a K that
    // is not a multiple of 8 pads them.
    int64_t part_stride = 0;
    uint8_t* q_out = nullptr;  // [rows, row_bytes]
    float* scale = nullptr;    // [rows, scales_per_row]: written when src is set, else read
    uint8_t* zero = nullptr;   // int4: [rows, groups] zero points, or null (symmetric)
    bf16* out = nullptr;       // [rows, K]
};

// Bytes of one row of K weights in the format's layout, and its scales.
int64_t quant_row_bytes(WeightFormat f, int64_t K);
int64_t quant_scales_per_row(WeightFormat f, int64_t K);

// Runs every job on `threads` threads (0: one per core). Returns one line per job whose dequantised values
// hold NaN or Inf (an FP8 NaN code 0x7f/0xff, an infinite scale, or a non-finite bf16 weight quantised), e.g.
// "<file>: tensor <name>: 3 of 4096 values not finite after FP8 dequantisation (first at index 17)".
std::vector<std::string> run_row_jobs(const std::vector<RowJob>& jobs, int threads = 0);

}  // namespace markbase
