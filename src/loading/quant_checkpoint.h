// Quantised weights at load, FP8 (model/fp8.h) or int4 (model/int4.h), in the layout model/weights.h gives
// them: Weights::quant sized [L], each LayerQuant matrix's quantised rows (experts [E * rows], fused as the
// bf16 checkpoint stores them) and scales (and int4's zero points), and the matrix's ordinary bf16 slot
// pointing at its values dequantised to bf16, so whatever reads bf16 (the CPU backend, inspect) computes with
// the quantised model's values.
//
// Two ways in:
//  - published compressed-tensors checkpoints, FP8 or int4 pack-quantized (loading/published_quant.h);
//  - LoadOptions::quantize (--quantize fp8|int4): every LayerQuant matrix of a bf16 checkpoint quantised, FP8
//    per row, int4 per group of 128 (symmetric; a row's last group half one where K is an odd multiple of
//    64, which the GPU's kernel reads; a matrix whose K is not a multiple of 64 stays bf16).
#pragma once

#include <array>
#include <string>
#include <vector>

#include "loading/checkpoint.h"

namespace markbase {

// --quantize on a bf16 checkpoint: every LayerQuant matrix quantised to `f` (kFp8 or kInt4) on several
// threads, its bf16 slot repointed at the dequantised values. Returns the tensors whose values are not
// finite, one line each.
std::vector<std::string> quantize_weights(Checkpoint& ck, WeightFormat f);

// The weight a companion tensor (".weight_scale", ".input_scale", ".weight_packed", ".weight_zero_point",
// ".weight_shape", ".weight_g_idx") belongs to ("<module>.weight"); "" for other names.
std::string quant_companion_owner(const std::string& name);

// The weight format as `inspect` prints it: "bf16", "FP8 e4m3 with per-row scales: ..." or "int4 with a
// scale per 128 weights ...".
std::string weight_format_summary(const Checkpoint& ck);

// LayerQuant's matrices: q, k, v, o, gate, up, down, the experts' gate_up and down.
std::array<const QuantMatrix*, 9> quant_matrices(const LayerQuant& l);

// Whether a quantised matrix has zero points (an asymmetric int4 checkpoint): its bytes per token count them.
bool has_zero_points(const Weights& w);

// "fp8", "int4", "bf16": the format's name in notes and receipts.
const char* weight_format_name(WeightFormat f);

}  // namespace markbase
