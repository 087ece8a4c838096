// Tensor parallelism (issue 7): one model over 2 GPUs must compute what one GPU computes. Tiny checkpoints of
// every family go through shard_weights and the sharded loader and are compared with the CPU backend and
// with one GPU (prefill, chunked prefill, the decode graph per token with its NCCL calls, greedy decoding on
// the device, truncate); synthetic models at real widths (each rank draws its block of the same random
// weights) compare the two-GPU model with the one-GPU model, and their greedy chains must be identical.
// Skips, saying why, with fewer than 2 GPUs; the errors for impossible splits run on one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "loading/checkpoint.h"
#include "loading/random_checkpoint.h"
#include "model/error.h"
#include "runtime/backend.h"
#include "runtime/generate.h"
#include "support/exact_options.h"
#include "support/logits_compare.h"
#include "support/tiny_models.h"
#ifdef MARKBASE_HAS_CUDA
#include "cuda/backend.h"
#include "parallel/nccl_comm.h"
#endif

namespace markbase {
namespace {

std::string param_name(const ::testing::TestParamInfo<std::string>& p) {
    return testing::test_name(p.param);
}

#ifdef MARKBASE_HAS_CUDA
#if defined(MARKBASE_HAS_NCCL)
#define REQUIRE_GPUS(n)                                                                      \
    do {                                                                                     \
        const CudaDeviceInfo info_ = cuda_device_info();                                     \
        if (!info_.available) GTEST_SKIP() << "no CUDA device: " << info_.why_not;           \
        if (NcclGroup::device_count() < (n))                                                 \
            GTEST_SKIP() << "needs " << (n) << " GPUs, found " << NcclGroup::device_count(); \
    } while (0)
#else
#define REQUIRE_GPUS(n) GTEST_SKIP() << "this build has no NCCL: tensor parallelism is unavailable"
#endif
#else
#define REQUIRE_GPUS(n) \
    GTEST_SKIP() << "no CUDA device: this build has no CUDA backend (MARKBASE_CUDA off or nvcc missing)"
#endif

#ifdef MARKBASE_HAS_CUDA

using testing::all_logits;
using testing::random_ids;
using testing::rel_err;

// Prefill `prompt` on both, then `steps` greedy tokens on the device; the chains must be identical.
void expect_same_chain(CudaBackend& one, CudaBackend& two, const std::vector<int>& prompt, int steps,
                       std::vector<float>* last_one = nullptr, std::vector<float>* last_two = nullptr) {
    one.reset();
    two.reset();
    one.eval(prompt.data(), static_cast<int64_t>(prompt.size()), nullptr, false);
    two.eval(prompt.data(), static_cast<int64_t>(prompt.size()), nullptr, false);
    const std::vector<int> a = one.decode_greedy(steps, last_one ? last_one->data() : nullptr);
    const std::vector<int> b = two.decode_greedy(steps, last_two ? last_two->data() : nullptr);
    ASSERT_EQ(a.size(), b.size());
    for (size_t s = 0; s < a.size(); ++s) ASSERT_EQ(a[s], b[s]) << "greedy step " << s;
}

#endif

class CudaTpTiny : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaTpTiny, TwoGpusComputeTheOneGpuModel) {
    REQUIRE_GPUS(2);
#ifdef MARKBASE_HAS_CUDA
    const std::string family = GetParam();
    testing::TempDir dir("cuda-tp-" + family);
    write_random_checkpoint(dir.path(), testing::tiny_config(family), 7);
    auto ck = load_checkpoint(dir.path());
    const std::vector<int> ids = random_ids(23, 256, 42);
    BackendOptions o = testing::exact_options();
    o.ctx_size = 512;
    o.chunk = 64;
    o.threads = 2;
    o.kv_dtype = KvDtype::kF32;  // the exact cache: compared with the CPU backend's fp32 products
    auto cpu = make_cpu_backend(*ck, o);
    const std::vector<float> ref = all_logits(*cpu, ids, false);
    auto one = make_cuda_backend(*ck, o);
    BackendOptions o2 = o;
    o2.tensor_parallel = 2;
    auto two = make_cuda_backend(*ck, o2);
    BackendOptions o2c = o2;
    o2c.chunk = 5;  // sliding rings wrap inside and across chunks
    auto two_chunked = make_cuda_backend(*ck, o2c);
    EXPECT_NE(two->name().find("tp=2"), std::string::npos) << two->name();

    const double e_batch = rel_err(ref, all_logits(*two, ids, false));
    const double e_chunk = rel_err(ref, all_logits(*two_chunked, ids, false));
    const double e_decode = rel_err(ref, all_logits(*two, ids, true));
    std::printf("  %s tp=2 vs cpu: rel err prefill %.2e, chunked %.2e, graph decode %.2e\n", family.c_str(),
                e_batch, e_chunk, e_decode);
    EXPECT_LT(e_batch, 1e-3);
    EXPECT_LT(e_chunk, 1e-3);
    EXPECT_LT(e_decode, 1e-3);

    const int64_t V = ck->config.vocab_size;
    std::vector<float> l1(V), l2(V);
    expect_same_chain(*one, *two, std::vector<int>(ids.begin(), ids.begin() + 9), 24, &l1, &l2);
    EXPECT_LT(rel_err(l1, l2), 1e-4) << "last step's logits";

    // truncate and continue differently, as chat does: both sides must still agree
    for (Backend* be : {static_cast<Backend*>(one.get()), static_cast<Backend*>(two.get())}) {
        be->reset();
        be->eval(ids.data(), 15, nullptr, false);
        ASSERT_TRUE(be->truncate(12));
        be->eval(ids.data() + 16, 3, nullptr, false);
    }
    const std::vector<int> a = one->decode_greedy(6, nullptr), b = two->decode_greedy(6, nullptr);
    EXPECT_EQ(a, b) << "after truncate";
    EXPECT_EQ(two->n_past(), 12 + 3 + 6);

    // the decode step's sums through NCCL instead of the NVLink peer sums (the default where peers can map
    // each other's memory): the same chain
    BackendOptions o2n = o2;
    o2n.tuning = testing::exact_tuning("tp_allreduce=nccl");
    auto two_nccl = make_cuda_backend(*ck, o2n);
    EXPECT_NE(two_nccl->name().find("NCCL"), std::string::npos) << two_nccl->name();
    std::printf("  %s: %s and %s\n", family.c_str(), two->name().c_str(), two_nccl->name().c_str());
    expect_same_chain(*one, *two_nccl, std::vector<int>(ids.begin(), ids.begin() + 9), 24);
    EXPECT_LT(rel_err(ref, all_logits(*two_nccl, ids, true)), 1e-3);
#endif
}

INSTANTIATE_TEST_SUITE_P(Families, CudaTpTiny, ::testing::Values("e2b", "e4b", "26b-a4b", "31b"), param_name);

// Sampling on 2 GPUs: each rank selects the k best of its vocabulary columns, the backend merges them; the
// generated ids must be the host sampler's on the full row (GenerateOptions::device_select false), filters
// and penalties included (penalised ids fall on both ranks' columns). The default; the tuning
// device_sampling=0 turns it off.
class CudaTpSampling : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaTpSampling, MergedCandidatesDrawTheHostSamplersIds) {
    REQUIRE_GPUS(2);
#ifdef MARKBASE_HAS_CUDA
    testing::TempDir dir("cuda-tp-sampling");
    write_random_checkpoint(dir.path(), testing::tiny_config(GetParam()), 12, 30000);
    const auto ck = load_checkpoint(dir.path());
    BackendOptions o = testing::exact_options();
    o.ctx_size = 128;
    o.chunk = 16;
    o.tensor_parallel = 2;
    const auto be = make_cuda_backend(*ck, o);
    ASSERT_GT(be->max_select_k(), 0) << "device-side selection on 2 GPUs";
    {
        BackendOptions off = o;
        off.tuning = testing::exact_tuning("device_sampling=0");
        EXPECT_EQ(make_cuda_backend(*ck, off)->max_select_k(), 0) << "device_sampling=0";
    }
    const std::vector<int> prompt = {2, 30, 31, 32, 33};
    struct Case {
        int top_k;
        float temp, top_p, min_p, rep, pres, freq;
        uint64_t seed;
    };
    for (const Case& c :
         {Case{64, 1.0f, 0.95f, 0.0f, 1.0f, 0.0f, 0.0f, 7}, Case{20, 0.8f, 0.9f, 0.05f, 1.2f, 0.3f, 0.1f, 8},
          Case{0, 0.0f, 1.0f, 0.0f, 1.5f, 0.0f, 0.0f, 9}}) {
        GenerateOptions go;
        go.max_new_tokens = 40;
        go.ignore_eos = true;
        go.sampling.top_k = c.top_k;
        go.sampling.temperature = c.temp;
        go.sampling.top_p = c.top_p;
        go.sampling.min_p = c.min_p;
        go.sampling.repeat_penalty = c.rep;
        go.sampling.presence_penalty = c.pres;
        go.sampling.frequency_penalty = c.freq;
        go.sampling.seed = c.seed;
        std::vector<int> dev_ids, host_ids;
        be->reset();
        generate(
            *be, prompt, go, [](int) { return true; }, &dev_ids);
        be->reset();
        go.device_select = false;
        generate(
            *be, prompt, go, [](int) { return true; }, &host_ids);
        EXPECT_EQ(dev_ids, host_ids) << GetParam() << " top_k " << c.top_k << " temp " << c.temp;
        EXPECT_EQ(dev_ids.size(), 40u);
    }
#endif
}

INSTANTIATE_TEST_SUITE_P(Families, CudaTpSampling, ::testing::Values("e2b", "26b-a4b", "31b"), param_name);

// Real widths, few layers: the 2-GPU model against the 1-GPU model on the same synthetic weights.
class CudaTpSynthetic : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaTpSynthetic, TwoGpusMatchOneAtRealWidths) {
    REQUIRE_GPUS(2);
#ifdef MARKBASE_HAS_CUDA
    const std::string v = GetParam();
    const int layers = v == "e2b" ? 10 : v == "e4b" ? 7 : 2;
    BackendOptions o = testing::exact_options();
    o.ctx_size = 128;
    o.chunk = 32;
    auto one = make_synthetic_cuda_backend(v, layers, o, 99);
    BackendOptions o2 = o;
    o2.tensor_parallel = 2;
    auto two = make_synthetic_cuda_backend(v, layers, o2, 99);
    // the ranks' weights together: the whole model once, plus what every rank keeps whole (norms, router,
    // PLE tables: E2B/E4B's per-layer embedding is the big one) and replicated KV heads
    EXPECT_GE(two->weight_bytes(), one->weight_bytes());
    EXPECT_LE(two->weight_bytes(), one->weight_bytes() * (one->config().ple_dim ? 1.5 : 1.02));
    const int64_t V = one->config().vocab_size;
    ASSERT_EQ(two->config().vocab_size, V) << "the backend reports the whole model's config";
    const std::vector<int> prompt = random_ids(12, static_cast<int>(V), 5);
    std::vector<float> a(V), b(V);
    one->reset();
    two->reset();
    one->eval(prompt.data(), 12, a.data(), false);
    two->eval(prompt.data(), 12, b.data(), false);
    const double e_prefill = rel_err(a, b);
    std::vector<float> la(V), lb(V);
    expect_same_chain(*one, *two, prompt, 32, &la, &lb);
    const double e_decode = rel_err(la, lb);
    std::printf("  %s/%dL tp=2 vs tp=1: rel err prefill %.2e, after 32 greedy steps %.2e\n", v.c_str(),
                layers, e_prefill, e_decode);
    const double tol = one->config().moe ? 3e-2 : 1e-4;  // MoE: a near-tie 8th/9th expert may flip
    EXPECT_LT(e_prefill, tol);
    EXPECT_LT(e_decode, tol);
#endif
}

INSTANTIATE_TEST_SUITE_P(Variants, CudaTpSynthetic, ::testing::Values("e2b", "e4b", "26b-a4b", "31b"),
                         param_name);

// Impossible splits and too few GPUs are refused with the reason, before anything is loaded.
TEST(CudaTp, RefusesWhatCannotBeSplit) {
    REQUIRE_GPUS(1);
#ifdef MARKBASE_HAS_CUDA
    testing::TempDir dir("cuda-tp-bad");
    write_random_checkpoint(dir.path(), testing::tiny_config("31b"), 7);
    auto ck = load_checkpoint(dir.path());
    BackendOptions o = testing::exact_options();
    o.ctx_size = 64;
    const int visible = NcclGroup::device_count();
    o.tensor_parallel = visible + 1;
    try {
        auto be = make_cuda_backend(*ck, o);
        FAIL() << "expected an error for " << o.tensor_parallel << " GPUs";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("CUDA device(s) are visible"), std::string::npos) << e.what();
    }
    if (visible >= 3) {
        o.tensor_parallel = 3;  // 4 query heads
        try {
            auto be = make_cuda_backend(*ck, o);
            FAIL() << "expected an error for 3 ranks";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("not divisible"), std::string::npos) << e.what();
        }
    }
    o.tensor_parallel = 0;
    EXPECT_THROW(make_cuda_backend(*ck, o), Error);
#endif
}

}  // namespace
}  // namespace markbase
