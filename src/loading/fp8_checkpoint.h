// FP8 weights at load (model/fp8.h), in the layout model/weights.h gives them: Weights::fp8 sized [L], each
// LayerQuant matrix's q the FP8 rows ([rows, K]; experts [E, rows, K], fused as the bf16 checkpoint stores
// them) and scale one fp32 per row, and the matrix's ordinary bf16 slot pointing at its values dequantised to
// bf16 (dequantize_row_fp8), so whatever reads bf16 (the CPU backend, inspect) computes with the FP8 model's
// values.
//
// Two ways in:
//  - published compressed-tensors FP8 (loading/quantization_config.h): `<module>.weight` F8_E4M3 [out, in]
//    beside `<module>.weight_scale` F32/BF16, [out, 1] per channel or [1] / [] per tensor (expanded to every
//    row); `<module>.input_scale` (static activations) is set aside, the path being weights-only. Experts
//    unfused by llm-compressor (`experts.{e}.gate_proj/up_proj/down_proj`) are gathered into the fused
//    layout; fused bf16 experts load as they are. Matrices outside LayerQuant (the PLE projections, the router)
//    that a checkpoint stores in FP8 are dequantised to bf16 and have no FP8 form.
//  - LoadOptions::quantize (--quantize fp8): every LayerQuant matrix of a bf16 checkpoint quantised per row.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "loading/checkpoint.h"
#include "loading/fp8_rows.h"
#include "loading/quantization_config.h"
#include "model/tensor_plan.h"

namespace markbase {

// Binds a published FP8 checkpoint's matrices inside load_checkpoint's loop over the plan. Problems join the
// loader's list (every one reported together), consumed tensor names join `used`.
class PublishedFp8 {
  public:
    PublishedFp8(Checkpoint& ck, const QuantizationConfig& qc, std::set<std::string>& used,
                 std::vector<std::string>& problems);

    // True where it took p: an FP8 matrix bound, per-expert tensors gathered, or its problems listed. False
    // leaves p to the ordinary bf16 binding (a bf16 tensor the config leaves unquantized, or one that is
    // missing).
    bool bind(const PlannedTensor& p);

    // Once nothing is wrong: fills the bf16 slots (several threads) and sets ck.format. Returns the
    // tensors whose values are not finite, one line each (load_checkpoint refuses them).
    std::vector<std::string> finish();

  private:
    bool bind_matrix(const PlannedTensor& p, const TensorInfo& t, const std::string& module);
    bool bind_experts(const PlannedTensor& p);
    // The module's weight_scale as one scale per row (rows of them); false (problems listed) when unusable.
    bool read_scales(const std::string& module, int64_t rows, float* out);
    // Checks a per-expert weight and reads its scales into scale; false (problems listed) when unusable.
    bool take_expert_part(const std::string& module, int64_t rows, int64_t K, float* scale, RowJob& job);
    void set_aside_input_scale(const std::string& module);
    void problem(std::string line) { problems_.push_back(std::move(line)); }

    Checkpoint& ck_;
    const QuantizationConfig& qc_;
    std::set<std::string>& used_;
    std::vector<std::string>& problems_;
    std::vector<RowJob> jobs_;
    int input_scales_ = 0;
};

// --quantize fp8 on a bf16 checkpoint: every LayerQuant matrix quantised per row (quantize_row_fp8) on several
// threads, its bf16 slot repointed at the dequantised values. Returns the non-finite report as finish() does.
std::vector<std::string> quantize_to_fp8(Checkpoint& ck);

// The weight a companion tensor (".weight_scale", ".input_scale") belongs to ("<module>.weight"); "" for
// other names.
std::string fp8_companion_owner(const std::string& name);

// The weight format as `inspect` prints it: "bf16", or "FP8 e4m3 with per-row scales: ...".
std::string weight_format_summary(const Checkpoint& ck);

}  // namespace markbase
