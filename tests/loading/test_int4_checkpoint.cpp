// int4 checkpoints as published (compressed-tensors pack-quantized, written here by hand:
// support/quant_checkpoints.h) and made at load (--quantize int4): the int4 form lands where model/weights.h
// says (the file's packed words as they are, scales as fp32, zero points unpacked one a byte), and the bf16
// slots hold exactly the dequantised values, so the CPU backend's logits equal those of a bf16 checkpoint of
// the same values bit for bit. Errors: tests/loading/test_int4_errors.cpp.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "loading/quant_checkpoint.h"
#include "loading/random_checkpoint.h"
#include "model/int4.h"
#include "model/tensor_plan.h"
#include "support/quant_checkpoints.h"
#include "support/tiny_models.h"

namespace markbase {
namespace {

namespace fs = std::filesystem;
using testing::expect_same_bf16;
using testing::expect_same_logits;
using testing::file_bytes;
using testing::Int4Layout;

const fs::path kModel = fs::path(MARKBASE_TEST_DATA) / ".." / ".." / "models" / "default";

bool has(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

// A module's scales as the file gives them ([rows, G], BF16 or F32), as fp32.
std::vector<float> file_scales(const Checkpoint& ck, const std::string& module) {
    const TensorInfo& t = ck.files.get(module + ".weight_scale");
    std::vector<float> out(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < out.size(); ++i) {
        if (t.dtype == DType::BF16) {
            bf16 v;
            std::memcpy(&v, t.data + 2 * i, 2);
            out[i] = bf16_to_float(v);
        } else {
            std::memcpy(&out[i], t.data + 4 * i, 4);
        }
    }
    return out;
}

// A module's zero points as the file gives them, unpacked to [rows, G] codes (0..15): packed I32 words
// [rows / 8, G] (row r at bits 4 (r % 8)) or I8 [rows, G] (signed, + 8).
std::vector<uint8_t> file_zeros(const Checkpoint& ck, const std::string& module, int64_t rows) {
    const TensorInfo& t = ck.files.get(module + ".weight_zero_point");
    const int64_t G = t.shape[1];
    std::vector<uint8_t> out(static_cast<size_t>(rows * G));
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t g = 0; g < G; ++g) {
            if (t.dtype == DType::I8) {
                out[r * G + g] = static_cast<uint8_t>(static_cast<int8_t>(t.data[r * G + g]) + 8);
            } else {
                uint32_t w;
                std::memcpy(&w, t.data + 4 * ((r / 8) * G + g), 4);
                out[r * G + g] = (w >> (4 * (r % 8))) & 0xf;
            }
        }
    }
    return out;
}

// m holds the file's module: its packed bytes, scales and (asymmetric) zero points.
void expect_module(const Checkpoint& ck, const QuantMatrix& m, const std::string& module, bool symmetric) {
    ASSERT_NE(m.q, nullptr) << module;
    const std::vector<uint8_t> q = file_bytes(ck, module + ".weight_packed");
    EXPECT_EQ(std::memcmp(m.q, q.data(), q.size()), 0) << module;
    const std::vector<float> s = file_scales(ck, module);
    EXPECT_EQ(std::memcmp(m.scale, s.data(), s.size() * 4), 0) << module;
    if (symmetric) {
        EXPECT_EQ(m.zero, nullptr) << module;
        return;
    }
    const int64_t rows = ck.files.get(module + ".weight_packed").shape[0];
    const std::vector<uint8_t> z = file_zeros(ck, module, rows);
    ASSERT_NE(m.zero, nullptr) << module;
    EXPECT_EQ(std::memcmp(m.zero, z.data(), z.size()), 0) << module;
}

bool per_layer(const std::string& name) {
    return has(name, "per_layer");
}

class Int4Published : public ::testing::TestWithParam<bool> {};  // symmetric

TEST_P(Int4Published, TheBundledModelLoadsAsItsDequantisedValues) {
    const bool symmetric = GetParam();
    testing::TempDir dir("int4_published");
    const ModelConfig c = load_checkpoint(kModel)->config;
    const std::string down2 = c.weight_prefix + "layers.2.mlp.down_proj";  // ignored by name: bf16
    Int4Layout layout;
    layout.quantized = [&](const std::string& n) { return !per_layer(n) && n != down2 + ".weight"; };
    layout.symmetric = symmetric;
    layout.ignore = {"lm_head", "re:.*per_layer.*", down2};
    layout.scale_dtype = symmetric ? DType::BF16 : DType::F32;
    layout.shape_dtype = symmetric ? DType::I64 : DType::I32;
    testing::write_int4_copy(kModel, dir.path() / "int4", dir.path() / "ref", layout);
    const auto q = load_checkpoint(dir.path() / "int4");
    const auto ref = load_checkpoint(dir.path() / "ref");

    EXPECT_EQ(q->format, WeightFormat::kInt4);
    EXPECT_TRUE(q->notes.empty());
    ASSERT_EQ(q->weights.quant.size(), static_cast<size_t>(c.n_layers));
    for (int i = 0; i < c.n_layers; ++i) {
        const LayerWeights& l = q->weights.layers[i];
        const LayerQuant& f = q->weights.quant[i];
        const std::string layer = c.weight_prefix + "layers." + std::to_string(i) + ".";
        EXPECT_EQ(f.k_proj.q != nullptr, l.k_proj != nullptr) << "layer " << i;
        EXPECT_EQ(f.v_proj.q != nullptr, l.v_proj != nullptr) << "layer " << i;
        expect_module(*q, f.q_proj, layer + "self_attn.q_proj", symmetric);
        expect_module(*q, f.o_proj, layer + "self_attn.o_proj", symmetric);
        expect_module(*q, f.gate_proj, layer + "mlp.gate_proj", symmetric);
        if (i == 2) {
            EXPECT_EQ(f.down_proj.q, nullptr);
            EXPECT_EQ(static_cast<const void*>(l.down_proj), q->files.get(down2 + ".weight").data);
        } else {
            expect_module(*q, f.down_proj, layer + "mlp.down_proj", symmetric);
        }
        EXPECT_FALSE(q->owned.holds(l.ple_gate)) << "ignored: the file's bf16";
    }
    expect_same_bf16(*q, *ref);
    expect_same_logits(*q, *ref);
    const std::string summary = weight_format_summary(*q);
    EXPECT_TRUE(has(summary, symmetric ? "int4 with a scale per 128 weights (symmetric): "
                                       : "int4 with a scale and a zero point per 128 weights: "))
        << summary;
    EXPECT_TRUE(has(summary, "bf16: embeddings, norms, per_layer_model_projection")) << summary;
    EXPECT_EQ(weight_format_summary(*ref), "bf16");
}

INSTANTIATE_TEST_SUITE_P(Symmetry, Int4Published, ::testing::Bool(),
                         [](const auto& p) { return p.param ? "Symmetric" : "Asymmetric"; });

TEST(Int4Checkpoint, UnpackedZeroPointsLoadAsThePackedOnes) {
    testing::TempDir dir("int4_unpacked_zeros");
    Int4Layout layout;
    layout.quantized = [](const std::string& n) { return !per_layer(n); };
    layout.symmetric = false;
    layout.ignore = {"re:.*per_layer.*"};
    testing::write_int4_copy(kModel, dir.path() / "packed", dir.path() / "ref", layout);
    layout.unpacked_zero_points = true;
    testing::write_int4_copy(kModel, dir.path() / "unpacked", dir.path() / "ref2", layout);
    const auto packed = load_checkpoint(dir.path() / "packed");
    const auto unpacked = load_checkpoint(dir.path() / "unpacked");
    const std::string q0 = packed->config.weight_prefix + "layers.0.self_attn.q_proj";
    EXPECT_EQ(unpacked->files.get(q0 + ".weight_zero_point").dtype, DType::I8);
    EXPECT_EQ(packed->files.get(q0 + ".weight_zero_point").dtype, DType::I32);
    for (size_t i = 0; i < packed->weights.quant.size(); ++i) {
        const QuantMatrix &a = packed->weights.quant[i].up_proj, &b = unpacked->weights.quant[i].up_proj;
        const int64_t rows = packed->config.layers[i].mlp_width, G = packed->config.hidden / kInt4Group;
        ASSERT_TRUE(a.zero && b.zero);
        EXPECT_EQ(std::memcmp(a.zero, b.zero, static_cast<size_t>(rows * G)), 0) << "layer " << i;
    }
    expect_same_bf16(*packed, *unpacked);
    expect_same_logits(*unpacked, *load_checkpoint(dir.path() / "ref"));
}

TEST(Int4Checkpoint, PleMatricesStoredInt4AreDequantisedWithoutAnInt4Form) {
    // per_layer_projection is [256, 16]: one short group of 16, as compressed-tensors quantises K < 128
    testing::TempDir dir("int4_ple");
    Int4Layout layout;
    layout.quantized = [](const std::string&) { return true; };
    testing::write_int4_copy(kModel, dir.path() / "int4", dir.path() / "ref", layout);
    const auto q = load_checkpoint(dir.path() / "int4");
    const auto ref = load_checkpoint(dir.path() / "ref");
    EXPECT_EQ(q->format, WeightFormat::kInt4);
    for (const LayerWeights& l : q->weights.layers) {
        EXPECT_TRUE(q->owned.holds(l.ple_gate)) << "dequantised: no int4 form, a bf16 copy of the values";
        EXPECT_TRUE(q->owned.holds(l.ple_proj));
    }
    EXPECT_TRUE(q->owned.holds(q->weights.ple_model_proj));
    expect_same_bf16(*q, *ref);
    expect_same_logits(*q, *ref);
    EXPECT_TRUE(
        has(weight_format_summary(*q), "stored int4, dequantised to bf16: per_layer_model_projection"))
        << weight_format_summary(*q);
}

TEST(Int4Checkpoint, QuantiseAtLoadEqualsTheSameQuantisationPublished) {
    testing::TempDir dir("int4_quantize");
    Int4Layout layout;  // what --quantize int4 makes: every LayerQuant matrix, symmetric, the PLE bf16
    layout.quantized = [](const std::string& n) { return !per_layer(n); };
    layout.ignore = {"re:.*per_layer.*"};
    testing::write_int4_copy(kModel, dir.path() / "int4", dir.path() / "ref", layout);
    const auto published = load_checkpoint(dir.path() / "int4");
    const auto quantized = load_checkpoint(kModel, LoadOptions{.quantize = WeightFormat::kInt4});
    EXPECT_EQ(quantized->format, WeightFormat::kInt4);
    EXPECT_TRUE(quantized->notes.empty());
    Weights wq = quantized->weights, wp = published->weights;
    const std::vector<PlannedTensor> pq = plan_bound_tensors(quantized->config, wq);
    const std::vector<PlannedTensor> pp = plan_bound_tensors(published->config, wp);
    int matrices = 0;
    for (size_t i = 0; i < pq.size(); ++i) {
        ASSERT_EQ(pq[i].quant == nullptr, pp[i].quant == nullptr) << pq[i].name;
        if (!pq[i].quant) continue;
        const int64_t rows = pq[i].shape[0], K = pq[i].shape[1];
        ASSERT_NE(pq[i].quant->q, nullptr) << pq[i].name;
        EXPECT_EQ(std::memcmp(pq[i].quant->q, pp[i].quant->q, static_cast<size_t>(rows * K / 2)), 0)
            << pq[i].name;
        EXPECT_EQ(std::memcmp(pq[i].quant->scale, pp[i].quant->scale,
                              static_cast<size_t>(rows * (K / kInt4Group)) * 4),
                  0)
            << pq[i].name;
        EXPECT_EQ(pq[i].quant->zero, nullptr);
        ++matrices;
    }
    EXPECT_GT(matrices, 0);
    expect_same_bf16(*quantized, *published);
    expect_same_logits(*quantized, *published);

    // a quantised checkpoint is not quantised again
    const auto again = load_checkpoint(dir.path() / "int4", LoadOptions{.quantize = WeightFormat::kInt4});
    ASSERT_EQ(again->notes.size(), 1u);
    EXPECT_TRUE(has(again->notes[0], "--quantize int4: ") &&
                has(again->notes[0], "is an int4 checkpoint already"))
        << again->notes[0];
    expect_same_bf16(*again, *published);
}

TEST(Int4Checkpoint, NarrowMatricesAreDequantisedAndStayBf16UnderQuantize) {
    // hidden 64 and 4 heads of 16 on every layer: every projection's K is shorter than a group, which a
    // published int4 checkpoint does not hold
    testing::TempDir dir("int4_narrow");
    nlohmann::json c = testing::tiny_config("e2b");
    c["global_head_dim"] = 16;
    write_random_checkpoint(dir.path() / "bf16", c, 3);
    Int4Layout layout;
    layout.quantized = [](const std::string&) { return true; };
    layout.symmetric = false;
    testing::write_int4_copy(dir.path() / "bf16", dir.path() / "int4", dir.path() / "ref", layout);
    const auto q = load_checkpoint(dir.path() / "int4");
    EXPECT_EQ(q->format, WeightFormat::kBf16) << "no matrix keeps an int4 form";
    EXPECT_TRUE(q->weights.quant.empty());
    EXPECT_TRUE(q->owned.holds(q->weights.layers[0].q_proj));
    const auto ref = load_checkpoint(dir.path() / "ref");
    expect_same_bf16(*q, *ref);
    expect_same_logits(*q, *ref);
    EXPECT_TRUE(has(weight_format_summary(*q),
                    "bf16; bf16: embeddings, norms; stored int4, dequantised to bf16: "
                    "per_layer_model_projection, self_attn.q_proj"))
        << weight_format_summary(*q);

    // --quantize int4 takes widths in 64s (the GPU kernel's step: a 64-wide input is one short group) and
    // leaves the rest bf16 with a note: here the MLP's down_proj (96 wide)
    const auto at_load = load_checkpoint(dir.path() / "bf16", LoadOptions{.quantize = WeightFormat::kInt4});
    EXPECT_EQ(at_load->format, WeightFormat::kInt4);
    ASSERT_EQ(at_load->notes.size(), 1u);
    EXPECT_TRUE(
        has(at_load->notes[0], "--quantize int4: ") &&
        has(at_load->notes[0], "matrices whose width is not a multiple of 64 stay bf16 (mlp.down_proj)"))
        << at_load->notes[0];
    const QuantMatrix& q0 = at_load->weights.quant[0].q_proj;
    ASSERT_NE(q0.q, nullptr) << "q_proj (64 wide) has an int4 form";
    EXPECT_EQ(at_load->weights.quant[0].down_proj.q, nullptr);
    // its one short group dequantises to what its bf16 slot holds
    const int64_t K = 64, rows = at_load->files
                                     .get(at_load->config.weight_prefix + "layers.0.self_attn.q_proj.weight")
                                     .shape[0];
    std::vector<bf16> row(K);
    for (int64_t r = 0; r < rows; ++r) {
        dequantize_row_int4(q0.q + r * K / 2, q0.scale + r, nullptr, K, row.data());
        ASSERT_EQ(std::memcmp(row.data(), at_load->weights.layers[0].q_proj + r * K, K * sizeof(bf16)), 0)
            << "row " << r;
    }
}

class Int4Moe : public ::testing::Test {
  protected:
    void SetUp() override {
        write_random_checkpoint(dir.path() / "bf16", testing::tiny_int4_config("26b-a4b"), 17);
    }
    testing::TempDir dir{"int4_moe"};
};

TEST_F(Int4Moe, PerExpertTensorsGatherIntoTheFusedLayout) {
    Int4Layout layout;
    layout.quantized = [](const std::string& n) { return !has(n, "router"); };
    layout.symmetric = false;
    layout.ignore = {"re:.*router.*"};
    testing::write_int4_copy(dir.path() / "bf16", dir.path() / "int4", dir.path() / "ref", layout);
    const auto q = load_checkpoint(dir.path() / "int4");
    const auto ref = load_checkpoint(dir.path() / "ref");
    const ModelConfig& c = q->config;
    const int64_t E = c.n_experts, Ie = c.expert_width, H = c.hidden;
    const int64_t Gh = H / kInt4Group, Gi = Ie / kInt4Group;
    EXPECT_TRUE(q->files.find(c.weight_prefix + "layers.0.experts.3.up_proj.weight_packed"));
    EXPECT_FALSE(q->files.find(c.weight_prefix + "layers.0.experts.gate_up_proj"));
    for (int i = 0; i < c.n_layers; ++i) {
        const LayerQuant& f = q->weights.quant[i];
        ASSERT_NE(f.experts_gate_up.q, nullptr);
        ASSERT_NE(f.experts_down.q, nullptr);
        for (int64_t e = 0; e < E; ++e) {
            const std::string m =
                c.weight_prefix + "layers." + std::to_string(i) + ".experts." + std::to_string(e) + ".";
            // rows of the fused [E, 2 Ie, H]: expert e's gate then its up; [E, H, Ie] for down
            const std::vector<uint8_t> gate = file_bytes(*q, m + "gate_proj.weight_packed"),
                                       up = file_bytes(*q, m + "up_proj.weight_packed"),
                                       down = file_bytes(*q, m + "down_proj.weight_packed");
            EXPECT_EQ(std::memcmp(f.experts_gate_up.q + e * 2 * Ie * H / 2, gate.data(), gate.size()), 0)
                << m;
            EXPECT_EQ(std::memcmp(f.experts_gate_up.q + (e * 2 + 1) * Ie * H / 2, up.data(), up.size()), 0)
                << m;
            EXPECT_EQ(std::memcmp(f.experts_down.q + e * H * Ie / 2, down.data(), down.size()), 0) << m;
            const std::vector<float> sg = file_scales(*q, m + "gate_proj"),
                                     su = file_scales(*q, m + "up_proj"),
                                     sd = file_scales(*q, m + "down_proj");
            EXPECT_EQ(std::memcmp(f.experts_gate_up.scale + e * 2 * Ie * Gh, sg.data(), sg.size() * 4), 0)
                << m;
            EXPECT_EQ(std::memcmp(f.experts_gate_up.scale + (e * 2 + 1) * Ie * Gh, su.data(), su.size() * 4),
                      0)
                << m;
            EXPECT_EQ(std::memcmp(f.experts_down.scale + e * H * Gi, sd.data(), sd.size() * 4), 0) << m;
            const std::vector<uint8_t> zg = file_zeros(*q, m + "gate_proj", Ie),
                                       zd = file_zeros(*q, m + "down_proj", H);
            EXPECT_EQ(std::memcmp(f.experts_gate_up.zero + e * 2 * Ie * Gh, zg.data(), zg.size()), 0) << m;
            EXPECT_EQ(std::memcmp(f.experts_down.zero + e * H * Gi, zd.data(), zd.size()), 0) << m;
        }
        EXPECT_FALSE(q->owned.holds(q->weights.layers[i].router_proj)) << "the router stays bf16";
    }
    expect_same_bf16(*q, *ref);
    expect_same_logits(*q, *ref);
}

TEST_F(Int4Moe, FusedBf16ExpertsBesideInt4ProjectionsAndQuantizeTakesThemAll) {
    Int4Layout layout;
    layout.quantized = [](const std::string& n) { return !has(n, "router") && !has(n, "experts"); };
    layout.ignore = {"re:.*router.*"};
    testing::write_int4_copy(dir.path() / "bf16", dir.path() / "int4", dir.path() / "ref", layout);
    const auto q = load_checkpoint(dir.path() / "int4");
    EXPECT_EQ(q->format, WeightFormat::kInt4);
    for (size_t i = 0; i < q->weights.layers.size(); ++i) {
        EXPECT_NE(q->weights.quant[i].q_proj.q, nullptr);
        EXPECT_EQ(q->weights.quant[i].experts_gate_up.q, nullptr);
        EXPECT_EQ(
            static_cast<const void*>(q->weights.layers[i].experts_gate_up),
            q->files.get(q->config.weight_prefix + "layers." + std::to_string(i) + ".experts.gate_up_proj")
                .data);
    }
    expect_same_bf16(*q, *load_checkpoint(dir.path() / "ref"));

    const auto at_load = load_checkpoint(dir.path() / "bf16", LoadOptions{.quantize = WeightFormat::kInt4});
    EXPECT_TRUE(at_load->notes.empty());
    for (const LayerQuant& f : at_load->weights.quant)
        EXPECT_TRUE(f.experts_gate_up.q && f.experts_down.q && f.gate_proj.q && f.o_proj.q);
}

}  // namespace
}  // namespace markbase
