// The CUDA engine's exact products (Tuning::gemm_inputs=halves: every cuBLAS product over both bf16 halves of
// its fp32 input), which the CUDA tests hold to the CPU and to transformers' goldens at 1e-4. The product's
// default rounds those inputs to bf16 once (half the tensor-core work); test_gemm_inputs.cpp bounds that
// against these. The CPU backend's prompt products follow the same key (cpu/matmul.h PromptProducts: x
// rounded to bf16 where the CPU has AVX-512-BF16), so its tests of exactness across chunkings or against
// transformers' fp32 goldens past the direct regime's ~48 tokens take these options too.
#pragma once

#include <string>
#include <string_view>

#include "runtime/backend.h"
#include "runtime/tuning.h"

namespace markbase::testing {

// parse_tuning(spec) with the halves, unless spec names gemm_inputs itself.
inline Tuning exact_tuning(std::string_view spec = "") {
    Tuning t = parse_tuning(spec);
    if (spec.find("gemm_inputs") == std::string_view::npos) t.gemm_inputs = Tuning::GemmInputs::kHalves;
    return t;
}

inline BackendOptions exact_options() {
    BackendOptions o;
    o.tuning = exact_tuning();
    return o;
}

}  // namespace markbase::testing
