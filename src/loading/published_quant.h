// Published compressed-tensors checkpoints (loading/quantization_config.h), FP8 or int4, bound inside
// load_checkpoint's loop over the plan into the layout model/weights.h gives them: Weights::quant sized [L],
// each LayerQuant matrix's q, scale and zero the file's rows (read in place) or gathered ones, and the
// matrix's ordinary bf16 slot pointing at its values dequantised to bf16, so whatever reads bf16 (the CPU
// backend, inspect) computes with the quantised model's values.
//
// What both formats share lives in published_quant.cpp: which modules the config quantises, matrices and the
// experts that llm-compressor unfuses (`experts.{e}.gate_proj/up_proj/down_proj`, gathered into the fused
// [E, 2 Ie, H] and [E, H, Ie] layout; fused bf16 experts load as they are), matrices outside LayerQuant (the
// PLE projections, the router) stored quantised and dequantised to bf16 with no quantised form, and the
// problems, all listed together. Each format's tensors are read in its own file:
//  - FP8 (published_fp8.cpp): `<module>.weight` F8_E4M3 [out, in] beside `<module>.weight_scale` F32/BF16,
//    [out, 1] per channel or [1] / [] per tensor (expanded to every row); `<module>.input_scale` (static
//    activations) is set aside, the path being weights-only.
//  - int4 (published_int4.cpp): `<module>.weight_packed` I32 [out, ceil(in / 8)] (model/int4.h's codes),
//    `<module>.weight_scale` BF16/F16/F32 [out, ceil(in / 128)], `<module>.weight_shape` I32/I64 [2] = [out,
//    in], and when asymmetric `<module>.weight_zero_point`: I32 [ceil(out / 8), ceil(in / 128)] packed along
//    the output dimension, or I8 [out, ceil(in / 128)] unpacked, as compressed-tensors wrote them before it
//    packed them. A matrix whose K is not a multiple of 128 is dequantised and has no int4 form.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "loading/checkpoint.h"
#include "loading/quant_rows.h"
#include "loading/quantization_config.h"
#include "model/tensor_plan.h"

namespace markbase {

class PublishedQuant {
  public:
    // Problems join the loader's list (every one reported together), consumed tensor names join `used`.
    PublishedQuant(Checkpoint& ck, const QuantizationConfig& qc, std::set<std::string>& used,
                   std::vector<std::string>& problems);

    // True where it took p: a quantised matrix bound, per-expert tensors gathered, or its problems listed.
    // False leaves p to the ordinary bf16 binding (a bf16 tensor the config leaves unquantized, or one that
    // is missing).
    bool bind(const PlannedTensor& p);

    // Once nothing is wrong: fills the bf16 slots (several threads) and sets ck.format. Returns the
    // tensors whose values are not finite, one line each (load_checkpoint refuses them).
    std::vector<std::string> finish();

  private:
    bool bind_matrix(const PlannedTensor& p, const TensorInfo& t, const std::string& module);
    bool bind_experts(const PlannedTensor& p);
    bool take_expert_part(const std::string& module, int64_t rows, int64_t K, int64_t r0, RowJob& job);
    RowJob new_job(const std::string& name, int64_t rows, int64_t K);
    // Whether a LayerQuant matrix of width K keeps the quantised form (else it is only dequantised).
    bool keeps_form(int64_t K) const;
    std::string config_says(const std::string& module, bool quantized) const;
    void problem(std::string line) { problems_.push_back(std::move(line)); }

    // The format's parts (published_fp8.cpp, published_int4.cpp).
    // The name of a module's quantised weight: "<module>.weight" (FP8) or "<module>.weight_packed" (int4).
    std::string stored_name(const std::string& module) const;
    // That tensor where the file holds it quantised (FP8: F8_E4M3), else null.
    const TensorInfo* stored_weight(const std::string& module) const;
    // For messages: what the stored weight should be ("F8_E4M3 [64, 256]"), and its companions.
    std::string stored_what(int64_t rows, int64_t K) const;
    std::string companions() const;
    // Checks the stored weight t (dtype, shape) and its companion tensors, and reads rows [r0, r0 + rows) of
    // the job's scales (and zero points) and its part; false (problems listed) when unusable.
    bool read_module(const std::string& module, const TensorInfo& t, int64_t rows, int64_t K, int64_t r0,
                     RowJob& job);
    bool read_fp8_module(const std::string& module, const TensorInfo& t, int64_t rows, int64_t K, int64_t r0,
                         RowJob& job);
    bool read_int4_module(const std::string& module, const TensorInfo& t, int64_t rows, int64_t K, int64_t r0,
                          RowJob& job);
    bool read_fp8_scales(const std::string& module, int64_t rows, float* out);
    bool read_int4_scales(const std::string& module, int64_t rows, int64_t K, float* out);
    bool read_int4_zeros(const std::string& module, int64_t rows, int64_t K, uint8_t* out);
    bool check_weight_shape(const std::string& module, int64_t rows, int64_t K);
    // A tensor the config's scheme does not have (int4: a zero point where symmetric, a g_idx), listed as a
    // problem where present; returns whether it was.
    bool refuse_companion(const std::string& name, const std::string& why);

    Checkpoint& ck_;
    const QuantizationConfig& qc_;
    std::set<std::string>& used_;
    std::vector<std::string>& problems_;
    std::vector<RowJob> jobs_;
    int input_scales_ = 0;
};

// Element i of a scale tensor of dtype BF16, F16 or F32 (the mapping gives no alignment for a wider load).
float scale_at(const TensorInfo& t, int64_t i);

// "" when the n values of scale tensor s are finite numbers > 0, else the problem ("<file>: tensor <name>: 1
// of 64 scales are not finite numbers > 0 (first at row 3: nan)"); cols > 0 names rows (and groups, cols >
// 1) in that message.
std::string scale_problem(const TensorInfo& s, int64_t n, int64_t cols);

std::string shape_text(const std::vector<int64_t>& s);  // "[64, 256]"

}  // namespace markbase
