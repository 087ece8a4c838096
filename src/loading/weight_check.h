// NaN and Inf in checkpoint weights, found at load and named with their tensor and file, instead of as
// "sampler: logits contain NaN" once a prompt has run through them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loading/safetensors.h"

namespace markbase {

// Tensors up to this many elements (norm weights, layer_scalar, the router's scales) are always checked;
// together they are a few MB even for the largest Gemma 4 model.
constexpr int64_t kAlwaysCheckedElements = 64 * 1024;

// One line per BF16 tensor of `tensors` holding a value that is not finite, e.g.
//   "<file>: tensor <name>: 2 of 1536 values not finite (first at index 5: NaN)".
// `all` false: only tensors of at most kAlwaysCheckedElements elements; true: every tensor (reads the whole
// checkpoint once, on several threads). Tensors of other dtypes are skipped.
std::vector<std::string> find_non_finite(const std::vector<const TensorInfo*>& tensors, bool all);

}  // namespace markbase
