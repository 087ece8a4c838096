// Quantised weights on the GPU (issue 31): random weights at real widths quantised on the device
// (BackendOptions::weights = kFp8 or kInt4; quantize_rows.cu), whose bf16 tensors then hold the quantised
// values rounded to bf16. The CPU backend on a copy of those bf16 tensors is the reference: the GPU's prefill
// reads the same bf16 values (agreement as tight as the bf16 model's), its decode step reads the quantised
// bytes, scales and zero points (gemv_quant.cu), whose exact products differ from the bf16 copy by its
// rounding (2^-9 of each weight at most). Without a GPU every test skips with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "loading/checkpoint.h"
#include "runtime/backend.h"
#include "support/exact_options.h"
#include "support/logits_compare.h"
#include "support/require_cuda.h"
#include "support/tiny_models.h"
#ifdef MARKBASE_HAS_CUDA
#include "cuda/backend.h"
#endif

namespace markbase {
namespace {

// (variant, format)
using QuantCase = std::tuple<std::string, WeightFormat>;
class CudaQuant : public ::testing::TestWithParam<QuantCase> {};

const char* format_name(WeightFormat f) {
    return f == WeightFormat::kInt4 ? "int4" : f == WeightFormat::kFp8 ? "fp8" : "bf16";
}

std::string param_name(const ::testing::TestParamInfo<QuantCase>& p) {
    return testing::test_name(std::get<0>(p.param)) + "_" + format_name(std::get<1>(p.param));
}

TEST_P(CudaQuant, DecodeMatchesTheCpuOnTheDequantisedWeights) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    const std::string v = std::get<0>(GetParam());
    const WeightFormat f = std::get<1>(GetParam());
    const int layers = v == "e2b" ? 10 : v == "e4b" ? 7 : 2;
    constexpr int kPrompt = 12, kSteps = 4;
    BackendOptions o = testing::exact_options();
    o.ctx_size = 64;
    o.chunk = 32;
    o.kv_dtype = KvDtype::kF32;
    o.weights = f;
    auto gpu = make_synthetic_cuda_backend(v, layers, o, 99);
    const int64_t V = gpu->config().vocab_size;
    auto host = copy_weights_to_host(*gpu);
    o.weights = WeightFormat::kBf16;
    auto cpu = make_cpu_backend(host->checkpoint, o);
    // MoE: a prompt whose routing is clear of an 8th/9th expert tie on the CPU (see test_cuda_backend.cpp) by
    // more than the quantised decode's error can move a router logit (~1e-3 of the largest)
    constexpr float kMargin = 3e-3f;
    std::vector<int> ids;
    std::vector<std::vector<float>> ref;
    for (uint32_t seed = 5; seed < 5 + 256; ++seed) {
        cpu->reset();
        ref.clear();
        ids = testing::random_ids(kPrompt, static_cast<int>(V), seed);
        std::vector<float> lg(V);
        cpu->eval(ids.data(), kPrompt, lg.data(), false);
        ref.push_back(lg);
        for (int s = 0; s < kSteps; ++s) {
            const int next = static_cast<int>(std::max_element(lg.begin(), lg.end()) - lg.begin());
            ids.push_back(next);
            cpu->eval(&next, 1, lg.data(), false);
            ref.push_back(lg);
        }
        if (cpu->router_margin() >= kMargin) break;
    }
    ASSERT_GE(cpu->router_margin(), kMargin) << "no prompt in 256 routes clear of a tie";
    std::vector<float> got(V);
    std::vector<std::vector<float>> quantised;
    gpu->eval(ids.data(), kPrompt, got.data(), false);
    quantised.push_back(got);
    const double e_prefill = testing::rel_err(ref[0], got);
    double e_decode = 0;
    for (int s = 0; s < kSteps; ++s) {
        gpu->eval(&ids[kPrompt + s], 1, got.data(), false);
        quantised.push_back(got);
        e_decode = std::max(e_decode, testing::rel_err(ref[s + 1], got));
    }
    gpu.reset();
    // what the quantisation itself costs at real widths: the same random weights unquantised, the same ids
    auto bf16 = make_synthetic_cuda_backend(v, layers, o, 99);
    double e_bf16 = 0;
    bf16->eval(ids.data(), kPrompt, got.data(), false);
    e_bf16 = testing::rel_err(got, quantised[0]);
    for (int s = 0; s < kSteps; ++s) {
        bf16->eval(&ids[kPrompt + s], 1, got.data(), false);
        e_bf16 = std::max(e_bf16, testing::rel_err(got, quantised[s + 1]));
    }
    // the prefill reads the bf16 copy, but for the MoE's FP8 or int4 experts (moe_gemm: the rows against f16
    // inputs, 2^-11, as the decode's kernels do; the H200: 4.0e-4 FP8, 3.6e-4 int4)
    const bool rows_prefill = host->checkpoint.config.moe;
    std::printf(
        "  %s/%dL %s: rel err prefill (%s) %.2e, decode (quantised kernels) %.2e; against the "
        "unquantised model %.2e\n",
        v.c_str(), layers, format_name(f), rows_prefill ? "quantised experts" : "bf16 copy", e_prefill,
        e_decode, e_bf16);
    EXPECT_LT(e_prefill, rows_prefill ? 5e-3 : 1e-4);
    if (rows_prefill) {
        EXPECT_GT(e_prefill, 1e-5) << "the prefill's experts read the bf16 copy";
    }
    EXPECT_LT(e_decode, 5e-3);
    EXPECT_GT(e_decode, 0.0) << "bit-identical to the bf16 reference: the quantised kernels did not run";
    // a loose bound: random weights are as hard on a 4-bit grid as weights get (no outliers to spare)
    EXPECT_LT(e_bf16, f == WeightFormat::kInt4 ? 0.5 : 0.1);
    EXPECT_GT(e_bf16, 0.0) << "the quantised model computed the unquantised one";
#endif
}

INSTANTIATE_TEST_SUITE_P(Variants, CudaQuant,
                         ::testing::Combine(::testing::Values("e2b", "e4b", "26b-a4b", "31b"),
                                            ::testing::Values(WeightFormat::kFp8, WeightFormat::kInt4)),
                         param_name);

// A batched step of the MoE with FP8 or int4 experts (moe_stream's quantised rows; the step's other
// products read the bf16 copy) at real widths: 4 sequences decoding together (the projections through
// stream_gemm, the experts forked beside the dense MLP), then 20 (cuBLAS projections, one stream), each row
// against the CPU decoding that sequence alone on the bf16 copy, within the quantised decode's bound; the
// backend's note says the quantised experts ran (int4: the expert width 704 ends each down row in half a
// group).
class CudaQuantBatch : public ::testing::TestWithParam<WeightFormat> {};

TEST_P(CudaQuantBatch, QuantisedExpertsInTheBatchedStepMatchTheCpu) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    const WeightFormat f = GetParam();
    const char* fname = format_name(f);
    constexpr int kSeq = 20, kPrompt = 12, kSteps = 3;
    constexpr float kMargin = 3e-3f;  // routing clear of a tie, as above
    BackendOptions o = testing::exact_options();
    o.ctx_size = 64;
    o.chunk = 32;
    o.kv_dtype = KvDtype::kF32;
    o.weights = f;
    o.slots = kSeq;
    auto gpu = make_synthetic_cuda_backend("26b-a4b", 2, o, 99);
    const int64_t V = gpu->config().vocab_size;
    auto host = copy_weights_to_host(*gpu);
    BackendOptions oc = o;
    oc.weights = WeightFormat::kBf16;
    oc.slots = 1;
    auto cpu = make_cpu_backend(host->checkpoint, oc);
    const auto argmax = [](const std::vector<float>& v) {
        return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
    };
    // each sequence: a prompt, then kSteps greedy tokens, with the CPU's logits at the prompt's last token
    // and at each one after
    std::vector<std::vector<int>> ids(kSeq);
    std::vector<std::vector<std::vector<float>>> ref(kSeq);
    uint32_t seed = 5;
    for (int s = 0; s < kSeq; ++s) {
        for (;; ++seed) {
            ASSERT_LT(seed, 5u + 1024u) << "no prompt in 1024 routes clear of a tie";
            cpu->reset();
            ref[s].clear();
            ids[s] = testing::random_ids(kPrompt, static_cast<int>(V), seed);
            std::vector<float> lg(V);
            cpu->eval(ids[s].data(), kPrompt, lg.data(), false);
            ref[s].push_back(lg);
            for (int k = 0; k < kSteps; ++k) {
                ids[s].push_back(argmax(lg));
                cpu->eval(&ids[s].back(), 1, lg.data(), false);
                ref[s].push_back(lg);
            }
            if (cpu->router_margin() >= kMargin) break;
        }
        ++seed;
    }
    // the GPU: each prompt less its last token in its slot, then kSteps + 1 steps of the first m together
    double e_batch = 0;
    for (const int m : {4, kSeq}) {
        std::vector<int> slots(m);
        for (int s = 0; s < m; ++s) {
            slots[s] = s;
            gpu->slot_reset(s);
            gpu->slot_eval(s, ids[s].data(), kPrompt - 1);
        }
        double e = 0;
        std::vector<float> lg(m * V);
        for (int k = 0; k <= kSteps; ++k) {
            std::vector<int> in(m);
            for (int s = 0; s < m; ++s) in[s] = ids[s][kPrompt - 1 + k];
            gpu->decode_batch(slots.data(), in.data(), m, lg.data());
            for (int s = 0; s < m; ++s)
                e = std::max(e, testing::rel_err(ref[s][k], std::vector<float>(lg.begin() + s * V,
                                                                               lg.begin() + (s + 1) * V)));
        }
        std::printf("  26b-a4b/2L %s, %d sequences a step: rel err against the CPU %.2e\n", fname, m, e);
        EXPECT_LT(e, 5e-3) << m << " sequences";
        EXPECT_GT(e, 0.0)
            << m << " sequences: bit-identical to the bf16 reference: the quantised rows did not run";
        e_batch = std::max(e_batch, e);
    }
    const std::string note = gpu->prefill_note();
    std::printf("  worst %.2e\n  %s\n", e_batch, note.c_str());
    const std::string none = f == WeightFormat::kFp8 ? "(0 of them FP8" : " FP8, 0 int4";
    EXPECT_NE(note.find(" of them FP8, "), std::string::npos) << note;
    EXPECT_EQ(note.find(none), std::string::npos) << "the batched step read the bf16 experts: " << note;
#endif
}

INSTANTIATE_TEST_SUITE_P(Formats, CudaQuantBatch, ::testing::Values(WeightFormat::kFp8, WeightFormat::kInt4),
                         [](const ::testing::TestParamInfo<WeightFormat>& p) {
                             return std::string(format_name(p.param));
                         });

// The bundled trained model quantised at load (--quantize fp8|int4): the GPU's decode (the projections
// through gemv_quant.cu where their widths fit it) against the CPU on the same checkpoint, whose bf16 slots
// hold the dequantised values; a prompt, then 24 tokens fed one at a time.
class CudaQuantCheckpoint : public ::testing::TestWithParam<WeightFormat> {};

TEST_P(CudaQuantCheckpoint, BundledModelQuantisedAtLoadMatchesTheCpu) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    LoadOptions lo;
    lo.quantize = GetParam();
    const auto ck = load_checkpoint(MARKBASE_TEST_DATA "/../../models/default", lo);
    ASSERT_FALSE(ck->weights.quant.empty());
    BackendOptions o = testing::exact_options();
    o.ctx_size = 128;
    o.chunk = 32;
    o.kv_dtype = KvDtype::kF32;
    auto cpu = make_cpu_backend(*ck, o);
    auto gpu = make_cuda_backend(*ck, o);
    const int64_t V = ck->config.vocab_size;
    std::vector<int> ids = testing::random_ids(16, static_cast<int>(V), 3);
    std::vector<float> ref(V), got(V);
    cpu->eval(ids.data(), 16, ref.data(), false);
    gpu->eval(ids.data(), 16, got.data(), false);
    const double e_prefill = testing::rel_err(ref, got);
    double e_decode = 0;
    int same = 0;
    constexpr int kSteps = 24;
    for (int s = 0; s < kSteps; ++s) {
        const int next = static_cast<int>(std::max_element(ref.begin(), ref.end()) - ref.begin());
        cpu->eval(&next, 1, ref.data(), false);
        gpu->eval(&next, 1, got.data(), false);
        e_decode = std::max(e_decode, testing::rel_err(ref, got));
        same += std::max_element(ref.begin(), ref.end()) - ref.begin() ==
                std::max_element(got.begin(), got.end()) - got.begin();
    }
    std::printf("  bundled %s: rel err prefill %.2e, decode %.2e, argmax agreeing %d of %d\n",
                format_name(GetParam()), e_prefill, e_decode, same, kSteps);
    EXPECT_LT(e_prefill, 1e-4);
    EXPECT_LT(e_decode, 5e-3);
    EXPECT_GT(e_decode, 0.0) << "bit-identical to the bf16 reference: the quantised kernels did not run";
    EXPECT_GE(same, kSteps - 1);
#endif
}

INSTANTIATE_TEST_SUITE_P(Formats, CudaQuantCheckpoint,
                         ::testing::Values(WeightFormat::kFp8, WeightFormat::kInt4),
                         [](const ::testing::TestParamInfo<WeightFormat>& p) {
                             return format_name(p.param);
                         });

}  // namespace
}  // namespace markbase
