// The row work behind FP8 weights at load (loading/fp8_checkpoint.h): quantising bf16 rows, gathering
// published FP8 rows into the fused expert layout, and dequantising every FP8 row to the bf16 the bf16 slots
// read. A 31B checkpoint holds 30 G weights, so the rows of all matrices are cut into pieces of about a
// million weights and shared by one thread per core.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/bf16.h"

namespace markbase {

// One matrix's rows [rows, K]. Either src is set (quantise each row into q_out and scale), or parts holds the
// published FP8 rows, part_rows per pointer (a plain matrix: one part; experts: one per expert's tensor),
// copied into q_out when it is set (the gathered experts) and read in place when it is not. Every row is
// then dequantised into out.
struct RowJob {
    std::string name;  // the tensor, for the non-finite report
    std::string file;
    int64_t rows = 0, K = 0;
    const bf16* src = nullptr;
    std::vector<const uint8_t*> parts;
    int64_t part_rows = 0;
    uint8_t* q_out = nullptr;
    float* scale = nullptr;  // [rows]: written when src is set, else read
    bf16* out = nullptr;     // [rows, K]
};

// Runs every job on `threads` threads (0: one per core). Returns one line per job whose dequantised values
// hold NaN or Inf (a NaN code 0x7f/0xff, an infinite scale, or a non-finite bf16 weight quantised), e.g.
// "<file>: tensor <name>: 3 of 4096 values not finite after FP8 dequantisation (first at index 17)".
std::vector<std::string> run_row_jobs(const std::vector<RowJob>& jobs, int threads = 0);

}  // namespace markbase
