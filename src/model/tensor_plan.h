// Every text tensor a Gemma 4 config implies, with its exact shape and the Weights field it fills.
// One list serves the loader (bind and validate), `inspect`, and the random-checkpoint writer, so the three
// can never disagree about names or shapes (GEMMA4.md 3.2).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace markbase {

enum class TensorRole { Matrix, Embedding, Norm, QkNorm, Scalar };  // how a random checkpoint draws it

struct PlannedTensor {
    std::string name;  // without the config's weight prefix, e.g. "layers.3.self_attn.q_proj.weight"
    std::vector<int64_t> shape;
    TensorRole role = TensorRole::Matrix;
    const bf16** slot = nullptr;  // where the loader stores the pointer (null when planning without Weights)
    // LayerQuant's field for the matrices a decode step may read quantised (model/weights.h): quant_eligible
    // says which; quant points at the field when the plan has Weights whose quant is sized [L], else null.
    bool quant_eligible = false;
    QuantMatrix* quant = nullptr;
};

// The range random checkpoints draw a tensor from (uniform), by role: matrices with the variance of
// N(0, 1/fan_in); norms in [0.5, 1.5]; q/k norms in [0.1, 0.35]; layer scalars in [0.6, 1.2] — the ranges of
// ../shared/tools/make_random_ckpt.py, so random models stay numerically sane at any depth.
void random_init_bounds(const PlannedTensor& p, float& lo, float& hi);

// w may be null; when given, its layers vector is sized (every pointer in it cleared) and every slot points
// into it.
std::vector<PlannedTensor> plan_tensors(const ModelConfig& c, Weights* w);

// The same plan over Weights a loader already bound (w.layers sized [L]), their pointers kept: for code that
// reads or repoints the bound tensors (the CPU backend's resident copy, quantising at load).
std::vector<PlannedTensor> plan_bound_tensors(const ModelConfig& c, Weights& w);

// Names present in released checkpoints that the text model deliberately does not use
// (the K/V projections and k_norm of KV-shared layers).
std::vector<std::string> unused_tensor_names(const ModelConfig& c);

}  // namespace markbase
