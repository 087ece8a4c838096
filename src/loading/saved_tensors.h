// The tensors of a quantised model saved as a compressed-tensors checkpoint (loading/save_quantized.h), under
// the checkpoint's own names, in the layout loading/published_quant.h reads:
//  - every LayerQuant matrix with a quantised form: FP8 `<module>.weight` F8_E4M3 [out, in] and
//    `<module>.weight_scale` [out, 1]; int4 `<module>.weight_packed` I32 [out, in / 8], `.weight_scale`
//    [out, in / 128], `.weight_shape` I64 [2] and, asymmetric, `.weight_zero_point` I32 [ceil(out / 8),
//    in / 128] packed along the output dimension. Scales are BF16 where all of a module's are bf16 values
//    (what llm-compressor writes for a bf16 model, and what --quantize int4 makes), else F32 (exact).
//  - the fused experts as llm-compressor unfuses them, `experts.{e}.gate_proj/up_proj/down_proj`, which is
//    what the loader gathers and what vLLM's Gemma 4 reads for quantised experts;
//  - int4 matrices whose K is not a multiple of 128 (--quantize int4's short last group of 64), which
//    compressed-tensors cannot hold: bf16 of their dequantised values (their bf16 slots), under the bf16
//    name, listed in `ignore`. Where one of the experts' matrices has no such form (that width, or experts a
//    source kept bf16), all the experts stay bf16 (vLLM's fused MoE takes one scheme for an expert's gate,
//    up and down projections), fused as bf16 checkpoints store them, with `re:.*\.experts\..*` in `ignore`;
//  - everything else bf16 as loaded (matrices the source stored quantised without a quantised form are their
//    dequantised values), every Linear among them (PLE projections, the router) listed in `ignore`;
//  - the tensors the loader skipped (vision/audio towers, lm_head, the K/V of KV-shared layers) as the files
//    hold them, bf16 matrices among them listed in `ignore`, except that bf16 K/V projections of KV-shared
//    layers are quantised like their layer's q_proj (vLLM fuses q, k and v into one layer of one scheme, and
//    llm-compressor quantises them too); static activation scales (`input_scale`) are left out, the saved
//    scheme's activations being dynamic (FP8) or bf16 (int4).
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "loading/checkpoint.h"
#include "loading/safetensors.h"

namespace markbase {

struct SavedTensors {
    std::vector<TensorToWrite> tensors;     // in plan order, then the skipped tensors
    std::deque<std::vector<uint8_t>> made;  // bytes made for the files (a deque: what is added never moves)
    std::vector<std::string> ignore;        // quantization_config.ignore: "lm_head", then modules kept bf16
    bool symmetric = true;                  // int4: no zero points
    std::vector<std::string> notes;
};

// ck.format must be kFp8 or kInt4. Data pointers point into ck (its mapping and owned buffers) or `made`.
SavedTensors saved_tensors(const Checkpoint& ck);

}  // namespace markbase
