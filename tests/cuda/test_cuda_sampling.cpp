// Sampling next to the logits (CudaModel::decode_select + Sampler::sample_top): the device's top-k of the
// penalised row equals the host's, candidate for candidate, and generate() draws the very same ids with it as
// with the whole row copied to the host (a backend built with the tuning device_sampling=0). Skips without a
// device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "loading/checkpoint.h"
#include "loading/random_checkpoint.h"
#include "runtime/generate.h"
#include "support/exact_options.h"
#include "support/tiny_models.h"

#ifdef MARKBASE_HAS_CUDA
#include "cuda/backend.h"
#endif

namespace markbase {
namespace {

#ifdef MARKBASE_HAS_CUDA

SamplingParams params(int top_k, float temp, float top_p, float min_p, float rep, float pres, float freq,
                      uint64_t seed) {
    SamplingParams p;
    p.top_k = top_k;
    p.temperature = temp;
    p.top_p = top_p;
    p.min_p = min_p;
    p.repeat_penalty = rep;
    p.presence_penalty = pres;
    p.frequency_penalty = freq;
    p.seed = seed;
    return p;
}

class CudaSampling : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaSampling, DeviceTopKEqualsHostTopK) {
    const CudaDeviceInfo info = cuda_device_info();
    if (!info.available) GTEST_SKIP() << "no CUDA device: " << info.why_not;
    testing::TempDir dir("cuda_sampling");
    write_random_checkpoint(dir.path(), testing::tiny_config(GetParam()), 11, 30000);
    const auto ck = load_checkpoint(dir.path());
    BackendOptions opt = testing::exact_options();
    opt.ctx_size = 96;
    opt.chunk = 16;
    const auto be = make_cuda_backend(*ck, opt);
    const int64_t V = be->config().vocab_size;
    ASSERT_GE(be->max_select_k(), 64);
    std::vector<int> ids = {2, 17, 40, 17, 99, 5, 17, 40};
    std::vector<float> lg(V);
    be->reset();
    be->eval(ids.data(), static_cast<int64_t>(ids.size()), lg.data(), false);
    for (int step = 0; step < 6; ++step) {
        const int last = step * 13 % 97 + 3;
        const SamplingParams sp = params(64, 1.0f, 1.0f, 0.0f, 1.3f, 0.4f, 0.25f, 1);
        ids.push_back(last);
        // the host's answer from the full row of this step
        be->eval(&last, 1, lg.data(), false);
        std::vector<float> pen = lg;
        apply_penalties(pen, ids, sp);
        std::vector<Sampler::Top> host;
        for (int64_t i = 0; i < V; ++i)
            if (pen[i] != -INFINITY) host.push_back({pen[i], static_cast<int>(i)});
        const int64_t n_finite = static_cast<int64_t>(host.size());
        std::sort(host.begin(), host.end(), [](const Sampler::Top& a, const Sampler::Top& b) {
            return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
        });
        // the same step again, selected on the device
        ASSERT_TRUE(be->truncate(be->n_past() - 1));
        DeviceSelect req;
        req.k = static_cast<int>(std::min<int64_t>(64, n_finite));
        penalty_window(ids, sp, &req.pen_ids, &req.pen_counts);
        ASSERT_FALSE(req.pen_ids.empty());
        req.repeat_penalty = sp.repeat_penalty;
        req.presence_penalty = sp.presence_penalty;
        req.frequency_penalty = sp.frequency_penalty;
        DeviceSelection sel;
        ASSERT_TRUE(be->eval_select(last, req, &sel, nullptr));
        EXPECT_EQ(sel.n_finite, n_finite) << "step " << step;
        ASSERT_EQ(sel.top.size(), static_cast<size_t>(req.k)) << "step " << step;
        for (size_t i = 0; i < sel.top.size(); ++i) {
            EXPECT_EQ(sel.top[i].id, host[i].id) << "step " << step << " rank " << i;
            EXPECT_EQ(sel.top[i].logit, host[i].logit) << "step " << step << " rank " << i;
        }
    }
}

TEST_P(CudaSampling, GenerateDrawsTheSameIdsAsTheHostSampler) {
    const CudaDeviceInfo info = cuda_device_info();
    if (!info.available) GTEST_SKIP() << "no CUDA device: " << info.why_not;
    testing::TempDir dir("cuda_sampling_gen");
    write_random_checkpoint(dir.path(), testing::tiny_config(GetParam()), 12, 30000);
    const auto ck = load_checkpoint(dir.path());
    BackendOptions opt = testing::exact_options();
    opt.ctx_size = 128;
    opt.chunk = 16;
    const auto be = make_cuda_backend(*ck, opt);
    BackendOptions off = opt;
    off.tuning = testing::exact_tuning("device_sampling=0");
    const auto host_be = make_cuda_backend(*ck, off);  // the same weights, every row to the host sampler
    ASSERT_GT(be->max_select_k(), 0);
    EXPECT_EQ(host_be->max_select_k(), 0) << "device_sampling=0";
    const std::vector<int> prompt = {2, 30, 31, 32, 33};
    const SamplingParams cases[] = {
        params(64, 1.0f, 0.95f, 0.0f, 1.0f, 0.0f, 0.0f, 7),  // Gemma's defaults
        params(20, 0.8f, 0.9f, 0.05f, 1.2f, 0.3f, 0.1f, 8),  // every filter and penalty
        params(0, 0.0f, 1.0f, 0.0f, 1.5f, 0.0f, 0.0f, 9),    // greedy with a repeat penalty
        params(0, 0.0f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 10),   // plain greedy
    };
    for (const SamplingParams& sp : cases) {
        GenerateOptions go;
        go.max_new_tokens = 40;
        go.sampling = sp;
        go.ignore_eos = true;
        std::vector<int> dev_ids, host_ids;
        be->reset();
        generate(
            *be, prompt, go, [](int) { return true; }, &dev_ids);
        host_be->reset();
        generate(
            *host_be, prompt, go, [](int) { return true; }, &host_ids);
        EXPECT_EQ(dev_ids, host_ids) << GetParam() << " top_k " << sp.top_k << " temp " << sp.temperature;
        EXPECT_EQ(dev_ids.size(), 40u);
    }
}

INSTANTIATE_TEST_SUITE_P(Families, CudaSampling, ::testing::Values("e2b", "e4b", "26b-a4b", "31b"),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                             std::string s = p.param;
                             std::replace(s.begin(), s.end(), '-', '_');
                             return s;
                         });

#else

TEST(CudaSampling, SkipsWithoutCuda) {
    GTEST_SKIP() << "no CUDA device: this build has no CUDA backend (MARKBASE_CUDA off or nvcc missing)";
}

#endif

}  // namespace
}  // namespace markbase
