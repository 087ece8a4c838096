// --save's writer (loading/save_quantized.h): a quantised model, made by --quantize or loaded as published,
// written as a compressed-tensors checkpoint and loaded back as published holds the same quantised bytes,
// scales and zero points and the same bf16 values (so the same logits, bit for bit); the config's
// quantization_config is the scheme's, with every Linear kept bf16 in `ignore`; experts are written per
// expert; int4 matrices whose width compressed-tensors cannot hold are bf16 of their dequantised values;
// shards come with an index. Refusals: tests/loading/test_save_refusals.cpp.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "loading/quant_rows.h"
#include "loading/random_checkpoint.h"
#include "loading/save_quantized.h"
#include "model/int4.h"
#include "model/tensor_plan.h"
#include "support/quant_checkpoints.h"
#include "support/tiny_models.h"

namespace markbase {
namespace {

namespace fs = std::filesystem;
using testing::expect_same_bf16;
using testing::expect_same_logits;

const fs::path kModel = fs::path(MARKBASE_TEST_DATA) / ".." / ".." / "models" / "default";

bool has(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

nlohmann::json read_json(const fs::path& p) {
    return nlohmann::json::parse(std::ifstream(p));
}

std::string file_text(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// Every LayerQuant matrix of `saved` holds the quantised bytes, scales and zero points of `model`'s; an int4
// matrix whose K is not a multiple of 128 has none after the save (it was written bf16), nor have the experts
// where `experts_bf16`.
void expect_same_quant(const Checkpoint& model, const Checkpoint& saved, bool experts_bf16 = false) {
    ASSERT_EQ(saved.format, model.format);
    Weights wa = model.weights, wb = saved.weights;
    const std::vector<PlannedTensor> pa = plan_bound_tensors(model.config, wa),
                                     pb = plan_bound_tensors(saved.config, wb);
    ASSERT_EQ(pa.size(), pb.size());
    int compared = 0;
    for (size_t i = 0; i < pa.size(); ++i) {
        if (!pa[i].quant || !pa[i].quant->q) {
            EXPECT_TRUE(!pb[i].quant || !pb[i].quant->q) << pa[i].name;
            continue;
        }
        const int64_t K = pa[i].shape.back();
        int64_t rows = 1;
        for (size_t d = 0; d + 1 < pa[i].shape.size(); ++d) rows *= pa[i].shape[d];
        if ((model.format == WeightFormat::kInt4 && K % kInt4Group != 0) ||
            (experts_bf16 && pa[i].shape.size() == 3)) {
            EXPECT_EQ(pb[i].quant->q, nullptr) << pa[i].name << ": written bf16";
            continue;
        }
        const QuantMatrix &a = *pa[i].quant, &b = *pb[i].quant;
        ASSERT_NE(b.q, nullptr) << pa[i].name;
        const int64_t spr = quant_scales_per_row(model.format, K);
        EXPECT_EQ(std::memcmp(a.q, b.q, static_cast<size_t>(rows * quant_row_bytes(model.format, K))), 0)
            << pa[i].name;
        EXPECT_EQ(std::memcmp(a.scale, b.scale, static_cast<size_t>(rows * spr) * sizeof(float)), 0)
            << pa[i].name;
        ASSERT_EQ(a.zero == nullptr, b.zero == nullptr) << pa[i].name;
        if (a.zero) {
            EXPECT_EQ(std::memcmp(a.zero, b.zero, static_cast<size_t>(rows * spr)), 0) << pa[i].name;
        }
        ++compared;
    }
    EXPECT_GT(compared, 0);
}

// Saves ck into dir/saved, loads it back as published and checks it against ck.
std::unique_ptr<Checkpoint> round_trip(const Checkpoint& ck, const fs::path& dir, const SaveOptions& o = {}) {
    const SaveResult r = save_quantized(ck, dir / "saved", o);
    EXPECT_EQ(r.format, ck.format);
    uint64_t bytes = 0;
    for (const fs::directory_entry& e : fs::directory_iterator(dir / "saved")) bytes += e.file_size();
    EXPECT_EQ(r.bytes, bytes);
    auto saved = load_checkpoint(dir / "saved");
    expect_same_quant(ck, *saved);
    expect_same_bf16(ck, *saved);
    expect_same_logits(ck, *saved);
    return saved;
}

class SaveBundled : public ::testing::TestWithParam<WeightFormat> {};

TEST_P(SaveBundled, QuantizeAtLoadSavesAndLoadsBackAsPublished) {
    const WeightFormat f = GetParam();
    testing::TempDir dir("save_bundled");
    const auto ck = load_checkpoint(kModel, LoadOptions{.quantize = f});
    const auto saved = round_trip(*ck, dir.path());
    EXPECT_TRUE(saved->notes.empty());
    EXPECT_EQ(saved->files.files().size(), 1u) << "one model.safetensors for a small model";

    const std::string p = ck->config.weight_prefix;
    const nlohmann::json qc = read_json(dir.path() / "saved" / "config.json").at("quantization_config");
    EXPECT_EQ(qc.at("quant_method"), "compressed-tensors");
    const nlohmann::json& w = qc.at("config_groups").at("group_0").at("weights");
    EXPECT_EQ(w.at("num_bits"), f == WeightFormat::kFp8 ? 8 : 4);
    EXPECT_EQ(w.at("strategy"), f == WeightFormat::kFp8 ? "channel" : "group");
    EXPECT_EQ(qc.at("format"), f == WeightFormat::kFp8 ? "float-quantized" : "pack-quantized");
    const nlohmann::json& acts = qc.at("config_groups").at("group_0").at("input_activations");
    if (f == WeightFormat::kFp8)  // FP8_DYNAMIC, which vLLM's fused MoE needs
        EXPECT_TRUE(acts.at("dynamic") == true && acts.at("strategy") == "token") << acts.dump();
    else
        EXPECT_TRUE(acts.is_null()) << "W4A16";
    const std::vector<std::string> ignore = qc.at("ignore");
    EXPECT_EQ(ignore.front(), "lm_head");
    EXPECT_NE(std::find(ignore.begin(), ignore.end(), p + "per_layer_model_projection"), ignore.end());
    EXPECT_NE(std::find(ignore.begin(), ignore.end(), p + "layers.7.per_layer_input_gate"), ignore.end());
    EXPECT_EQ(ignore.size(), 2u + 2u * static_cast<size_t>(ck->config.n_layers)) << qc.at("ignore").dump();

    // tensors under the checkpoint's names in the published layout
    const std::string q0 = p + "layers.0.self_attn.q_proj";
    if (f == WeightFormat::kFp8) {
        EXPECT_EQ(saved->files.get(q0 + ".weight").dtype, DType::F8_E4M3);
        EXPECT_EQ(saved->files.get(q0 + ".weight_scale").dtype, DType::F32) << "max |w| / 448: not bf16";
        EXPECT_EQ(saved->files.get(q0 + ".weight_scale").shape, (std::vector<int64_t>{256, 1}));
    } else {
        EXPECT_EQ(saved->files.get(q0 + ".weight_packed").shape, (std::vector<int64_t>{256, 32}));
        EXPECT_EQ(saved->files.get(q0 + ".weight_scale").dtype, DType::BF16) << "bf16 scales, as made";
        EXPECT_EQ(saved->files.get(q0 + ".weight_shape").dtype, DType::I64);
        EXPECT_FALSE(saved->files.find(q0 + ".weight_zero_point"));
    }
    for (const char* side :
         {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"})
        EXPECT_EQ(file_text(dir.path() / "saved" / side), file_text(kModel / side)) << side;
    EXPECT_FALSE(fs::exists(dir.path() / "saved" / "goldens.json")) << "only the files a checkpoint ships";

    // the checkpoint loaded as published saves to the same bytes
    save_quantized(*saved, dir.path() / "again");
    EXPECT_EQ(file_text(dir.path() / "again" / "model.safetensors"),
              file_text(dir.path() / "saved" / "model.safetensors"));
    EXPECT_EQ(file_text(dir.path() / "again" / "config.json"),
              file_text(dir.path() / "saved" / "config.json"));
}

INSTANTIATE_TEST_SUITE_P(Formats, SaveBundled, ::testing::Values(WeightFormat::kFp8, WeightFormat::kInt4),
                         [](const auto& p) { return p.param == WeightFormat::kFp8 ? "Fp8" : "Int4"; });

TEST(SaveQuantized, AnAsymmetricPublishedInt4CheckpointSavesAsItLoaded) {
    testing::TempDir dir("save_int4_asym");
    testing::Int4Layout layout;
    layout.quantized = [](const std::string& n) { return !has(n, "per_layer"); };
    layout.symmetric = false;
    layout.ignore = {"re:.*per_layer.*"};
    layout.scale_dtype = DType::F32;
    layout.unpacked_zero_points = true;  // I8 zero points are written packed, the same values
    testing::write_int4_copy(kModel, dir.path() / "int4", dir.path() / "ref", layout);
    const auto published = load_checkpoint(dir.path() / "int4");
    const auto saved = round_trip(*published, dir.path());
    const std::string q0 = saved->config.weight_prefix + "layers.0.self_attn.q_proj";
    const TensorInfo& z = saved->files.get(q0 + ".weight_zero_point");
    EXPECT_EQ(z.dtype, DType::I32);
    EXPECT_EQ(z.shape, (std::vector<int64_t>{256 / 8, 2}));
    EXPECT_EQ(
        read_json(dir.path() / "saved" /
                  "config.json")["quantization_config"]["config_groups"]["group_0"]["weights"]["symmetric"],
        false);
    expect_same_logits(*saved, *load_checkpoint(dir.path() / "ref"));
}

TEST(SaveQuantized, APublishedFp8CheckpointSavesWeightsOnlyWithAScalePerRow) {
    testing::TempDir dir("save_fp8_published");
    const std::string down2 = load_checkpoint(kModel)->config.weight_prefix + "layers.2.mlp.down_proj";
    testing::Fp8Layout layout;
    layout.quantized = [](const std::string& n) { return !has(n, "per_layer"); };
    layout.per_tensor = {down2 + ".weight"};  // one BF16 scale, written on every row
    layout.ignore = {"re:.*per_layer.*"};
    layout.input_scales = true;
    testing::write_fp8_copy(kModel, dir.path() / "fp8", dir.path() / "ref", layout);
    const auto published = load_checkpoint(dir.path() / "fp8");
    const SaveResult r = save_quantized(*published, dir.path() / "saved");
    ASSERT_EQ(r.notes.size(), 1u);
    EXPECT_TRUE(has(r.notes[0], "static activation scales (input_scale) not written")) << r.notes[0];
    const auto saved = load_checkpoint(dir.path() / "saved");
    expect_same_quant(*published, *saved);
    expect_same_bf16(*published, *saved);
    const TensorInfo& s = saved->files.get(down2 + ".weight_scale");
    EXPECT_EQ(s.dtype, DType::BF16);
    EXPECT_EQ(s.shape, (std::vector<int64_t>{256, 1}));
    for (const auto& [name, t] : saved->files.tensors()) EXPECT_FALSE(has(name, "input_scale")) << name;
    EXPECT_TRUE(saved->notes.empty());
}

class SaveMoe : public ::testing::TestWithParam<WeightFormat> {};

TEST_P(SaveMoe, ExpertsAreWrittenPerExpertAndGatheredBack) {
    testing::TempDir dir("save_moe");
    write_random_checkpoint(dir.path() / "bf16", testing::tiny_int4_config("26b-a4b"), 29);
    const auto ck = load_checkpoint(dir.path() / "bf16", LoadOptions{.quantize = GetParam()});
    const auto saved = round_trip(*ck, dir.path());
    const std::string p = ck->config.weight_prefix + "layers.1.experts.";
    const char* weight = GetParam() == WeightFormat::kFp8 ? ".weight" : ".weight_packed";
    const int64_t E = ck->config.n_experts;
    for (const std::string part : {"gate_proj", "up_proj", "down_proj"}) {
        EXPECT_TRUE(saved->files.find(p + "0." + part + weight)) << part;
        EXPECT_TRUE(saved->files.find(p + std::to_string(E - 1) + "." + part + ".weight_scale")) << part;
    }
    EXPECT_FALSE(saved->files.find(p + "gate_up_proj"));
    EXPECT_FALSE(saved->files.find(p + "down_proj"));
    const std::vector<std::string> ignore =
        read_json(dir.path() / "saved" / "config.json")["quantization_config"]["ignore"];
    EXPECT_NE(std::find(ignore.begin(), ignore.end(), ck->config.weight_prefix + "layers.1.router.proj"),
              ignore.end())
        << "the router stays bf16";
}

INSTANTIATE_TEST_SUITE_P(Formats, SaveMoe, ::testing::Values(WeightFormat::kFp8, WeightFormat::kInt4),
                         [](const auto& p) { return p.param == WeightFormat::kFp8 ? "Fp8" : "Int4"; });

TEST(SaveQuantized, ExpertsAPublishedCheckpointKeptBf16StayFusedAndIgnored) {
    testing::TempDir dir("save_bf16_experts");
    write_random_checkpoint(dir.path() / "bf16", testing::tiny_int4_config("26b-a4b"), 41);
    testing::Int4Layout layout;
    layout.quantized = [](const std::string& n) { return !has(n, "router") && !has(n, "experts"); };
    layout.ignore = {"re:.*router.*"};
    testing::write_int4_copy(dir.path() / "bf16", dir.path() / "int4", dir.path() / "ref", layout);
    const auto published = load_checkpoint(dir.path() / "int4");
    const auto saved = round_trip(*published, dir.path());
    const std::string p = published->config.weight_prefix + "layers.0.";
    EXPECT_EQ(saved->files.get(p + "experts.gate_up_proj").dtype, DType::BF16);
    EXPECT_FALSE(saved->files.find(p + "experts.0.gate_proj.weight_packed"));
    EXPECT_TRUE(saved->files.find(p + "mlp.gate_proj.weight_packed"));
    EXPECT_TRUE(saved->notes.empty());
    const std::vector<std::string> ignore =
        read_json(dir.path() / "saved" / "config.json")["quantization_config"]["ignore"];
    EXPECT_NE(std::find(ignore.begin(), ignore.end(), "re:.*\\.experts\\..*"), ignore.end())
        << "vLLM's fused MoE then loads them unquantised";
}

TEST(SaveQuantized, Int4WidthsWithAShortLastGroupAreWrittenAsTheirBf16Values) {
    // K = 192: --quantize int4 gives the MLP's and the experts' down_proj a last group of 64, which
    // compressed-tensors cannot hold; the experts' gate_up (K = 128) goes bf16 with them, one scheme for the
    // experts as vLLM's fused MoE wants
    testing::TempDir dir("save_short_group");
    nlohmann::json c = testing::tiny_int4_config("26b-a4b");
    c["intermediate_size"] = 192;
    c["moe_intermediate_size"] = 192;
    write_random_checkpoint(dir.path() / "bf16", c, 31);
    const auto ck = load_checkpoint(dir.path() / "bf16", LoadOptions{.quantize = WeightFormat::kInt4});
    ASSERT_NE(ck->weights.quant[0].down_proj.q, nullptr) << "in memory: an int4 form with a short group";
    ASSERT_NE(ck->weights.quant[0].experts_gate_up.q, nullptr);
    const SaveResult r = save_quantized(*ck, dir.path() / "saved");
    const int L = c["num_hidden_layers"].get<int>();
    ASSERT_EQ(r.notes.size(), 2u);
    EXPECT_TRUE(has(r.notes[0], std::to_string(L) +
                                    " int4 matrices whose width is not a multiple of 128 written as bf16") &&
                has(r.notes[0], ": mlp.down_proj"))
        << r.notes[0];
    EXPECT_TRUE(has(r.notes[1], "the MoE experts written as bf16 (" + std::to_string(2 * L) +
                                    " fused matrices as their dequantised values) and ignored: ") &&
                has(r.notes[1], "(int4 groups of 128 along widths of 128 and 192)"))
        << r.notes[1];
    const auto saved = load_checkpoint(dir.path() / "saved");
    EXPECT_EQ(saved->format, WeightFormat::kInt4);
    const std::string p = ck->config.weight_prefix + "layers.0.";
    EXPECT_EQ(saved->files.get(p + "mlp.down_proj.weight").dtype, DType::BF16);
    EXPECT_TRUE(saved->files.find(p + "mlp.up_proj.weight_packed"));
    EXPECT_EQ(saved->files.get(p + "experts.down_proj").dtype, DType::BF16) << "fused, as bf16 stores it";
    EXPECT_EQ(saved->files.get(p + "experts.gate_up_proj").dtype, DType::BF16);
    EXPECT_FALSE(saved->files.find(p + "experts.0.gate_proj.weight_packed"));
    const std::vector<std::string> ignore =
        read_json(dir.path() / "saved" / "config.json")["quantization_config"]["ignore"];
    EXPECT_NE(std::find(ignore.begin(), ignore.end(), p + "mlp.down_proj"), ignore.end());
    EXPECT_EQ(std::find(ignore.begin(), ignore.end(), p + "mlp.up_proj"), ignore.end());
    EXPECT_NE(std::find(ignore.begin(), ignore.end(), "re:.*\\.experts\\..*"), ignore.end());
    expect_same_quant(*ck, *saved, true);
    expect_same_bf16(*ck, *saved);
    expect_same_logits(*ck, *saved);
}

class SaveSkipped : public ::testing::TestWithParam<WeightFormat> {};

TEST_P(SaveSkipped, TensorsTheLoaderSkipsAreWrittenWithTheSharedKvQuantised) {
    testing::TempDir dir("save_skipped");
    write_random_checkpoint(dir.path() / "bf16", testing::tiny_int4_config("e2b"), 37);
    const ModelConfig c = load_checkpoint(dir.path() / "bf16")->config;
    const std::string vision = "model.vision_tower.encoder.layers.0.mlp.fc1.weight";
    int shared = -1, n_shared = 0;
    testing::rewrite_tensors(dir.path() / "bf16", [&](std::vector<TensorToWrite>& tw, auto& keep) {
        // what released E2B files carry: K/V tensors for the KV-shared layers, and a vision tower
        auto add = [&](const std::string& name, std::vector<int64_t> shape) {
            int64_t n = 1;
            for (int64_t d : shape) n *= d;
            std::vector<bf16> v(static_cast<size_t>(n));
            for (int64_t i = 0; i < n; ++i) v[i] = float_to_bf16(0.01f * static_cast<float>(i * 37 % 17 - 8));
            keep.emplace_back(reinterpret_cast<const uint8_t*>(v.data()),
                              reinterpret_cast<const uint8_t*>(v.data() + n));
            tw.push_back({name, DType::BF16, std::move(shape), keep.back().data()});
        };
        for (int i = 0; i < c.n_layers; ++i) {
            const LayerSpec& s = c.layers[i];
            if (s.has_own_kv()) continue;
            if (shared < 0) shared = i;
            ++n_shared;
            const std::string l = c.weight_prefix + "layers." + std::to_string(i) + ".self_attn.";
            add(l + "k_proj.weight", {int64_t{s.n_kv_heads} * s.head_dim, c.hidden});
            add(l + "v_proj.weight", {int64_t{s.n_kv_heads} * s.head_dim, c.hidden});
            add(l + "k_norm.weight", {s.head_dim});
        }
        add(vision, {64, 32});
    });
    ASSERT_GE(shared, 0) << "the tiny E2B shares KV";
    const auto ck = load_checkpoint(dir.path() / "bf16", LoadOptions{.quantize = GetParam()});
    const SaveResult r = save_quantized(*ck, dir.path() / "saved");
    ASSERT_EQ(r.notes.size(), 1u);
    EXPECT_TRUE(has(r.notes[0],
                    " K/V projections of KV-shared layers (unused by the model, present in the "
                    "source) written quantised"))
        << r.notes[0];
    const auto saved = load_checkpoint(dir.path() / "saved");
    // each K/V projection's weight comes with its scale (int4: and its weight_shape)
    const size_t companions = GetParam() == WeightFormat::kFp8 ? 1 : 2;
    EXPECT_EQ(saved->skipped.size(), ck->skipped.size() + 2 * static_cast<size_t>(n_shared) * companions);
    const std::string k = c.weight_prefix + "layers." + std::to_string(shared) + ".self_attn.k_proj";
    EXPECT_TRUE(saved->files.find(k + (GetParam() == WeightFormat::kFp8 ? ".weight" : ".weight_packed")));
    EXPECT_TRUE(saved->files.find(k + ".weight_scale"));
    EXPECT_EQ(saved->files.get(vision).dtype, DType::BF16);
    const std::vector<std::string> ignore =
        read_json(dir.path() / "saved" / "config.json")["quantization_config"]["ignore"];
    EXPECT_NE(std::find(ignore.begin(), ignore.end(), "model.vision_tower.encoder.layers.0.mlp.fc1"),
              ignore.end());
    EXPECT_EQ(std::find(ignore.begin(), ignore.end(), k), ignore.end());
    expect_same_quant(*ck, *saved);
    expect_same_bf16(*ck, *saved);
}

INSTANTIATE_TEST_SUITE_P(Formats, SaveSkipped, ::testing::Values(WeightFormat::kFp8, WeightFormat::kInt4),
                         [](const auto& p) { return p.param == WeightFormat::kFp8 ? "Fp8" : "Int4"; });

TEST(SaveQuantized, ShardsComeWithAnIndex) {
    testing::TempDir dir("save_shards");
    const auto ck = load_checkpoint(kModel, LoadOptions{.quantize = WeightFormat::kInt4});
    const auto saved = round_trip(*ck, dir.path(), SaveOptions{.max_shard_bytes = 3u << 20});
    const fs::path d = dir.path() / "saved";
    EXPECT_FALSE(fs::exists(d / "model.safetensors"));
    ASSERT_TRUE(fs::exists(d / "model.safetensors.index.json"));
    const nlohmann::json index = read_json(d / "model.safetensors.index.json");
    uint64_t total = 0;
    for (const auto& [name, t] : saved->files.tensors()) {
        total += t.nbytes;
        EXPECT_EQ(fs::path(t.file).filename().string(), index["weight_map"][name].get<std::string>()) << name;
    }
    EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
    const size_t n = saved->files.files().size();
    EXPECT_GE(n, 3u);
    EXPECT_TRUE(fs::exists(d / ("model-00001-of-0000" + std::to_string(n) + ".safetensors")));
}

}  // namespace
}  // namespace markbase
