// Launchers of the MoE's kernels (kernels.h's conventions: device pointers, enqueued on `s`, launches
// checked): routing and bucketing (moe.cu), the experts of a batched step (moe_stream.cu), of one decode
// token (moe.cu) and of a prefill chunk (moe_gemm.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "model/bf16.h"
#include "model/weights.h"

namespace markbase::cuda {

// ---- moe.cu: routing and the selected experts, no host in the loop ----------------------------------------
// The experts a rank holds (expert parallelism): global ids [begin, begin + count); a group whose expert is
// elsewhere gets group_expert -1, and the expert kernels write zeros for its entries. count < 0: all of them.
struct ExpertRange {
    int begin = 0, count = -1;
};
// logits [n][E] -> per token top-K of softmax(all E), renormalised, times per_expert_scale.
// Writes sel_id/sel_w [n][K]. When groups_for_slots (n == 1), also writes the K expert groups directly
// (group_expert = the expert's index among the held ones).
// Also the experts' input: e_in[t] = RMSNorm(x[t]) * norm_w (pre_feedforward_layernorm_2), H wide.
void moe_route(const float* logits, int n, int E, int K, const bf16* per_expert_scale, int* sel_id,
               float* sel_w, bool groups_for_slots, int* group_expert, int* group_off, int* entries,
               const float* x, const bf16* norm_w, int H, float eps, float* e_in, cudaStream_t s,
               ExpertRange held = {}, bool wide = false);
// (E <= 256, K <= 32: the top K by every expert's rank in one pass. wide (decode: n == 1, H <= 4096): 1024
// threads, x and the logits loaded in one batch, the logits through shared memory.)
// Prefill: group the n*K (token, slot) entries by expert: group g = expert g, entries[group_off[g] ...].
void moe_bucket(const int* sel_id, int n, int E, int K, int* group_expert, int* group_off, int* entries,
                cudaStream_t s, ExpertRange held = {});
// e[t] = sum_k sel_w[t][k] * slots[t*K + k] (H wide): a rank's share of the experts' weighted sum, which the
// tensor-parallel step all-reduces before residual_moe_combine's norms.
void moe_weighted_sum(const float* slots, const float* sel_w, int K, int H, int n, float* e, cudaStream_t s);
// h[entry][j] = gelu(gate_e[j] . x[entry / K]) * (up_e[j] . x[entry / K]) for each group's entries.
void moe_gate_up(const float* x, int H, const bf16* gate_up, int Ie, int K, const int* group_expert,
                 const int* group_off, const int* entries, int n_groups, float* h, cudaStream_t s);
// slots[entry][j] = down_e[j] . h[entry]
void moe_down(const float* h, int Ie, const bf16* down, int H, const int* group_expert, const int* group_off,
              const int* entries, int n_groups, float* slots, cudaStream_t s);

// A batched step's experts with no host in the loop (moe_stream.cu; after moe_bucket, n tokens): every
// touched expert's rows streamed once for all its entries on the tensor cores. gate/up: x_hi/x_lo [n][H] (the
// experts' input as halves) -> h_hi/h_lo [n K][Ie], gelu(gate . x) * (up . x) as halves; down:
// slots[entry][j] = down_e[j] . h[entry], fp32 [n K][H]. A pass's rows are bf16, FP8 e4m3 with a scale per
// row, or int4 with a scale and zero point per group of 128 (the decode step's QuantMatrix): bf16 rows read
// bf16 halves (split_rows), quantised rows one f16 array of x / 16 (f16_rows; x_lo unused); the gate/up pass
// writes h so, into h_hi, where h_f16 (the down pass is quantised).
struct ExpertRows {
    const bf16* w = nullptr;  // bf16: [E][rows][K]
    QuantMatrix fp8;          // FP8 where q is set: [E][rows][K] bytes, scale [E][rows]
    // int4 where q is set: [E][rows][K / 2] bytes, scale and zero (or null) [E][rows][(K + 127) / 128]
    QuantMatrix int4;
};
bool moe_stream_fits(int H, int Ie);      // H % 32 == 0 and Ie % 32 == 0 (the 26B-A4B's 2816 and 704);
                                          // int4 rows too (a last group of K % 128 != 0 is short)
bool moe_stream_fits_fp8(int H, int Ie);  // FP8 also: H % 64 == 0 and Ie % 64 == 0
// A pass's blocks: mt row tiles of 16 (gate/up: 2, a gate tile and an up tile) and g chunks a warp loads
// per round (32 k of bf16 rows, 64 k of FP8). Built: (2, 2); for FP8 rows gate/up (2, 3), down (4, 1) (the
// down pass's H a multiple of 16 mt). {0, 0}: moe_stream_shape's for the pass, the product's rule (rows: the
// pass's output rows an expert, Ie for gate/up, H for down).
struct MoeStreamShape {
    int mt = 0, g = 0;
};
MoeStreamShape moe_stream_shape(bool down, bool fp8, int n, int K, int E, int rows);
void moe_stream_gate_up(const uint16_t* x_hi, const uint16_t* x_lo, int H, int K, const ExpertRows& gate_up,
                        int Ie, const int* group_off, const int* entries, int E, int n, uint16_t* h_hi,
                        uint16_t* h_lo, bool h_f16, cudaStream_t s, MoeStreamShape shape = {});
void moe_stream_down(const uint16_t* h_hi, const uint16_t* h_lo, int Ie, const ExpertRows& down, int H, int K,
                     const int* group_off, const int* entries, int E, int n, float* slots, cudaStream_t s,
                     MoeStreamShape shape = {});

// Decode (one token; moe_route wrote the K slot groups, slot g = entry g): the experts' gate/up rows, a warp
// per row with 6 + 6 loads in flight per lane, registers capped for 3 blocks per SM.
void moe_gate_up_decode(const float* x, int H, const bf16* gate_up, int Ie, int K, const int* group_expert,
                        float* h, cudaStream_t s);
// Decode: e[j] = sum_k sel_w[k] * (down[expert of slot k][j] . h[k]), the slots' down rows and their
// weighted sum in one kernel, 4 output rows per block and a warp per slot (Ie <= 768, K <= 32).
void moe_down_sum_decode(const float* h, int Ie, const bf16* down, int H, int K, const int* group_expert,
                         const float* sel_w, float* e, cudaStream_t s);

// ---- moe_gemm.cu: a prefill chunk's experts ---------------------------------------------------------------
// A prefill chunk's experts on the tensor cores with no host in the loop (after moe_bucket over n tokens):
// the tokens' inputs x [n][H] into x_rows (bf16 halves [2][n][H]; FP8 experts: f16 of x / 16, [n][H]), then
// gate/up over each expert's entries in column tiles of 32 with GeGLU into h (entry order: bf16
// halves [2][n K][Ie]; FP8 one f16 array), then down into out[entry][H] (an expert of group_expert < 0,
// another rank's, gives zero rows). FP8 (or int4) where both ExpertRows have FP8 (int4) rows, else the bf16
// rows; quantised rows take the inputs and write h as one f16 array.
bool moe_gemm_fits(int H, int Ie, int E);  // H % 128 == 0, Ie % 64 == 0, E <= 256
void moe_gemm_prepare();  // its kernels' shared-memory limit on the current device (CudaModel's set-up)
void moe_gemm_experts(const float* x, int H, int K, int n, const ExpertRows& gate_up, const ExpertRows& down,
                      int Ie, const int* group_expert, const int* group_off, const int* entries, int E,
                      bf16* x_rows, bf16* h, float* out, cudaStream_t s);

}  // namespace markbase::cuda
