// FP8 checkpoints as published (compressed-tensors, written here by hand: support/quant_checkpoints.h) and
// made at load (--quantize fp8): the FP8 form lands where model/weights.h says, and the bf16 slots hold
// exactly the dequantised values, so the CPU backend's logits equal those of a bf16 checkpoint of the same
// values bit for bit. Errors: tests/loading/test_fp8_errors.cpp.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "loading/quant_checkpoint.h"
#include "loading/random_checkpoint.h"
#include "model/fp8.h"
#include "model/tensor_plan.h"
#include "support/quant_checkpoints.h"
#include "support/tiny_models.h"

namespace markbase {
namespace {

namespace fs = std::filesystem;
using testing::expect_same_bf16;
using testing::expect_same_logits;
using testing::file_bytes;
using testing::Fp8Layout;

const fs::path kModel = fs::path(MARKBASE_TEST_DATA) / ".." / ".." / "models" / "default";

bool has(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

// The scale of each of `rows` rows as the file gives it (F32 per row, or one BF16/F32 value for the tensor).
std::vector<float> file_scales(const Checkpoint& ck, const std::string& module, int64_t rows) {
    const TensorInfo& t = ck.files.get(module + ".weight_scale");
    std::vector<float> out(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = t.numel() == 1 ? 0 : r;
        if (t.dtype == DType::BF16) {
            bf16 v;
            std::memcpy(&v, t.data + 2 * i, 2);
            out[r] = bf16_to_float(v);
        } else {
            std::memcpy(&out[r], t.data + 4 * i, 4);
        }
    }
    return out;
}

bool per_layer(const std::string& name) {
    return has(name, "per_layer");
}

TEST(Fp8Checkpoint, PublishedChannelAndTensorScalesLoadAsTheirDequantisedValues) {
    testing::TempDir dir("fp8_published");
    const ModelConfig c = load_checkpoint(kModel)->config;
    const std::string down2 = c.weight_prefix + "layers.2.mlp.down_proj";  // one scale for the matrix
    Fp8Layout layout;
    layout.quantized = [](const std::string& n) { return !per_layer(n); };
    layout.per_tensor = {down2 + ".weight"};
    layout.ignore = {"lm_head", "re:.*per_layer.*"};
    testing::write_fp8_copy(kModel, dir.path() / "fp8", dir.path() / "ref", layout);
    const auto fp8 = load_checkpoint(dir.path() / "fp8");
    const auto ref = load_checkpoint(dir.path() / "ref");

    EXPECT_EQ(fp8->format, WeightFormat::kFp8);
    EXPECT_EQ(ref->format, WeightFormat::kBf16);
    EXPECT_TRUE(ref->weights.quant.empty());
    ASSERT_EQ(fp8->weights.quant.size(), static_cast<size_t>(c.n_layers));
    for (int i = 0; i < c.n_layers; ++i) {
        const LayerWeights& l = fp8->weights.layers[i];
        const LayerQuant& f = fp8->weights.quant[i];
        EXPECT_EQ(f.k_proj.q != nullptr, l.k_proj != nullptr) << "layer " << i;
        EXPECT_EQ(f.v_proj.q != nullptr, l.v_proj != nullptr) << "layer " << i;
        EXPECT_EQ(f.experts_gate_up.q, nullptr);
        // the FP8 rows are the file's bytes, the scales one per row (a tensor's scale on every row)
        for (const auto& [m, name] :
             std::vector<std::pair<const QuantMatrix*, std::string>>{{&f.q_proj, "self_attn.q_proj"},
                                                                     {&f.o_proj, "self_attn.o_proj"},
                                                                     {&f.down_proj, "mlp.down_proj"}}) {
            const std::string module = c.weight_prefix + "layers." + std::to_string(i) + "." + name;
            const std::vector<uint8_t> want = file_bytes(*fp8, module + ".weight");
            ASSERT_NE(m->q, nullptr) << module;
            EXPECT_EQ(std::memcmp(m->q, want.data(), want.size()), 0) << module;
            const int64_t rows = fp8->files.get(module + ".weight").shape[0];
            const std::vector<float> scales = file_scales(*fp8, module, rows);
            EXPECT_EQ(std::memcmp(m->scale, scales.data(), scales.size() * 4), 0) << module;
        }
        // the PLE matrices the config ignores are the file's bf16
        EXPECT_FALSE(fp8->owned.holds(l.ple_gate));
        EXPECT_EQ(
            static_cast<const void*>(l.ple_gate),
            fp8->files.get(c.weight_prefix + "layers." + std::to_string(i) + ".per_layer_input_gate.weight")
                .data);
    }
    EXPECT_EQ(fp8->files.get(down2 + ".weight_scale").shape, std::vector<int64_t>{});
    expect_same_bf16(*fp8, *ref);
    expect_same_logits(*fp8, *ref);
    const std::string summary = weight_format_summary(*fp8);
    EXPECT_TRUE(has(summary, "FP8 e4m3 with per-row scales") && has(summary, "mlp.down_proj")) << summary;
    EXPECT_TRUE(has(summary, "bf16: embeddings, norms, per_layer_model_projection")) << summary;
    EXPECT_EQ(weight_format_summary(*ref), "bf16");
}

TEST(Fp8Checkpoint, PleMatricesStoredFp8AreDequantisedAndInputScalesSetAside) {
    testing::TempDir dir("fp8_ple");
    Fp8Layout layout;
    layout.quantized = [](const std::string&) { return true; };
    layout.input_scales = true;
    testing::write_fp8_copy(kModel, dir.path() / "fp8", dir.path() / "ref", layout);
    const auto fp8 = load_checkpoint(dir.path() / "fp8");
    const auto ref = load_checkpoint(dir.path() / "ref");
    EXPECT_EQ(fp8->format, WeightFormat::kFp8);
    for (const LayerWeights& l : fp8->weights.layers) {
        EXPECT_TRUE(fp8->owned.holds(l.ple_gate)) << "dequantised: no FP8 form, a bf16 copy of the values";
        EXPECT_TRUE(fp8->owned.holds(l.ple_proj));
    }
    EXPECT_TRUE(fp8->owned.holds(fp8->weights.ple_model_proj));
    expect_same_bf16(*fp8, *ref);
    expect_same_logits(*fp8, *ref);

    int input_scales = 0;
    for (const std::string& s : fp8->skipped) input_scales += has(s, ".input_scale");
    EXPECT_GT(input_scales, 0);
    ASSERT_EQ(fp8->notes.size(), 1u);
    EXPECT_TRUE(has(fp8->notes[0], std::to_string(input_scales) + " static activation scales (input_scale)"))
        << fp8->notes[0];
    bool grouped = false;
    for (const auto& [kind, n] : skipped_groups(*fp8))
        grouped = grouped || (has(kind, "input_scale") && n == size_t(input_scales));
    EXPECT_TRUE(grouped);
    EXPECT_TRUE(
        has(weight_format_summary(*fp8), "stored FP8, dequantised to bf16: per_layer_model_projection"))
        << weight_format_summary(*fp8);
}

TEST(Fp8Checkpoint, QuantiseAtLoadEqualsTheSameQuantisationPublished) {
    testing::TempDir dir("fp8_quantize");
    Fp8Layout layout;  // what --quantize makes: every LayerQuant matrix per channel, the PLE matrices bf16
    layout.quantized = [](const std::string& n) { return !per_layer(n); };
    layout.ignore = {"re:.*per_layer.*"};
    testing::write_fp8_copy(kModel, dir.path() / "fp8", dir.path() / "ref", layout);
    const auto published = load_checkpoint(dir.path() / "fp8");
    const auto quantized = load_checkpoint(kModel, LoadOptions{.quantize = WeightFormat::kFp8});
    EXPECT_EQ(quantized->format, WeightFormat::kFp8);
    EXPECT_TRUE(quantized->notes.empty());
    ASSERT_EQ(quantized->weights.quant.size(), published->weights.quant.size());
    Weights wq = quantized->weights, wp = published->weights;
    const std::vector<PlannedTensor> pq = plan_bound_tensors(quantized->config, wq);
    const std::vector<PlannedTensor> pp = plan_bound_tensors(published->config, wp);
    int matrices = 0;
    for (size_t i = 0; i < pq.size(); ++i) {
        ASSERT_EQ(pq[i].quant == nullptr, pp[i].quant == nullptr) << pq[i].name;
        if (!pq[i].quant) continue;
        const int64_t rows = pq[i].shape[0], K = pq[i].shape[1];
        ASSERT_NE(pq[i].quant->q, nullptr) << pq[i].name;
        EXPECT_EQ(std::memcmp(pq[i].quant->q, pp[i].quant->q, static_cast<size_t>(rows * K)), 0)
            << pq[i].name;
        EXPECT_EQ(std::memcmp(pq[i].quant->scale, pp[i].quant->scale, static_cast<size_t>(rows) * 4), 0)
            << pq[i].name;
        ++matrices;
    }
    EXPECT_GT(matrices, 0);
    expect_same_bf16(*quantized, *published);
    expect_same_logits(*quantized, *published);

    // an FP8 checkpoint is not quantised again
    const auto again = load_checkpoint(dir.path() / "fp8", LoadOptions{.quantize = WeightFormat::kFp8});
    ASSERT_EQ(again->notes.size(), 1u);
    EXPECT_TRUE(has(again->notes[0], "is an FP8 checkpoint already")) << again->notes[0];
    expect_same_bf16(*again, *published);
}

class Fp8Moe : public ::testing::Test {
  protected:
    void SetUp() override {
        write_random_checkpoint(dir.path() / "bf16", testing::tiny_config("26b-a4b"), 17);
    }
    testing::TempDir dir{"fp8_moe"};
};

TEST_F(Fp8Moe, PerExpertTensorsGatherIntoTheFusedLayout) {
    Fp8Layout layout;
    layout.quantized = [](const std::string& n) { return !has(n, "router"); };
    layout.ignore = {"re:.*router.*"};
    testing::write_fp8_copy(dir.path() / "bf16", dir.path() / "fp8", dir.path() / "ref", layout);
    const auto fp8 = load_checkpoint(dir.path() / "fp8");
    const auto ref = load_checkpoint(dir.path() / "ref");
    const ModelConfig& c = fp8->config;
    const int64_t E = c.n_experts, Ie = c.expert_width, H = c.hidden;
    EXPECT_TRUE(fp8->files.find(c.weight_prefix + "layers.0.experts.3.up_proj.weight"));
    EXPECT_FALSE(fp8->files.find(c.weight_prefix + "layers.0.experts.gate_up_proj"));
    for (int i = 0; i < c.n_layers; ++i) {
        const LayerQuant& f = fp8->weights.quant[i];
        ASSERT_NE(f.experts_gate_up.q, nullptr);
        ASSERT_NE(f.experts_down.q, nullptr);
        for (int64_t e = 0; e < E; ++e) {
            const std::string m =
                c.weight_prefix + "layers." + std::to_string(i) + ".experts." + std::to_string(e) + ".";
            const std::vector<uint8_t> gate = file_bytes(*fp8, m + "gate_proj.weight"),
                                       up = file_bytes(*fp8, m + "up_proj.weight"),
                                       down = file_bytes(*fp8, m + "down_proj.weight");
            EXPECT_EQ(std::memcmp(f.experts_gate_up.q + e * 2 * Ie * H, gate.data(), gate.size()), 0) << m;
            EXPECT_EQ(std::memcmp(f.experts_gate_up.q + (e * 2 + 1) * Ie * H, up.data(), up.size()), 0) << m;
            EXPECT_EQ(std::memcmp(f.experts_down.q + e * H * Ie, down.data(), down.size()), 0) << m;
            const std::vector<float> sg = file_scales(*fp8, m + "gate_proj", Ie),
                                     su = file_scales(*fp8, m + "up_proj", Ie),
                                     sd = file_scales(*fp8, m + "down_proj", H);
            EXPECT_EQ(std::memcmp(f.experts_gate_up.scale + e * 2 * Ie, sg.data(), sg.size() * 4), 0) << m;
            EXPECT_EQ(std::memcmp(f.experts_gate_up.scale + (e * 2 + 1) * Ie, su.data(), su.size() * 4), 0)
                << m;
            EXPECT_EQ(std::memcmp(f.experts_down.scale + e * H, sd.data(), sd.size() * 4), 0) << m;
        }
        EXPECT_FALSE(fp8->owned.holds(fp8->weights.layers[i].router_proj)) << "the router stays bf16";
    }
    expect_same_bf16(*fp8, *ref);
    expect_same_logits(*fp8, *ref);
}

TEST_F(Fp8Moe, FusedBf16ExpertsBesideFp8Projections) {
    Fp8Layout layout;
    layout.quantized = [](const std::string& n) { return !has(n, "router") && !has(n, "experts"); };
    layout.ignore = {"re:.*router.*"};
    testing::write_fp8_copy(dir.path() / "bf16", dir.path() / "fp8", dir.path() / "ref", layout);
    const auto fp8 = load_checkpoint(dir.path() / "fp8");
    const auto ref = load_checkpoint(dir.path() / "ref");
    EXPECT_EQ(fp8->format, WeightFormat::kFp8);
    for (size_t i = 0; i < fp8->weights.layers.size(); ++i) {
        EXPECT_NE(fp8->weights.quant[i].q_proj.q, nullptr);
        EXPECT_EQ(fp8->weights.quant[i].experts_gate_up.q, nullptr);
        EXPECT_EQ(
            static_cast<const void*>(fp8->weights.layers[i].experts_gate_up),
            fp8->files
                .get(fp8->config.weight_prefix + "layers." + std::to_string(i) + ".experts.gate_up_proj")
                .data);
    }
    expect_same_bf16(*fp8, *ref);
    expect_same_logits(*fp8, *ref);

    // --quantize takes the experts too (a bf16 checkpoint has no quantization_config)
    const auto q = load_checkpoint(dir.path() / "bf16", LoadOptions{.quantize = WeightFormat::kFp8});
    for (const LayerQuant& f : q->weights.quant)
        EXPECT_TRUE(f.experts_gate_up.q && f.experts_down.q && f.gate_proj.q);
}

}  // namespace
}  // namespace markbase
