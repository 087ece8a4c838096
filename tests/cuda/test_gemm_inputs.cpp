// Tuning::gemm_inputs: the product's default, the cuBLAS products over their inputs' bf16 rounding alone,
// against both bf16 halves (the exact products, which CudaSynthetic holds to the CPU). At real widths, four
// layers, a 300-token prompt in chunks of 256 and 44 (the halves' two GEMM forms: two GEMMs, then one
// stacked): the difference is bf16's rounding of every product's input (2^-9 relative), bounded here and
// printed for docs/performance.md.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "runtime/backend.h"
#include "runtime/tuning.h"
#include "support/logits_compare.h"
#include "support/require_cuda.h"
#include "support/tiny_models.h"

#ifdef MARKBASE_HAS_CUDA
#include "cuda/backend.h"
#endif

namespace markbase {
namespace {

#ifdef MARKBASE_HAS_CUDA
// The logits of the prompt's last token.
std::vector<float> prompt_logits(const std::string& variant, const char* tuning) {
    BackendOptions o;
    o.ctx_size = 512;
    o.chunk = 256;
    o.tuning = parse_tuning(tuning);
    auto be = make_synthetic_cuda_backend(variant, 4, o, 31);
    const int V = static_cast<int>(be->config().vocab_size);
    const std::vector<int> prompt = testing::random_ids(300, V, 5);
    std::vector<float> last(static_cast<size_t>(V));
    be->eval(prompt.data(), static_cast<int64_t>(prompt.size()), last.data(), false);
    return last;
}
#endif

class CudaGemmInputs : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaGemmInputs, Bf16InputsStayNearTheHalves) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    const std::vector<float> halves = prompt_logits(GetParam(), "gemm_inputs=halves");
    const std::vector<float> bf16 = prompt_logits(GetParam(), "");
    const double e = testing::rel_err(halves, bf16);
    std::printf("  %s prompt of 300, bf16 inputs against the halves: rel err %.2e\n", GetParam(), e);
    EXPECT_GT(e, 0.0) << "identical to the last bit: the bf16 inputs did not reach the products";
    EXPECT_LT(e, 2e-2);  // the H200: E2B 4.9e-3, 26B-A4B 5.9e-3 (its router), 31B 1.6e-3
#endif
}

std::string family_name(const ::testing::TestParamInfo<const char*>& p) {
    return testing::test_name(p.param);
}

INSTANTIATE_TEST_SUITE_P(Families, CudaGemmInputs, ::testing::Values("e2b", "26b-a4b", "31b"), family_name);

}  // namespace
}  // namespace markbase
