// Matrix products of the CPU backend: activations in fp32, weights in the checkpoint's bf16 (HF Linear
// layout, [out][in] row-major), accumulation in fp32.
//
// Two regimes (see matmul.cpp): decode and short batches stream each weight row straight from bf16 in dot-
// product tiles (decode is a memory problem: rows are split over the threads in contiguous blocks); prompts
// transpose x once, widen blocks of 6 weight rows to fp32 and sweep them over tiles of 64 tokens as outer
// products, the tokens in the vector lanes (prefill is a compute problem; matmul_kernels.h).
//
// The kernels (matmul_kernels.h) are compiled once per SIMD path: scalar everywhere, AVX2 and AVX-512 on
// x86-64 whatever the build's -march. The best path this CPU runs is chosen at run time, once.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/thread_pool.h"
#include "model/bf16.h"

namespace markbase::cpu {

// What a prompt's products (the blocked regime: past ~48 tokens at real widths) take of x. kExact: fp32 x,
// each product exact and summed in fp32 (the reference the goldens hold). kBf16: x rounded to bf16 (nearest
// even) once, multiplied on a bf16 unit (AMX tiles, else vdpbf16ps; elsewhere kExact, as for widths the unit
// cannot take): what llama.cpp computes for a bf16 model and what transformers computes in bf16; the CUDA
// backend's
// prompt products do the same (runtime/tuning.h gemm_inputs, which selects both). Decode and short batches
// (the direct regime) are exact either way.
enum class PromptProducts : uint8_t { kExact, kBf16 };

// y[t][o] = sum_i x[t][i] * w[o][i]
//   x: fp32 [n][in], w: bf16 [out][in], y: fp32 [n][out]; all row-major and dense. y must not alias x.
void matmul_bf16(ThreadPool& pool, const float* x, int64_t n, int64_t in, const bf16* w, int64_t out,
                 float* y, PromptProducts products = PromptProducts::kExact);

// Whether kBf16 runs the bf16 products on this CPU: on the AMX tile unit where the CPU has AMX-BF16 (and
// the kernel grants the process its tile state), else on vdpbf16ps where it has AVX-512-BF16.
bool bf16_products_supported();

// Whether they are also the faster ones here: that unit's measured flops at least 1.5x the fp32 FMA's on one
// thread (timed once, ~1 ms). Zen 4 and 5 run vdpbf16ps at the FMA's rate, two products a lane:
// ~2x (a Zen 5 VM: 452 against 227 GFLOP/s a thread, E2B's products 1.9x). The H200 host's Xeon (Sapphire
// Rapids class) runs it at a quarter of the FMA's instructions: 1,206 against 2,505 GFLOP/s on 16 threads,
// and a bf16 prefill of 512 tokens 182 against the exact products' 223 tok/s. The backends' default
// (prompt_products in cpu/forward.h) takes the bf16 products only where this holds.
bool bf16_products_faster();

// The same product with every row of y bit-identical to that row computed alone (n = 1), whatever n is: the
// direct kernel at every n, whose arithmetic per output does not depend on the tile it falls in (the blocked
// one sums k in blocks, so a row's bits would change with n). The CPU slots' batched decode runs on it, so
// that a sequence's logits do not depend on its neighbours in the step. Past ~32 rows the blocked kernel
// would be faster (matmul.cpp).
void matmul_bf16_rowwise(ThreadPool& pool, const float* x, int64_t n, int64_t in, const bf16* w, int64_t out,
                         float* y);

// The same for an fp32 weight [out][in].
void matmul_f32(ThreadPool& pool, const float* x, int64_t n, int64_t in, const float* w, int64_t out,
                float* y);

// Attention's products over a block of queries (cpu/attention.cpp); each result is the same whatever m and nk
// (a query's row does not depend on the others in its block). k and v hold one pointer per key row.
// s[i * lds + j] = q_i . k_j for i < m, j < nk (q_i at q + i * ldq), fp32, one accumulator a pair.
void attn_scores(const float* q, int64_t ldq, int m, const float* const* k, int nk, int64_t d, float* s,
                 int64_t lds);
// out[i * ldo + u] = sum_j p[i * ldp + j] * v[j][u] for i < m, u < d: one multiply-add per key, j ascending
// (fused on the SIMD paths), so a zero weight changes nothing where the value row is finite.
void attn_values(const float* p, int64_t ldp, int m, const float* const* v, int nk, int64_t d, float* out,
                 int64_t ldo);

// The best path's multiply-add ceiling loop on the calling thread (cpu/memory_bandwidth.h times it): `rounds`
// rounds of independent fp32 FMAs; returns the flops done.
double fma_peak_rounds(int64_t rounds);
// The same for the unit the bf16 products run on (AMX or vdpbf16ps); 0 where bf16_products_supported() is
// false.
double bf16_peak_rounds(int64_t rounds);

// The unit kBf16 runs on here: "amx", "avx512bf16" or "none".
const char* bf16_products_unit();

// The units the bf16 products can run on. kAmxModel is a scalar model of the AMX unit running the AMX tile
// loop (matmul_pairs.h): for the tests, on every CPU; never chosen.
enum class PairPath { kDot, kAmx, kAmxModel };
const char* pair_path_name(PairPath path);
// The paths this build and CPU run (kAmxModel always).
std::vector<PairPath> supported_pair_paths();
// The bf16 products on that path at any n (in a multiple of 2 for kDot, of 32 for the AMX loop); throws
// markbase::Error where the path does not run or cannot take in.
void matmul_bf16_pairs_on(PairPath path, ThreadPool& pool, const float* x, int64_t n, int64_t in,
                          const bf16* w, int64_t out, float* y);

// The SIMD paths, in increasing preference. Avx2 needs AVX2 and FMA; Avx512 AVX-512 F, BW and VL (and AVX2,
// FMA).
enum class SimdPath { Scalar, Avx2, Avx512 };

// "scalar", "avx2", "avx512" ("unknown" for a value out of the enum).
const char* simd_path_name(SimdPath path);

// The paths this build has compiled in and this CPU runs, in increasing preference; Scalar always.
std::vector<SimdPath> supported_simd_paths();

// The last of supported_simd_paths(): what matmul_bf16, matmul_f32 and attn_scores / attn_values run.
SimdPath best_simd_path();

// The name of the path matmul_bf16 / matmul_f32 / attn_scores / attn_values run, as the kernels' own TU
// spells it.
const char* matmul_simd_path();

// matmul_bf16 / matmul_bf16_rowwise / matmul_f32 / attn_scores / attn_values on the given path (the tests run
// every supported path). Throw markbase::Error when the path is not compiled into this build or this CPU
// cannot run it.
void matmul_bf16_on(SimdPath path, ThreadPool& pool, const float* x, int64_t n, int64_t in, const bf16* w,
                    int64_t out, float* y);
void matmul_bf16_rowwise_on(SimdPath path, ThreadPool& pool, const float* x, int64_t n, int64_t in,
                            const bf16* w, int64_t out, float* y);
void matmul_f32_on(SimdPath path, ThreadPool& pool, const float* x, int64_t n, int64_t in, const float* w,
                   int64_t out, float* y);
void attn_scores_on(SimdPath path, const float* q, int64_t ldq, int m, const float* const* k, int nk,
                    int64_t d, float* s, int64_t lds);
void attn_values_on(SimdPath path, const float* p, int64_t ldp, int m, const float* const* v, int nk,
                    int64_t d, float* out, int64_t ldo);

// The name compiled into the kernels that path runs ("avx2" for Avx2 unless the dispatch is wrong); throws
// as the functions above do.
const char* matmul_kernels_name(SimdPath path);

}  // namespace markbase::cpu
