// The CUDA backend must compute the CPU backend's function. Tiny random checkpoints of every family exercise
// every code path (PLE, KV sharing, k_eq_v, MoE, sliding rings wrapping inside a prefill chunk, the decode
// graph, device-side greedy decoding); synthetic models at real widths (weights drawn on the GPU, copied back
// for the CPU) exercise the real head dims, expert counts and the 262144-row lm_head. Activations and the KV
// cache are fp32 on both sides, so agreement is expected far inside bf16 tolerance: the error is reported as
// max|diff| / max|logit|. Without a GPU every test skips with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "loading/checkpoint.h"
#include "loading/random_checkpoint.h"
#include "model/error.h"
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

std::string param_name(const ::testing::TestParamInfo<std::string>& p) {
    return testing::test_name(p.param);
}

#ifdef MARKBASE_HAS_CUDA

int argmax(const float* v, int64_t n) {
    return static_cast<int>(std::max_element(v, v + n) - v);
}

// top-1 minus top-2
float margin(const float* v, int64_t n) {
    float a = -INFINITY, b = -INFINITY;
    for (int64_t i = 0; i < n; ++i) {
        if (v[i] > a) {
            b = a;
            a = v[i];
        } else if (v[i] > b) {
            b = v[i];
        }
    }
    return a - b;
}

using testing::all_logits;
using testing::random_ids;
using testing::rel_err;

// Greedy chains: CPU from its prefill logits, CUDA on the device. Compared while the CPU's top-1 margin is
// clear.
void expect_same_greedy(Backend& cpu, CudaBackend& gpu, const std::vector<int>& prompt, int steps,
                        float min_margin, int min_steps = 6) {
    const int64_t V = cpu.config().vocab_size;
    std::vector<float> lg(V), lg_gpu(V);
    cpu.reset();
    gpu.reset();
    cpu.eval(prompt.data(), static_cast<int64_t>(prompt.size()), lg.data(), false);
    gpu.eval(prompt.data(), static_cast<int64_t>(prompt.size()), lg_gpu.data(), false);
    std::vector<int> cpu_ids;
    std::vector<float> margins;
    int next = argmax(lg.data(), V);
    ASSERT_EQ(next, argmax(lg_gpu.data(), V)) << "prefill argmax differs";
    for (int s = 0; s < steps; ++s) {
        cpu.eval(&next, 1, lg.data(), false);
        margins.push_back(margin(lg.data(), V));
        next = argmax(lg.data(), V);
        cpu_ids.push_back(next);
    }
    const std::vector<int> gpu_ids = gpu.decode_greedy(steps, nullptr);
    ASSERT_EQ(gpu_ids.size(), cpu_ids.size());
    // Past a step whose top two logits are closer than rounding can separate, the chains may part; every
    // step before it must agree, and a comparison must cover at least `min_steps` steps (or the test would
    // pass having compared nothing).
    int compared = 0;
    for (; compared < steps && margins[compared] >= min_margin; ++compared)
        ASSERT_EQ(gpu_ids[compared], cpu_ids[compared])
            << "greedy step " << compared << " (margin " << margins[compared] << ")";
    if (compared < steps)
        std::printf("  greedy: step %d margin %.2e below %.2e, chains compared up to here\n", compared,
                    margins[compared], min_margin);
    EXPECT_GE(compared, min_steps) << "too few greedy steps had a clear winner to compare";
}

// Prefill, chunked prefill, the decode graph per token, greedy decoding, truncate, a profiled step.
void check_tiny(const std::string& family, const std::string& label,
                const Tuning& tuning = testing::exact_tuning()) {
    testing::TempDir dir("cuda-" + family);
    write_random_checkpoint(dir.path(), testing::tiny_config(family), 7);
    auto ck = load_checkpoint(dir.path());
    const std::vector<int> ids = random_ids(23, 256, 42);  // > 5 windows of 4

    BackendOptions o = testing::exact_options();
    o.ctx_size = 512;
    o.chunk = 64;
    o.threads = 2;
    o.tuning = tuning;
    o.kv_dtype = KvDtype::kF32;  // the exact cache: compared with the CPU backend's fp32 products
    auto cpu = make_cpu_backend(*ck, o);
    const std::vector<float> ref = all_logits(*cpu, ids, false);
    float mx = 0;
    for (float v : ref) mx = std::max(mx, std::fabs(v));
    ASSERT_GT(mx, 0.1f) << "logits are suspiciously flat";

    auto gpu = make_cuda_backend(*ck, o);
    BackendOptions oc = o;
    oc.chunk = 5;  // sliding rings wrap inside and across chunks
    auto gpu_chunked = make_cuda_backend(*ck, oc);

    const double e_batch = rel_err(ref, all_logits(*gpu, ids, false));
    const double e_chunk = rel_err(ref, all_logits(*gpu_chunked, ids, false));
    const double e_decode =
        rel_err(ref, all_logits(*gpu, ids, true));  // the captured decode graph, per token
    std::printf("  %s%s: rel err prefill %.2e, chunked %.2e, graph decode %.2e\n", family.c_str(),
                label.c_str(), e_batch, e_chunk, e_decode);
    EXPECT_LT(e_batch, 1e-3);
    EXPECT_LT(e_chunk, 1e-3);
    EXPECT_LT(e_decode, 1e-3);

    expect_same_greedy(*cpu, *gpu, std::vector<int>(ids.begin(), ids.begin() + 9), 12, 1e-3f * mx);

    // truncate and continue differently, as interactive chat does
    {
        const int64_t V = ck->config.vocab_size;
        cpu->reset();
        gpu->reset();
        cpu->eval(ids.data(), 15, nullptr, false);
        gpu->eval(ids.data(), 15, nullptr, false);
        ASSERT_EQ(cpu->truncate(12), gpu->truncate(12));
        const std::vector<int> tail{5, 6, 7};
        std::vector<float> a(3 * V), b(3 * V);
        cpu->eval(tail.data(), 3, a.data(), true);
        gpu->eval(tail.data(), 3, b.data(), true);
        EXPECT_LT(rel_err(a, b), 1e-3) << "after truncate";
    }

    // a profiled step is a real step: it must leave the chain where decode_greedy would
    gpu->reset();
    gpu->eval(ids.data(), 9, nullptr, false);
    const auto prof = gpu->profile_step();
    ASSERT_FALSE(prof.empty());
    double total = 0;
    for (const auto& e : prof) total += e.ms;
    EXPECT_GT(total, 0.0);
    EXPECT_TRUE(gpu->profile_gated()) << "a tiny step enqueues well within the gate's 2 s";
    EXPECT_EQ(gpu->n_past(), 10);

    // the profiled prefill is a real prefill: the same next token as an ordinary one, every layer's phases
    const auto pp = gpu->profile_prefill(ids.data(), 9);
    std::map<std::string, int> phases;
    for (const auto& e : pp) {
        ++phases[e.kernel];
        EXPECT_GE(e.ms, 0.0) << e.kernel;
    }
    EXPECT_EQ(phases["attention"], ck->config.n_layers);
    EXPECT_EQ(phases["lm_head"], 1);
    EXPECT_EQ(phases.count("experts"), ck->config.moe ? 1u : 0u);
    EXPECT_EQ(gpu->n_past(), 9);
    const std::vector<int> after_profile = gpu->decode_greedy(3, nullptr);
    gpu->reset();
    gpu->eval(ids.data(), 9, nullptr, false);
    EXPECT_EQ(gpu->decode_greedy(3, nullptr), after_profile);
    EXPECT_THROW(gpu->profile_prefill(ids.data(), o.chunk + 1), Error) << "more than a chunk";
}

// Long enough that prefill attention runs several 128-key tiles per piece and several pieces per head, and
// that decode spreads full layers over many pieces merged by the last one.
void check_long(const std::string& family, const std::string& label,
                const Tuning& tuning = testing::exact_tuning()) {
    testing::TempDir dir("cuda-long-" + family);
    write_random_checkpoint(dir.path(), testing::tiny_config(family), 13);
    auto ck = load_checkpoint(dir.path());
    const std::vector<int> ids = random_ids(300, 256, 9);
    BackendOptions o = testing::exact_options();
    o.ctx_size = 512;
    o.chunk = 160;  // two prefill chunks; the second one's queries see up to 300 keys
    o.threads = 2;
    o.tuning = tuning;
    o.kv_dtype = KvDtype::kF32;  // the exact cache: compared with the CPU backend's fp32 products
    auto cpu = make_cpu_backend(*ck, o);
    auto gpu = make_cuda_backend(*ck, o);
    const int64_t V = ck->config.vocab_size;
    std::vector<float> ref(V), got(V);
    cpu->eval(ids.data(), 300, ref.data(), false);
    gpu->eval(ids.data(), 300, got.data(), false);
    const double e_prefill = rel_err(ref, got);
    double e_decode = 0;
    int next = argmax(ref.data(), V);
    for (int s = 0; s < 40; ++s) {
        cpu->eval(&next, 1, ref.data(), false);
        gpu->eval(&next, 1, got.data(), false);
        e_decode = std::max(e_decode, rel_err(ref, got));
        next = argmax(ref.data(), V);
    }
    std::printf("  %s%s long: rel err prefill(300) %.2e, graph decode to 340 %.2e\n", family.c_str(),
                label.c_str(), e_prefill, e_decode);
    EXPECT_LT(e_prefill, 1e-4);  // measured: 2e-6 to 5e-6 on every variant and switch
    EXPECT_LT(e_decode, 1e-4);
}

#endif

class CudaTiny : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaTiny, MatchesCpuPrefillChunkedDecodeAndGreedy) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    check_tiny(GetParam(), "");
#endif
}

TEST_P(CudaTiny, MatchesCpuOverLongContexts) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    check_long(GetParam(), "");
#endif
}

INSTANTIATE_TEST_SUITE_P(Families, CudaTiny, ::testing::Values("e2b", "e4b", "26b-a4b", "31b"), param_name);

// Tuning settings both lists below run (runtime/tuning.h): each GEMV kernel and both decode graphs on every
// family, whatever its default, and prefill attention in head and row batches.
const char* const kCommonTunings[] = {
    "gemv=rows",
    "gemv=async_geglu",
    "attn_cluster=0",
    "attn_cluster=1",
    "gemv=async_geglu,attn_cluster=1",
    "attn_gemm_rows=16",
};
std::vector<std::string> with_common(std::initializer_list<const char*> own) {
    std::vector<std::string> v(own.begin(), own.end());
    v.insert(v.end(), std::begin(kCommonTunings), std::end(kCommonTunings));
    return v;
}

// Every family's tiny model through the same checks under each tuning, in this process; the prefill
// attention's scratch in batches of heads and rows.
const std::vector<std::string> kTinyTunings = with_common({
    "attn_gemm_rows=40",
});

using SwitchParam = std::tuple<std::string, std::string>;  // family, setting
class CudaTinySwitches : public ::testing::TestWithParam<SwitchParam> {};

TEST_P(CudaTinySwitches, MatchesCpu) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    const auto& [family, setting] = GetParam();
    const Tuning t = testing::exact_tuning(setting);
    check_tiny(family, " [" + setting + "]", t);
    check_long(family, " [" + setting + "]", t);
#endif
}

std::string switch_name(const ::testing::TestParamInfo<SwitchParam>& p) {
    return testing::test_name(std::get<0>(p.param) + "_" + std::get<1>(p.param));
}

INSTANTIATE_TEST_SUITE_P(Families, CudaTinySwitches,
                         ::testing::Combine(::testing::Values(std::string("e2b"), std::string("e4b"),
                                                              std::string("26b-a4b"), std::string("31b")),
                                            ::testing::ValuesIn(kTinyTunings)),
                         switch_name);

// attn_cluster=1 where clusters cannot be scheduled is refused by name; elsewhere it builds.
TEST(CudaTuning, AClusterAskedForIsBuiltOrRefusedByName) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    testing::TempDir dir("cuda-tuning");
    write_random_checkpoint(dir.path(), testing::tiny_config("e2b"), 7);
    auto ck = load_checkpoint(dir.path());
    BackendOptions o = testing::exact_options();
    o.ctx_size = 64;
    o.chunk = 8;
    o.tuning = testing::exact_tuning("attn_cluster=1");
    if (cuda_device_info().cc_major >= 9) {
        EXPECT_NO_THROW(make_cuda_backend(*ck, o));
    } else {
        try {
            make_cuda_backend(*ck, o);
            ADD_FAILURE() << "attn_cluster=1 was accepted before sm_90";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("attn_cluster=1"), std::string::npos) << e.what();
        }
    }
#endif
}

// Real widths: head dims 256/512, 128 experts, the full vocabulary. Few layers keep the CPU side quick.
class CudaSynthetic : public ::testing::TestWithParam<std::string> {};

#ifdef MARKBASE_HAS_CUDA
// The CPU side is the slow part and the same for every switch setting (the synthetic weights depend only on
// the variant and the seed): computed once per variant and kept.
struct SyntheticRef {
    std::vector<int> ids;                    // the prompt, then the CPU's greedy tokens fed at decode
    std::vector<std::vector<float>> logits;  // after the prompt, then after each decode step
    float router_margin = INFINITY;          // the CPU's (MoE): closest 8th/9th expert router logits
};

// Router logits closer than this (relative to the token's largest) may be ordered differently by two
// backends' roundings: their inputs differ by up to ~1e-4 relative after a few layers.
constexpr float kRouterMargin = 1e-3f;

void check_synthetic(const std::string& v, const std::string& label,
                     const Tuning& tuning = testing::exact_tuning()) {
    const int layers = v == "e2b" ? 10 : v == "e4b" ? 7 : 2;
    constexpr int kPrompt = 12, kSteps = 3;
    BackendOptions o = testing::exact_options();
    o.ctx_size = 64;
    o.chunk = 32;
    o.tuning = tuning;
    o.kv_dtype = KvDtype::kF32;  // the exact cache: compared with the CPU backend's fp32 products
    auto gpu = make_synthetic_cuda_backend(v, layers, o, 99);
    const int64_t V = gpu->config().vocab_size;
    static std::map<std::string, SyntheticRef> refs;
    if (!refs.count(v)) {
        auto host = copy_weights_to_host(*gpu);
        auto cpu = make_cpu_backend(host->checkpoint, o);
        // MoE: a prompt whose every routing decision (prompt and decode steps) is clear of a tie between
        // the 8th and 9th expert by kRouterMargin, so that rounding cannot flip a choice and the logits can
        // be held to the dense models' bound.
        SyntheticRef r;
        for (uint32_t seed = 5; seed < 5 + 64; ++seed) {
            r = SyntheticRef{};
            cpu->reset();
            r.ids = random_ids(kPrompt, static_cast<int>(V), seed);
            std::vector<float> lg(V);
            cpu->eval(r.ids.data(), kPrompt, lg.data(), false);
            r.logits.push_back(lg);
            for (int s = 0; s < kSteps; ++s) {
                const int next = argmax(lg.data(), V);
                r.ids.push_back(next);
                cpu->eval(&next, 1, lg.data(), false);
                r.logits.push_back(lg);
            }
            r.router_margin = cpu->router_margin();
            if (r.router_margin >= kRouterMargin) break;
        }
        std::printf("  %s: reference prompt's router margin %.3g\n", v.c_str(), r.router_margin);
        ASSERT_GE(r.router_margin, kRouterMargin) << "no prompt in 64 routes clear of a tie";
        refs[v] = std::move(r);
    }
    const SyntheticRef& r = refs[v];

    std::vector<float> got(V);
    gpu->eval(r.ids.data(), kPrompt, got.data(), false);
    const double e_prefill = rel_err(r.logits[0], got);
    double e_decode = 0;
    for (int s = 0; s < kSteps; ++s) {
        gpu->eval(&r.ids[kPrompt + s], 1, got.data(), false);
        e_decode = std::max(e_decode, rel_err(r.logits[s + 1], got));
    }
    std::printf("  %s/%dL%s: rel err prefill %.2e, graph decode %.2e\n", v.c_str(), layers, label.c_str(),
                e_prefill, e_decode);
    EXPECT_LT(e_prefill, 1e-4);  // measured: 2e-6 to 5e-6 on every variant and switch
    EXPECT_LT(e_decode, 1e-4);
}
#endif

TEST_P(CudaSynthetic, MatchesCpuAtRealWidths) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    check_synthetic(GetParam(), "");
#endif
}

INSTANTIATE_TEST_SUITE_P(Variants, CudaSynthetic,
                         ::testing::Values("e2b", "e4b", "12b", "26b-a4b", "26b-standard", "31b"),
                         param_name);

// The tunings at real widths (head dims 256/512, 128 experts), and the MoE prefill's experts through the
// grouped GEMV kernels instead of moe_gemm.
const std::vector<std::string> kSyntheticTunings = with_common({
    "moe_gemm=0",
});
class CudaSyntheticSwitches : public ::testing::TestWithParam<SwitchParam> {};

TEST_P(CudaSyntheticSwitches, MatchesCpuAtRealWidths) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    const auto& [variant, setting] = GetParam();
    check_synthetic(variant, " [" + setting + "]", testing::exact_tuning(setting));
#endif
}

INSTANTIATE_TEST_SUITE_P(Variants, CudaSyntheticSwitches,
                         ::testing::Combine(::testing::Values(std::string("e2b"), std::string("e4b"),
                                                              std::string("26b-a4b"), std::string("31b")),
                                            ::testing::ValuesIn(kSyntheticTunings)),
                         switch_name);

#ifdef MARKBASE_HAS_CUDA
// A synthetic model at real widths (two layers) under the tuning `setting`: its logits after a prompt of
// random ids, then after each greedy decode step, one after another.
std::vector<float> synthetic_chain(const char* variant, BackendOptions o, uint64_t seed,
                                   const std::string& setting, int prompt, int steps, int layers = 2,
                                   uint32_t prompt_seed = 5) {
    o.tuning = testing::exact_tuning(setting);
    auto gpu = make_synthetic_cuda_backend(variant, layers, o, seed);
    const int64_t V = gpu->config().vocab_size;
    const std::vector<int> ids = random_ids(prompt, static_cast<int>(V), prompt_seed);
    std::vector<float> lg(V), all;
    gpu->eval(ids.data(), prompt, lg.data(), false);
    all.insert(all.end(), lg.begin(), lg.end());
    for (int s = 0; s < steps; ++s) {
        const int next = argmax(lg.data(), V);
        gpu->eval(&next, 1, lg.data(), false);
        all.insert(all.end(), lg.begin(), lg.end());
    }
    return all;
}

// The first prompt seed (from 5) whose chain on synthetic_chain's weights the CPU routes clear of any tie
// between the 8th and 9th expert by `margin` (relative), prompt and greedy steps alike: two GPU variants that
// agree to ~1e-6 then choose the same experts, and their logits can be held to the dense models' bound.
uint32_t clear_routing_seed(const char* variant, const BackendOptions& o, uint64_t seed, int prompt,
                            int steps, int layers, float margin) {
    auto gpu = make_synthetic_cuda_backend(variant, layers, o, seed);
    auto host = copy_weights_to_host(*gpu);
    auto cpu = make_cpu_backend(host->checkpoint, o);
    const int64_t V = cpu->config().vocab_size;
    std::vector<float> lg(V);
    float best = 0.0f;
    for (uint32_t ps = 5; ps < 5 + 16; ++ps) {
        cpu->reset();
        const std::vector<int> ids = random_ids(prompt, static_cast<int>(V), ps);
        cpu->eval(ids.data(), prompt, lg.data(), false);
        for (int s = 0; s < steps; ++s) {
            const int next = argmax(lg.data(), V);
            cpu->eval(&next, 1, lg.data(), false);
        }
        best = std::max(best, cpu->router_margin());
        if (cpu->router_margin() >= margin) {
            std::printf("  %s: prompt seed %u routes with margin %.3g\n", variant, ps, cpu->router_margin());
            return ps;
        }
    }
    ADD_FAILURE() << variant << ": no prompt in 16 routes clear of a tie by " << margin << " (best " << best
                  << ")";
    return 5;
}

// Two GPU variants' MoE logits agree to ~1e-6 relative: router logits closer than this may be ordered
// differently by the two.
constexpr float kVariantRouterMargin = 1e-5f;

#endif

// Prefill attention runs as cuBLAS GEMMs (attention_gemm.cu): S = Q K^T per head, a masked softmax, P V,
// heads and query rows in batches where the scores' scratch cannot hold them all (long key ranges). Four
// 272-token chunks at a context of 1200: on E2B and E4B (window 512, a ring of 784 slots) the last chunk's
// key slots wrap around the ring. attn_gemm_rows=40 leaves room for 40 rows of scores, so each head runs
// alone and in batches of query rows: the same products in other batches, so the logits agree to float
// rounding.
TEST(CudaAttnGemm, RowBatchesMatchOneBatch) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    BackendOptions o = testing::exact_options();
    o.ctx_size = 1200;
    o.chunk = 272;
    for (const char* v : {"e2b", "e4b", "26b-a4b", "31b"}) {
        const bool moe = std::string(v) == "26b-a4b";
        const uint32_t ps = moe ? clear_routing_seed(v, o, 47, 1088, 2, 2, kVariantRouterMargin) : 5;
        const auto base = synthetic_chain(v, o, 47, "", 1088, 2, 2, ps);
        for (const char* s : {"attn_gemm_rows=40", "attn_gemm_rows=16"}) {
            const auto got = synthetic_chain(v, o, 47, s, 1088, 2, 2, ps);
            ASSERT_EQ(base.size(), got.size());
            const double e = rel_err(base, got);
            std::printf("  %s [%s]: against one batch, rel err %.2e\n", v, s, e);
            EXPECT_LT(e, 1e-4) << v << " " << s;
        }
    }
#endif
}

}  // namespace
}  // namespace markbase
