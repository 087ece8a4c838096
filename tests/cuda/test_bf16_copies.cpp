// The bf16 copies a quantised model does without on the GPU (cuda/loader.h CopyDrop). A MoE's experts:
// decode, the batched step and the prompt chunks all read their FP8 or int4 rows, so the copy is never kept.
// The dense projections under --bf16-copy drop: decode reads the rows, and a prompt chunk's or a batched
// step's product dequantises them into a scratch first. These tests hold that the GPU then holds exactly the
// copies' bytes fewer (plus the scratch), that the host copy (the CPU reference of every other CUDA test)
// made again from the rows equals what the copy held, that a checkpoint quantised at load never uploads it
// and computes what the CPU computes, and that without the dense copy the model computes what it computes
// with it, bit for bit where both run cuBLAS. Without a GPU every test skips with the reason; the fit check's
// choice
// (--bf16-copy auto) runs everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cli/commands/model_options.h"
#include "loading/checkpoint.h"
#include "loading/random_checkpoint.h"
#include "model/int4.h"
#include "model/tensor_plan.h"
#include "runtime/backend.h"
#include "support/device_arrays.h"
#include "support/exact_options.h"
#include "support/logits_compare.h"
#include "support/require_cuda.h"
#include "support/tiny_models.h"
#ifdef MARKBASE_HAS_CUDA
#include <cuda_runtime.h>

#include "cuda/backend.h"
#include "cuda/kernels/kernels.h"
#include "cuda/loader.h"
#endif

namespace markbase {
namespace {

const char* format_name(WeightFormat f) {
    return f == WeightFormat::kInt4 ? "int4" : "fp8";
}

// Equal as values: the rewrite keeps the sign of a weight rounded to a zero code (-0), the rows do not.
size_t differing(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
    size_t n = 0;
    for (size_t i = 0; i < a.size(); ++i) n += testing::from_bf16(a[i]) != testing::from_bf16(b[i]);
    return n;
}

class Bf16Copies : public ::testing::TestWithParam<WeightFormat> {};

// dequantize_rows against quantize_rows' rewrite of the same weights: the values the freed copy held. Rows
// of 704 (the 26B-A4B's expert width: int4's last group half full) and 2816, with all-zero and outlier rows.
TEST_P(Bf16Copies, DequantizeRowsRemakesTheRewrite) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    const bool int4 = GetParam() == WeightFormat::kInt4;
    for (const int K : {704, 2816}) {
        constexpr int64_t kRows = 48;
        std::mt19937 rng(static_cast<uint32_t>(K));
        std::normal_distribution<float> nd(0.0f, 0.05f);
        std::vector<uint16_t> w(static_cast<size_t>(kRows * K));
        for (auto& v : w) v = testing::to_bf16(nd(rng));
        for (int k = 0; k < K; ++k) w[static_cast<size_t>(K + k)] = 0;  // row 1 all zero
        w[static_cast<size_t>(2 * K + 7)] = testing::to_bf16(40.0f);    // row 2 one outlier
        const int64_t G = int4_groups(K), qbytes = int4 ? kRows * K / 2 : kRows * K;
        const int64_t nscale = int4 ? kRows * G : kRows;
        uint16_t* dw = testing::to_device(w);
        uint8_t* q = testing::to_device(std::vector<uint8_t>(static_cast<size_t>(qbytes)));
        float* s = testing::to_device(std::vector<float>(static_cast<size_t>(nscale)));
        uint16_t* out = testing::to_device(std::vector<uint16_t>(w.size()));
        if (int4)
            cuda::quantize_rows_int4(dw, kRows, K, q, s, nullptr);
        else
            cuda::quantize_rows_fp8(dw, kRows, K, q, s, nullptr);
        cuda::dequantize_rows(q, s, nullptr, kRows, K, int4, out, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<uint16_t> rewrite = testing::to_host(dw, w.size()),
                                    remade = testing::to_host(out, w.size());
        EXPECT_EQ(differing(rewrite, remade), 0u) << "K " << K;
        size_t changed = 0;  // the rewrite is the quantised values, not the weights
        for (size_t i = 0; i < w.size(); ++i) changed += rewrite[i] != w[i];
        EXPECT_GT(changed, w.size() / 4) << "K " << K << ": quantize_rows left the weights as they were";
        for (void* p :
             {static_cast<void*>(dw), static_cast<void*>(q), static_cast<void*>(s), static_cast<void*>(out)})
            cudaFree(p);
    }
#endif
}

// The 26B-A4B at real widths, two layers, quantised on the device: with moe_gemm (every path reads the rows)
// the experts' copy goes; with it off (a prompt chunk's experts would go through the grouped GEMVs over bf16)
// it stays. The GPU holds exactly the copy's bytes fewer, and the host copies agree value for value.
TEST_P(Bf16Copies, TheCopyGoesWhereNothingReadsItAndComesBackFromTheRows) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    const WeightFormat f = GetParam();
    BackendOptions o;
    o.ctx_size = 64;
    o.weights = f;
    const auto dropped = make_synthetic_cuda_backend("26b-a4b", 2, o, 17);
    o.tuning.moe_gemm = false;
    const auto kept = make_synthetic_cuda_backend("26b-a4b", 2, o, 17);
    const ModelConfig& c = kept->config();
    const uint64_t copy = uint64_t{2} * 2 * static_cast<uint64_t>(c.n_experts) * 3 *
                          static_cast<uint64_t>(c.expert_width) * static_cast<uint64_t>(c.hidden);
    std::printf("  26b-a4b/2L %s: %.3f GB on the GPU with the experts' bf16 copy, %.3f without\n",
                format_name(f), kept->weight_bytes() / 1e9, dropped->weight_bytes() / 1e9);
    EXPECT_EQ(kept->weight_bytes() - dropped->weight_bytes(), copy);
    const auto a = copy_weights_to_host(*kept), b = copy_weights_to_host(*dropped);
    ASSERT_EQ(a->storage.size(), b->storage.size());
    size_t differ = 0;
    for (size_t t = 0; t < a->storage.size(); ++t) {
        ASSERT_EQ(a->storage[t].size(), b->storage[t].size());
        differ += differing(a->storage[t], b->storage[t]);
    }
    EXPECT_EQ(differ, 0u) << "the host copy of the experts is not the bf16 copy's values";
#endif
}

#ifdef MARKBASE_HAS_CUDA
// A tiny MoE checkpoint quantised at load, and three prompts whose routing on the CPU (its dequantised
// copy) is clear of a tie by more than the rows' rounding can move a router logit. Every prompt starts with
// BOS, whose position routes the same in every prompt, so a checkpoint whose BOS routing is near a tie has no
// such prompt: the checkpoint's seed is searched too. Six layers: five sliding, one full. At hidden 128 the
// GPU's batched step came 2.4e-3 from the CPU (FP8, an H100) and int4 0.127 with the routing clear by only
// 3e-3, so the margin is 1e-2 of the largest router logit (on the CPU, 0 to 8 prompts in 64 clear it a
// checkpoint).
struct ClearlyRouted {
    std::unique_ptr<Checkpoint> ck;
    std::vector<std::vector<int>> ids;    // [3][10]
    std::vector<std::vector<float>> ref;  // [3][V]: the CPU's logits after each prompt
};

ClearlyRouted clearly_routed_checkpoint(const std::filesystem::path& dir, WeightFormat f,
                                        const BackendOptions& o) {
    constexpr float kMargin = 1e-2f;
    for (uint64_t ck_seed = 31; ck_seed < 31 + 16; ++ck_seed) {
        write_random_checkpoint(dir, testing::tiny_int4_config("26b-a4b", 6), ck_seed);
        LoadOptions lo;
        lo.quantize = f;
        ClearlyRouted r;
        r.ck = load_checkpoint(dir, lo);
        auto cpu = make_cpu_backend(*r.ck, o);
        const int V = static_cast<int>(r.ck->config.vocab_size);
        std::vector<float> lg(static_cast<size_t>(V));
        for (uint32_t seed = 40; seed < 40 + 256 && r.ids.size() < 3; ++seed) {
            const std::vector<int> ids = testing::random_ids(10, V, seed);
            cpu->reset();
            cpu->eval(ids.data(), 10, lg.data(), false);
            if (cpu->router_margin() < kMargin) continue;
            r.ids.push_back(ids);
            r.ref.push_back(lg);
        }
        if (r.ids.size() == 3) return r;
    }
    ADD_FAILURE() << "no checkpoint seed in 16 has 3 prompts in 256 routed clear of a tie by " << kMargin;
    return {};
}
#endif

// The experts' copy of a checkpoint quantised at load is never uploaded (the GPU holds less than the same
// checkpoint with moe_gemm off), and the prompt and the batched step, which read the rows, agree with the
// CPU.
TEST_P(Bf16Copies, CheckpointQuantisedAtLoadNeverUploadsIt) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    const WeightFormat f = GetParam();
    testing::TempDir dir(std::string("expert-copy-") + format_name(f));
    BackendOptions o = testing::exact_options();
    o.ctx_size = 64;
    o.chunk = 16;
    o.kv_dtype = KvDtype::kF32;
    o.slots = 3;
    const ClearlyRouted r = clearly_routed_checkpoint(dir.path(), f, o);
    ASSERT_TRUE(r.ck);
    auto gpu = make_cuda_backend(*r.ck, o);
    BackendOptions ok = o;
    ok.tuning.moe_gemm = false;
    EXPECT_LT(gpu->weight_bytes(), make_cuda_backend(*r.ck, ok)->weight_bytes())
        << "the experts' copy was uploaded";
    const int64_t V = r.ck->config.vocab_size;
    double e_prompt = 0;  // each whole prompt as one chunk (moe_gemm) of a one-sequence backend
    std::vector<float> lg(3 * V);
    BackendOptions o1 = o;
    o1.slots = 1;
    auto one = make_cuda_backend(*r.ck, o1);
    for (int s = 0; s < 3; ++s) {
        one->reset();
        one->eval(r.ids[s].data(), 10, lg.data(), false);
        e_prompt =
            std::max(e_prompt, testing::rel_err(r.ref[s], std::vector<float>(lg.begin(), lg.begin() + V)));
    }
    for (int s = 0; s < 3; ++s) {
        gpu->slot_reset(s);
        gpu->slot_eval(s, r.ids[s].data(), 9);  // the batched step below takes the last token
    }
    std::vector<int> slots{0, 1, 2}, last{r.ids[0][9], r.ids[1][9], r.ids[2][9]};
    gpu->decode_batch(slots.data(), last.data(), 3, lg.data());
    double e = 0;
    for (int s = 0; s < 3; ++s)
        e = std::max(
            e, testing::rel_err(r.ref[s], std::vector<float>(lg.begin() + s * V, lg.begin() + (s + 1) * V)));
    std::printf("  tiny 26b-a4b %s at load: the prompts against the CPU %.2e, the batched step %.2e; %s\n",
                format_name(f), e_prompt, e, gpu->prefill_note().c_str());
    EXPECT_LT(e_prompt, 5e-3);
    EXPECT_LT(e, 5e-3);
#endif
}

// The dense projections without their copy (--bf16-copy drop) against the same random weights with it, both
// through cuBLAS only (stream_gemm=0, tile_gemm=0: over the scratch the products are cuBLAS's): a prompt's
// logits, decode steps and a batched step of 3 bit for bit, the GPU holding the copy's bytes less the
// scratch. E2B (PLE, KV-shared layers) and the 31B (k_eq_v full layers), two layers each.
TEST_P(Bf16Copies, DenseCopyDroppedComputesTheSameModel) {
    REQUIRE_CUDA();
#ifdef MARKBASE_HAS_CUDA
    const WeightFormat f = GetParam();
    for (const std::string v : {"e2b", "31b"}) {
        BackendOptions o = testing::exact_options();
        o.ctx_size = 64;
        o.chunk = 16;
        o.kv_dtype = KvDtype::kF32;
        o.slots = 3;
        o.weights = f;
        o.tuning.stream_gemm = 0;
        o.tuning.tile_gemm = 0;
        o.bf16_copy = Bf16Copy::kKeep;
        const auto keep = make_synthetic_cuda_backend(v, 2, o, 23);
        o.bf16_copy = Bf16Copy::kDrop;
        const auto drop = make_synthetic_cuda_backend(v, 2, o, 23);
        std::printf("  %s/2L %s: %.3f GB on the GPU with the bf16 copy, %.3f without\n", v.c_str(),
                    format_name(f), keep->weight_bytes() / 1e9, drop->weight_bytes() / 1e9);
        uint64_t copy = 0;  // every projection of the two layers (all of them have rows at real widths)
        for (const PlannedTensor& p : plan_tensors(keep->config(), nullptr)) {
            if (!p.quant_eligible || p.name.find("experts.") != std::string::npos) continue;
            uint64_t n = 2;
            for (int64_t d : p.shape) n *= static_cast<uint64_t>(d);
            copy += n;
        }
        EXPECT_EQ(keep->weight_bytes() - drop->weight_bytes(),
                  copy - cuda::dequant_scratch_bytes(keep->config()))
            << v;
        const int64_t V = keep->config().vocab_size;
        const std::vector<int> ids = testing::random_ids(20, static_cast<int>(V), 7);  // two chunks
        std::vector<float> a(20 * V), b(20 * V);
        keep->eval(ids.data(), 20, a.data(), true);
        drop->eval(ids.data(), 20, b.data(), true);
        EXPECT_EQ(a, b) << v << ": the prompt's logits differ";
        for (int t = 0; t < 3; ++t) {  // decode reads the rows either way
            keep->eval(&ids[t], 1, a.data(), false);
            drop->eval(&ids[t], 1, b.data(), false);
            EXPECT_TRUE(std::equal(a.begin(), a.begin() + V, b.begin())) << v << ": decode step " << t;
        }
        std::vector<int> slots{0, 1, 2}, last{ids[3], ids[5], ids[8]};
        for (auto* be : {keep.get(), drop.get()})
            for (int s = 0; s < 3; ++s) {
                be->slot_reset(s);
                be->slot_eval(s, ids.data() + 4 * s, 5 + s);
            }
        keep->decode_batch(slots.data(), last.data(), 3, a.data());
        drop->decode_batch(slots.data(), last.data(), 3, b.data());
        EXPECT_TRUE(std::equal(a.begin(), a.begin() + 3 * V, b.begin())) << v << ": the batched step differs";
        EXPECT_TRUE(std::all_of(b.begin(), b.begin() + 3 * V, [](float x) { return std::isfinite(x); }));
    }
#endif
}

INSTANTIATE_TEST_SUITE_P(Formats, Bf16Copies, ::testing::Values(WeightFormat::kFp8, WeightFormat::kInt4),
                         [](const ::testing::TestParamInfo<WeightFormat>& p) {
                             return std::string(format_name(p.param));
                         });

#ifdef MARKBASE_HAS_CUDA
// --bf16-copy auto (load_model's fit check, no GPU needed): with room the copy is kept; where only dropping
// it makes the model fit, it goes, with a note; where neither fits, the fit check's error. The two thresholds
// differ by exactly the dense copy's bytes less the scratch its products dequantise into.
TEST(Bf16CopyFit, AutoKeepsTheCopyWhereItFitsAndDropsItWhereOnlyThatFits) {
    testing::TempDir dir("bf16-copy-fit");
    write_random_checkpoint(dir.path(), testing::tiny_int4_config("e4b"), 5);
    LoadOptions lo;
    lo.quantize = WeightFormat::kFp8;
    const auto ck = load_checkpoint(dir.path(), lo);
    BackendOptions b;
    b.ctx_size = 256;
    const auto least = [&](Bf16Copy c) {  // the fewest free bytes the model fits in with that choice
        b.bf16_copy = c;
        uint64_t lo_b = 0, hi_b = uint64_t{1} << 40;
        while (hi_b - lo_b > 1) {
            const uint64_t mid = lo_b + (hi_b - lo_b) / 2;
            bool fits = true;
            try {
                cli::fit_cuda_model(*ck, b, mid, "a GPU");
            } catch (const Error&) {
                fits = false;
            }
            (fits ? hi_b : lo_b) = mid;
        }
        return hi_b;
    };
    const uint64_t with_copy = least(Bf16Copy::kKeep), without = least(Bf16Copy::kDrop);
    Weights w = cuda::rows_on_device(ck->config, ck->weights, ck->format);
    uint64_t copy = 0;
    for (const PlannedTensor& p : plan_bound_tensors(ck->config, w)) {
        if (!cuda::copy_dropped(w, p, {false, true})) continue;
        uint64_t n = 2;
        for (int64_t d : p.shape) n *= static_cast<uint64_t>(d);
        copy += n;
    }
    const uint64_t scratch = cuda::dequant_scratch_bytes(ck->config);
    std::printf("  fits in %llu bytes with the copy, %llu without (copy %llu, scratch %llu)\n",
                static_cast<unsigned long long>(with_copy), static_cast<unsigned long long>(without),
                static_cast<unsigned long long>(copy), static_cast<unsigned long long>(scratch));
    ASSERT_GT(copy, scratch) << "no projection's copy would go";
    EXPECT_NEAR(static_cast<double>(with_copy - without), static_cast<double>(copy - scratch), 16.0);

    b.bf16_copy = Bf16Copy::kAuto;
    const cli::CudaFitChoice roomy = cli::fit_cuda_model(*ck, b, with_copy, "a GPU");
    EXPECT_EQ(roomy.copy, Bf16Copy::kKeep);
    EXPECT_TRUE(roomy.note.empty()) << roomy.note;
    const cli::CudaFitChoice tight = cli::fit_cuda_model(*ck, b, (with_copy + without) / 2, "a GPU");
    EXPECT_EQ(tight.copy, Bf16Copy::kDrop);
    EXPECT_NE(tight.note.find("bf16 copy does not fit"), std::string::npos) << tight.note;
    EXPECT_NE(tight.note.find("--bf16-copy keep"), std::string::npos) << tight.note;
    try {
        cli::fit_cuda_model(*ck, b, without - 1, "a GPU");
        ADD_FAILURE() << "a model that does not fit even without its copy was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("free on a GPU"), std::string::npos) << e.what();
    }
    b.bf16_copy = Bf16Copy::kKeep;  // asked to keep it: refused rather than dropped
    EXPECT_THROW(cli::fit_cuda_model(*ck, b, (with_copy + without) / 2, "a GPU"), Error);

    const auto plain = load_checkpoint(dir.path());  // bf16: nothing to drop, one threshold
    b.bf16_copy = Bf16Copy::kAuto;
    EXPECT_EQ(cli::fit_cuda_model(*plain, b, uint64_t{1} << 40, "a GPU").copy, Bf16Copy::kKeep);
}
#endif

}  // namespace
}  // namespace markbase
