// An FP8 checkpoint that does not match its config, or a quantization_config we cannot read: each problem is
// a markbase::Error naming config.json and the field, or the file and the tensor, with what was expected and
// what was found. Never a crash, never a silent load.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "loading/checkpoint.h"
#include "loading/random_checkpoint.h"
#include "support/error_text.h"
#include "support/quant_checkpoints.h"
#include "support/tiny_models.h"

namespace markbase {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::expect_has;

TensorToWrite* find(std::vector<TensorToWrite>& tw, const std::string& name) {
    for (TensorToWrite& t : tw)
        if (t.name == name) return &t;
    ADD_FAILURE() << "no tensor " << name;
    return nullptr;
}

void drop(std::vector<TensorToWrite>& tw, const std::string& name) {
    std::erase_if(tw, [&](const TensorToWrite& t) { return t.name == name; });
}

class Fp8Errors : public ::testing::Test {
  protected:
    void SetUp() override {
        write_random_checkpoint(dir.path() / "bf16", testing::tiny_config(family()), 5);
        testing::Fp8Layout layout;
        layout.quantized = [](const std::string& n) { return n.find("per_layer") == std::string::npos; };
        layout.ignore = {"re:.*per_layer.*"};
        testing::write_fp8_copy(dir.path() / "bf16", fp8(), dir.path() / "ref", layout);
        prefix = load_checkpoint(dir.path() / "ref")->config.weight_prefix;
        q0 = prefix + "layers.0.self_attn.q_proj";
        file = (fp8() / "model.safetensors").string();
    }
    virtual std::string family() const { return "e2b"; }
    fs::path fp8() const { return dir.path() / "fp8"; }
    std::string load_error() const {
        return error_of([&] { load_checkpoint(fp8()); });
    }
    // q0's scale tensor replaced by one of this dtype and shape, filled with `value`
    void replace_scale(DType dtype, std::vector<int64_t> shape, float value) {
        testing::rewrite_tensors(
            fp8(), [&](std::vector<TensorToWrite>& tw, std::vector<std::vector<uint8_t>>& keep) {
                int64_t n = 1;
                for (int64_t d : shape) n *= d;
                std::vector<uint8_t> bytes(static_cast<size_t>(n * dtype_size(dtype)));
                for (int64_t i = 0; i < n && dtype == DType::F32; ++i)
                    std::memcpy(bytes.data() + 4 * i, &value, 4);
                keep.push_back(std::move(bytes));
                *find(tw, q0 + ".weight_scale") = {q0 + ".weight_scale", dtype, shape, keep.back().data()};
            });
    }

    testing::TempDir dir{"fp8_errors"};
    std::string prefix, q0, file;
    const int64_t rows = 64;  // q_proj: 4 heads of 16
};

TEST_F(Fp8Errors, MissingWeightScale) {
    testing::rewrite_tensors(fp8(), [&](auto& tw, auto&) { drop(tw, q0 + ".weight_scale"); });
    expect_has(load_error(),
               {"checkpoint does not match config.json", "missing tensor " + q0 + ".weight_scale",
                "expected F32 or BF16 [64, 1] per channel, or [1] or [] per tensor"});
}

TEST_F(Fp8Errors, MissingFp8Weight) {
    testing::rewrite_tensors(fp8(), [&](auto& tw, auto&) {
        drop(tw, q0 + ".weight");
        drop(tw, q0 + ".weight_scale");
    });
    expect_has(load_error(), {"missing tensor " + q0 +
                              ".weight (expected F8_E4M3 [64, 64] with its weight_scale: "
                              "config.json's quantization_config quantizes " +
                              q0 + ")"});
}

TEST_F(Fp8Errors, ScaleOfTheWrongDtypeOrShape) {
    replace_scale(DType::F16, {rows, 1}, 0);
    expect_has(load_error(), {file, q0 + ".weight_scale: expected dtype F32 or BF16, found F16"});
    replace_scale(DType::F32, {rows, 2}, 0.01f);
    expect_has(
        load_error(),
        {file,
         q0 + ".weight_scale: expected shape [64, 1] per channel, or [1] or [] per tensor, found [64, 2]"});
    replace_scale(DType::F32, {rows}, 0.01f);
    expect_has(load_error(), {q0 + ".weight_scale: expected shape", "found [64]"});
    replace_scale(DType::F32, {1}, 0.01f);  // per tensor: fine
    EXPECT_EQ(load_error(), "(no error)");
}

TEST_F(Fp8Errors, ScalesThatAreNotFinitePositiveNumbers) {
    // each round replaces row 3's scale of the file the round before left
    for (const auto& [value, shown] : std::vector<std::pair<float, std::string>>{
             {NAN, "nan"}, {INFINITY, "inf"}, {0.0f, "0"}, {-0.5f, "-0.5"}}) {
        testing::rewrite_tensors(
            fp8(), [&](std::vector<TensorToWrite>& tw, std::vector<std::vector<uint8_t>>& keep) {
                TensorToWrite* s = find(tw, q0 + ".weight_scale");
                keep.emplace_back(static_cast<const uint8_t*>(s->data),
                                  static_cast<const uint8_t*>(s->data) + rows * 4);
                std::memcpy(keep.back().data() + 4 * 3, &value, 4);
                s->data = keep.back().data();
            });
        expect_has(load_error(),
                   {file, q0 + ".weight_scale: 1 of 64 scales are not finite numbers > 0 (first at row 3: " +
                              shown + ")"});
    }
}

TEST_F(Fp8Errors, WeightOfTheWrongDtype) {
    std::vector<uint16_t> f16(static_cast<size_t>(rows * 64), 0x3c00);
    testing::rewrite_tensors(fp8(), [&](auto& tw, auto&) {
        *find(tw, q0 + ".weight") = {q0 + ".weight", DType::F16, {rows, 64}, f16.data()};
    });
    expect_has(load_error(),
               {file, q0 + ".weight: expected dtype F8_E4M3 (config.json's quantization_config quantizes " +
                          q0 + "), found F16"});
    testing::rewrite_tensors(fp8(), [&](auto& tw, auto&) {
        *find(tw, q0 + ".weight") = {q0 + ".weight", DType::BF16, {rows, 64}, f16.data()};
    });
    expect_has(load_error(), {q0 + ".weight: expected dtype F8_E4M3", "found BF16"});
}

TEST_F(Fp8Errors, Fp8WhereTheConfigSaysBf16AndBf16WhereItSaysFp8) {
    testing::rewrite_config(fp8(),
                            [&](nlohmann::json& j) { j["quantization_config"]["ignore"].push_back(q0); });
    expect_has(load_error(),
               {q0 + ".weight: expected dtype BF16 (config.json's quantization_config ignores " + q0 +
                "), found F8_E4M3"});
    testing::rewrite_config(
        fp8(), [&](nlohmann::json& j) { j["quantization_config"]["ignore"] = nlohmann::json::array(); });
    expect_has(
        load_error(),
        {"per_layer_input_gate.weight: expected dtype F8_E4M3 (config.json's quantization_config quantizes",
         "found BF16"});
}

TEST_F(Fp8Errors, EmbeddingsNormsAndScalarsMustBeBf16) {
    const std::string embed = prefix + "embed_tokens.weight";
    std::vector<uint8_t> q(256 * 64, 0x38);
    testing::rewrite_tensors(fp8(), [&](auto& tw, auto&) {
        *find(tw, embed) = {embed, DType::F8_E4M3, {256, 64}, q.data()};
    });
    expect_has(load_error(),
               {file, embed + ": expected dtype BF16, found F8_E4M3 (embeddings, norms, scalars"});
}

TEST_F(Fp8Errors, NanCodesInTheWeightsAreNamed) {
    testing::rewrite_tensors(fp8(),
                             [&](std::vector<TensorToWrite>& tw, std::vector<std::vector<uint8_t>>& keep) {
                                 TensorToWrite* w = find(tw, q0 + ".weight");
                                 keep.emplace_back(static_cast<const uint8_t*>(w->data),
                                                   static_cast<const uint8_t*>(w->data) + rows * 64);
                                 keep.back()[100] = 0x7f;
                                 keep.back()[200] = 0xff;
                                 w->data = keep.back().data();
                             });
    expect_has(load_error(),
               {"weights hold values that are not finite",
                q0 + ".weight: 2 of 4096 values not finite after FP8 dequantisation (first at index 100)"});
}

TEST_F(Fp8Errors, Fp8TensorsWithoutAQuantizationConfig) {
    testing::rewrite_config(fp8(), [](nlohmann::json& j) { j.erase("quantization_config"); });
    expect_has(load_error(), {q0 + ".weight: expected dtype BF16, found F8_E4M3 (an FP8 checkpoint's "
                                   "config.json has a compressed-tensors quantization_config)"});
}

TEST_F(Fp8Errors, UnsupportedQuantizationConfigsNameTheField) {
    using nlohmann::json;
    const std::string w = "quantization_config.config_groups.group_0.weights.";
    const std::vector<std::pair<std::function<void(json&)>, std::vector<std::string>>> cases = {
        {[](json& q) { q["config_groups"]["group_0"]["weights"]["num_bits"] = 6; },
         {w + "num_bits' must be 8 (FP8 weights) or 4 (int4 weights), found 6"}},
        {[](json& q) { q["config_groups"]["group_0"]["weights"]["num_bits"] = 4; },
         {w + "type' must be \"int\" for 4-bit weights (FP4 weights are not supported), found \"float\""}},
        {[](json& q) { q["format"] = "pack-quantized"; },
         {"quantization_config.format' must be float-quantized or naive-quantized (FP8 weights: num_bits 8, "
          "type float), found \"pack-quantized\""}},
        {[](json& q) { q["config_groups"]["group_0"]["format"] = "int-quantized"; },
         {"group_0.format'", "found \"int-quantized\""}},
        {[](json& q) { q["config_groups"]["group_0"]["weights"]["type"] = "int"; },
         {w + "type' must be \"float\" for 8-bit weights", "found \"int\""}},
        {[](json& q) { q["config_groups"]["group_0"]["weights"]["strategy"] = "group"; },
         {w + "strategy' must be \"channel\" or \"tensor\"", "found \"group\""}},
        {[](json& q) { q["config_groups"]["group_0"]["weights"]["group_size"] = 128; },
         {w + "group_size' must be null or absent", "found 128"}},
        {[](json& q) { q["config_groups"]["group_0"]["weights"]["strategy"] = "block"; },
         {w + "strategy'", "found \"block\""}},
        {[](json& q) { q["config_groups"]["group_0"]["weights"]["symmetric"] = false; },
         {w + "symmetric' must be true", "found false"}},
        {[](json& q) { q["config_groups"]["group_0"]["weights"]["dynamic"] = true; },
         {w + "dynamic' must be false", "found true"}},
        {[](json& q) { q["quant_method"] = "fp8"; },
         {"quantization_config.quant_method' must be \"compressed-tensors\"", "found \"fp8\""}},
        {[](json& q) { q.erase("quant_method"); }, {"quant_method'", "found \"\""}},
        {[](json& q) {
             q["kv_cache_scheme"] = {{"num_bits", 8}};
         },
         {"quantization_config.kv_cache_scheme' must be null or absent", "KV cache"}},
        {[](json& q) { q["config_groups"] = json::object(); },
         {"quantization_config.config_groups' must be an object of one or more groups"}},
        {[](json& q) { q["config_groups"]["group_0"].erase("targets"); }, {"group_0.targets' is required"}},
        {[](json& q) { q["config_groups"]["group_0"].erase("weights"); }, {"group_0.weights' is required"}},
        {[](json& q) { q["ignore"] = {5}; }, {"quantization_config.ignore[0]' must be a string, found 5"}},
        {[](json& q) { q["ignore"].push_back("re:(unclosed"); },
         {"quantization_config.ignore[1]'", "'(' without its ')'"}},
        {[](json& q) {
             q["sparsity_config"] = {{"format", "sparse-24-bitmask"}};
         },
         {"sparsity_config.format' must be \"dense\""}},
        {[](json& q) { q = "fp8"; }, {"field 'quantization_config' must be an object, found \"fp8\""}},
    };
    const nlohmann::json good = nlohmann::json::parse(std::ifstream(fp8() / "config.json"));
    for (const auto& [edit, needles] : cases) {
        testing::rewrite_config(fp8(), [&](json& j) {
            j = good;
            edit(j["quantization_config"]);
        });
        std::vector<std::string> all = needles;
        all.push_back((fp8() / "config.json").string() + ": field '");
        expect_has(load_error(), all);
    }
}

class Fp8MoeErrors : public Fp8Errors {
    std::string family() const override { return "26b-a4b"; }
};

TEST_F(Fp8MoeErrors, MissingPerExpertTensors) {
    const std::string up5 = prefix + "layers.1.experts.5.up_proj.weight";
    testing::rewrite_tensors(fp8(), [&](auto& tw, auto&) { drop(tw, up5); });
    expect_has(load_error(), {"missing tensor " + up5 +
                              " (expected F8_E4M3 [24, 64]: one expert's part of the fused experts tensor)"});

    testing::rewrite_tensors(fp8(), [&](std::vector<TensorToWrite>& tw, auto&) {
        std::erase_if(
            tw, [&](const TensorToWrite& t) { return t.name.rfind(prefix + "layers.2.experts.", 0) == 0; });
    });
    expect_has(load_error(), {"missing tensor " + prefix +
                                  "layers.2.experts.gate_up_proj (expected BF16 [8, 48, 64], or "
                                  "llm-compressor's per-expert F8_E4M3 tensors " +
                                  prefix + "layers.2.experts.{0..7}.{gate_proj,up_proj}.weight)",
                              "missing tensor " + prefix + "layers.2.experts.down_proj"});
}

TEST_F(Fp8MoeErrors, PerExpertScaleMissing) {
    const std::string down3 = prefix + "layers.0.experts.3.down_proj";
    testing::rewrite_tensors(fp8(), [&](auto& tw, auto&) { drop(tw, down3 + ".weight_scale"); });
    expect_has(load_error(),
               {"missing tensor " + down3 + ".weight_scale (expected F32 or BF16 [64, 1] per channel"});
}

}  // namespace
}  // namespace markbase
