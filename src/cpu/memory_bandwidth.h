// The machine's own ceilings, measured: decode GB/s is reported as a share of these.
#pragma once

#include <cstddef>

#include "cpu/thread_pool.h"

namespace markbase::cpu {

struct BandwidthResult {
    double read_gbs = 0;  // 1e9 bytes per second, median of the timed passes
    double bytes = 0;     // bytes read per pass
    int threads = 0;      // pool size used
};

// Every thread of the pool sums its contiguous slice of a freshly written buffer of `bytes` bytes (choose it
// far larger than the last-level cache), once as one sequential stream and once as 16 neighbouring rows side
// by side; one untimed pass of each, then the faster of the two medians of 5 timed passes.
BandwidthResult measure_read_bandwidth(ThreadPool& pool, size_t bytes = size_t{1} << 30);

// The fp32 multiply-add ceiling of the instruction set matmul_bf16 runs (matmul_simd_path()), all threads of
// the pool at once: each runs independent FMA chains for ~0.1 s; the sum of their rates, GFLOP/s (2 per
// multiply-add), median of 3 passes. Prefill GFLOP/s is reported as a share of it.
double measure_fma_peak_gflops(ThreadPool& pool);

// The same for the unit the bf16 prompt products run on (AMX tiles, or vdpbf16ps: 4 flops a lane); 0 where
// this CPU has none (matmul.h bf16_products_supported).
double measure_bf16_peak_gflops(ThreadPool& pool);

// A lab bench, not a test: prints the read bandwidth, GEMV (n = 1) GB/s and % of it at 2816x2816, 21504x5376
// and 262144x1536 (lm_head-like, ~800 MB), and prefill GFLOP/s at n = 128 for 2048x2048. Allocates about 1
// GB.
void run_matmul_bench(ThreadPool& pool);

}  // namespace markbase::cpu
