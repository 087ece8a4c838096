// An int4 (pack-quantized) checkpoint that does not match its config, or a quantization_config we cannot
// read: each problem is a markbase::Error naming config.json and the field, or the file and the tensor, with
// what was expected and what was found, every problem of a load in one message. Never a crash, never a silent
// load.
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
using nlohmann::json;
using testing::error_of;
using testing::expect_has;

void drop(std::vector<TensorToWrite>& tw, const std::string& name) {
    std::erase_if(tw, [&](const TensorToWrite& t) { return t.name == name; });
}

class Int4Errors : public ::testing::Test {
  protected:
    void SetUp() override {
        write_random_checkpoint(dir.path() / "bf16", testing::tiny_int4_config(family()), 5);
        testing::Int4Layout layout;
        layout.quantized = [](const std::string& n) { return n.find("per_layer") == std::string::npos; };
        layout.symmetric = symmetric();
        layout.ignore = {"re:.*per_layer.*"};
        testing::write_int4_copy(dir.path() / "bf16", int4(), dir.path() / "ref", layout);
        prefix = load_checkpoint(dir.path() / "ref")->config.weight_prefix;
        q0 = prefix + "layers.0.self_attn.q_proj";
        file = (int4() / "model.safetensors").string();
    }
    virtual std::string family() const { return "e2b"; }
    virtual bool symmetric() const { return true; }
    fs::path int4() const { return dir.path() / "int4"; }
    std::string load_error() const {
        return error_of([&] { load_checkpoint(int4()); });
    }
    // `name` replaced by a tensor of this dtype, shape and bytes (zeros where bytes is empty)
    void replace(const std::string& name, DType dtype, std::vector<int64_t> shape,
                 std::vector<uint8_t> bytes = {}) {
        testing::rewrite_tensors(
            int4(), [&](std::vector<TensorToWrite>& tw, std::vector<std::vector<uint8_t>>& keep) {
                int64_t n = 1;
                for (int64_t d : shape) n *= d;
                bytes.resize(static_cast<size_t>(n * dtype_size(dtype)));
                keep.push_back(bytes);
                drop(tw, name);
                tw.push_back({name, dtype, shape, keep.back().data()});
            });
    }
    template <class T>
    static std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
        std::vector<uint8_t> b(v.size() * sizeof(T));
        std::memcpy(b.data(), v.data(), b.size());
        return b;
    }

    testing::TempDir dir{"int4_errors"};
    std::string prefix, q0, file;
    const int64_t rows = 128, K = 128;  // q_proj: 4 heads of 32 over hidden 128: one group a row
};

TEST_F(Int4Errors, MissingScaleShapeOrPackedWeight) {
    testing::rewrite_tensors(int4(), [&](auto& tw, auto&) {
        drop(tw, q0 + ".weight_scale");
        drop(tw, q0 + ".weight_shape");
    });
    expect_has(load_error(), {"checkpoint does not match config.json (2 problems)",
                              "missing tensor " + q0 +
                                  ".weight_scale (expected BF16, F16 or F32 [128, 1]: a scale per 128 "
                                  "weights of " +
                                  q0 + ".weight_packed)",
                              "missing tensor " + q0 +
                                  ".weight_shape (expected I32 or I64 [2] holding [128, 128]: the "
                                  "unpacked shape of " +
                                  q0 + ".weight_packed)"});
    testing::rewrite_tensors(int4(), [&](auto& tw, auto&) { drop(tw, q0 + ".weight_packed"); });
    expect_has(load_error(), {"missing tensor " + q0 +
                              ".weight_packed (expected I32 [128, 16], eight int4 weights a word with its "
                              "weight_scale and weight_shape: config.json's quantization_config quantizes " +
                              q0 + ")"});
}

TEST_F(Int4Errors, PackedWeightOfTheWrongDtypeOrShape) {
    replace(q0 + ".weight_packed", DType::U8, {rows, 64});
    expect_has(load_error(),
               {file, q0 + ".weight_packed: expected dtype I32 (eight int4 weights a word), found U8"});
    replace(q0 + ".weight_packed", DType::I32, {rows, 32});
    expect_has(load_error(),
               {file, q0 + ".weight_packed: expected shape [128, 16] (128 weights a row, eight a "
                           "word), found [128, 32]"});
}

TEST_F(Int4Errors, WeightShapeMustHoldTheConfigsShape) {
    replace(q0 + ".weight_shape", DType::I64, {2}, bytes_of(std::vector<int64_t>{128, 256}));
    expect_has(load_error(), {file, q0 +
                                        ".weight_shape: holds [128, 256], expected [128, 128] (the shape "
                                        "config.json gives " +
                                        q0 + ".weight)"});
    replace(q0 + ".weight_shape", DType::F32, {2});
    expect_has(load_error(), {q0 + ".weight_shape: expected dtype I32 or I64, found F32"});
    replace(q0 + ".weight_shape", DType::I32, {3});
    expect_has(load_error(), {q0 + ".weight_shape: expected shape [2], found [3]"});
    replace(q0 + ".weight_shape", DType::I32, {2}, bytes_of(std::vector<int32_t>{128, 128}));
    EXPECT_EQ(load_error(), "(no error)");
}

TEST_F(Int4Errors, ScalesOfTheWrongDtypeShapeOrValue) {
    replace(q0 + ".weight_scale", DType::I32, {rows, 1});
    expect_has(load_error(), {file, q0 + ".weight_scale: expected dtype BF16, F16 or F32, found I32"});
    replace(q0 + ".weight_scale", DType::BF16, {rows, 2});
    expect_has(load_error(),
               {q0 + ".weight_scale: expected shape [128, 1] (a scale per 128 weights), found [128, 2]"});
    replace(q0 + ".weight_scale", DType::BF16, {rows});
    expect_has(load_error(), {q0 + ".weight_scale: expected shape [128, 1]", "found [128]"});
    for (const auto& [value, shown] : std::vector<std::pair<float, std::string>>{
             {NAN, "nan"}, {INFINITY, "inf"}, {0.0f, "0"}, {-0.5f, "-0.5"}}) {
        std::vector<float> s(static_cast<size_t>(rows), 0.01f);
        s[3] = value;
        replace(q0 + ".weight_scale", DType::F32, {rows, 1}, bytes_of(s));
        expect_has(load_error(),
                   {file, q0 + ".weight_scale: 1 of 128 scales are not finite numbers > 0 (first at row 3: " +
                              shown + ")"});
    }
    // F16 is read too
    replace(q0 + ".weight_scale", DType::F16, {rows, 1}, bytes_of(std::vector<uint16_t>(rows, 0x2c00)));
    const auto ck = load_checkpoint(int4());
    EXPECT_EQ(ck->weights.quant[0].q_proj.scale[5], 0.0625f);
}

TEST_F(Int4Errors, AGroupScaleIsNamedByRowAndGroup) {
    // a full-attention layer's o_proj: [128, 4 heads of 64], two groups a row
    const ModelConfig c = load_checkpoint(dir.path() / "ref")->config;
    int full = 0;
    while (c.layers[static_cast<size_t>(full)].kind != AttentionKind::Full) ++full;
    const std::string o = prefix + "layers." + std::to_string(full) + ".self_attn.o_proj";
    std::vector<float> s(static_cast<size_t>(rows * 2), 0.01f);
    s[2 * 7 + 1] = -1.0f;
    s[2 * 9] = 0.0f;
    replace(o + ".weight_scale", DType::F32, {rows, 2}, bytes_of(s));
    expect_has(load_error(),
               {o + ".weight_scale: 2 of 256 scales are not finite numbers > 0 (first at row 7, "
                    "group 1: -1)"});
}

TEST_F(Int4Errors, Int4WhereTheConfigSaysBf16AndBf16WhereItSaysInt4) {
    testing::rewrite_config(int4(), [&](json& j) { j["quantization_config"]["ignore"].push_back(q0); });
    expect_has(load_error(), {file, q0 + ".weight_packed: expected BF16 " + q0 +
                                        ".weight in its place (config.json's quantization_config ignores " +
                                        q0 + "), found I32 packed int4 weights"});
    testing::rewrite_config(int4(), [&](json& j) { j["quantization_config"]["ignore"].erase(1); });
    std::vector<uint16_t> w(static_cast<size_t>(rows * K), 0x3c00);
    testing::rewrite_tensors(int4(), [&](auto& tw, auto&) {
        drop(tw, q0 + ".weight_packed");
        tw.push_back({q0 + ".weight", DType::BF16, {rows, K}, w.data()});
    });
    expect_has(load_error(), {file, "tensor " + q0 + ".weight: expected int4 " + q0 +
                                        ".weight_packed in its place (config.json's quantization_config "
                                        "quantizes " +
                                        q0 + "), found BF16"});
}

TEST_F(Int4Errors, CompanionsTheSchemeDoesNotHave) {
    replace(q0 + ".weight_zero_point", DType::I32, {rows / 8, 1});
    replace(q0 + ".weight_g_idx", DType::I32, {K});
    replace(q0 + ".weight", DType::BF16, {rows, K});
    expect_has(load_error(),
               {"(3 problems)",
                q0 + ".weight_zero_point: unexpected (config.json's quantization_config says symmetric: no "
                     "zero points)",
                q0 + ".weight_g_idx: activation-ordered groups (a g_idx mapping columns to groups) are not "
                     "supported",
                q0 + ".weight: unexpected beside " + q0 + ".weight_packed (the weight is stored once)"});
}

TEST_F(Int4Errors, UnsupportedQuantizationConfigsNameTheField) {
    const std::string w = "quantization_config.config_groups.group_0.weights.";
    auto weights = [](json& q) -> json& { return q["config_groups"]["group_0"]["weights"]; };
    const std::vector<std::pair<std::function<void(json&)>, std::vector<std::string>>> cases = {
        {[&](json& q) { weights(q)["group_size"] = 64; },
         {w + "group_size' must be 128 (the int4 layout holds a scale per 128 weights), found 64"}},
        {[&](json& q) { weights(q).erase("group_size"); }, {w + "group_size' must be 128", "found nothing"}},
        {[&](json& q) { weights(q)["num_bits"] = 2; },
         {w + "num_bits' must be 8 (FP8 weights) or 4 (int4 weights), found 2"}},
        {[&](json& q) { weights(q)["type"] = "float"; },
         {w + "type' must be \"int\" for 4-bit weights (FP4 weights are not supported), found \"float\""}},
        {[&](json& q) { weights(q)["strategy"] = "channel"; },
         {w + "strategy' must be \"group\"", "found \"channel\""}},
        {[&](json& q) {
             weights(q)["strategy"] = "block";
             weights(q)["block_structure"] = {128, 128};
         },
         {w + "strategy' must be \"group\"", "found \"block\""}},
        {[&](json& q) { weights(q)["actorder"] = "group"; },
         {w + "actorder' must be null, false, \"weight\" or \"static\"", "weight_g_idx", "found \"group\""}},
        {[&](json& q) { weights(q)["actorder"] = true; }, {w + "actorder'", "found true"}},
        {[&](json& q) { weights(q)["dynamic"] = true; }, {w + "dynamic' must be false", "found true"}},
        {[&](json& q) { weights(q)["symmetric"] = "yes"; },
         {w + "symmetric' must be true or false, found \"yes\""}},
        {[&](json& q) {
             q["config_groups"]["group_0"]["input_activations"] = {{"num_bits", 8}, {"type", "int"}};
         },
         {"group_0.input_activations' must be null or absent (W4A16"}},
        {[&](json& q) { q["format"] = "float-quantized"; },
         {"quantization_config.format' must be pack-quantized (int4 weights: num_bits 4, type int), found "
          "\"float-quantized\""}},
        {[&](json& q) { q["config_groups"]["group_0"]["format"] = "naive-quantized"; },
         {"group_0.format' must be pack-quantized", "found \"naive-quantized\""}},
        {[&](json& q) {
             q["config_groups"]["group_1"] =
                 testing::fp8_quantization_config(json::array())["config_groups"]["group_0"];
             q["config_groups"]["group_1"]["targets"] = {"lm_head"};
         },
         {"group_1.weights' must use the scheme of the groups before it (one weight format a checkpoint), "
          "int4 symmetric, found FP8"}},
        {[&](json& q) {
             q["config_groups"]["group_1"] = q["config_groups"]["group_0"];
             q["config_groups"]["group_1"]["weights"]["symmetric"] = false;
         },
         {"group_1.weights' must use the scheme", "int4 symmetric, found int4 asymmetric"}},
    };
    const json good = json::parse(std::ifstream(int4() / "config.json"));
    for (const auto& [edit, needles] : cases) {
        testing::rewrite_config(int4(), [&](json& j) {
            j = good;
            edit(j["quantization_config"]);
        });
        std::vector<std::string> all = needles;
        all.push_back((int4() / "config.json").string() + ": field '");
        expect_has(load_error(), all);
    }
    // activation ordering that keeps the groups in order stores no g_idx: read as it is
    for (const json& order : {json("static"), json("weight"), json(false)}) {
        testing::rewrite_config(int4(), [&](json& j) {
            j = good;
            weights(j["quantization_config"])["actorder"] = order;
        });
        EXPECT_EQ(load_error(), "(no error)") << order;
    }
}

class Int4AsymmetricErrors : public Int4Errors {
    bool symmetric() const override { return false; }
};

TEST_F(Int4AsymmetricErrors, ZeroPointsMissingOfTheWrongLayoutOrOutOfRange) {
    testing::rewrite_tensors(int4(), [&](auto& tw, auto&) { drop(tw, q0 + ".weight_zero_point"); });
    expect_has(load_error(), {"missing tensor " + q0 +
                              ".weight_zero_point (expected I32 [16, 1] (eight zero points a word along the "
                              "output dimension) or I8 [128, 1]: config.json's quantization_config says "
                              "symmetric false)"});
    replace(q0 + ".weight_zero_point", DType::I32, {rows, 1});
    expect_has(load_error(), {file, q0 + ".weight_zero_point: expected I32 [16, 1]", "found I32 [128, 1]"});
    std::vector<int8_t> z(static_cast<size_t>(rows), -3);
    z[5] = 9;
    z[70] = -9;
    replace(q0 + ".weight_zero_point", DType::I8, {rows, 1}, bytes_of(z));
    expect_has(load_error(),
               {file, q0 + ".weight_zero_point: 2 of 128 zero points outside -8..7 (first at row "
                           "5, group 0: 9)"});
    z[5] = 7;
    z[70] = -8;
    replace(q0 + ".weight_zero_point", DType::I8, {rows, 1}, bytes_of(z));
    const auto ck = load_checkpoint(int4());
    EXPECT_EQ(ck->weights.quant[0].q_proj.zero[5], 15);
    EXPECT_EQ(ck->weights.quant[0].q_proj.zero[70], 0);
    EXPECT_EQ(ck->weights.quant[0].q_proj.zero[0], 5);
}

class Int4MoeErrors : public Int4Errors {
    std::string family() const override { return "26b-a4b"; }
    bool symmetric() const override { return false; }
};

TEST_F(Int4MoeErrors, MissingPerExpertTensors) {
    const std::string up5 = prefix + "layers.1.experts.5.up_proj";
    const std::string down3 = prefix + "layers.0.experts.3.down_proj";
    testing::rewrite_tensors(int4(), [&](auto& tw, auto&) {
        drop(tw, up5 + ".weight_packed");
        drop(tw, down3 + ".weight_zero_point");
    });
    expect_has(load_error(), {"missing tensor " + up5 +
                                  ".weight_packed (expected I32 [128, 16], eight int4 weights a word: one "
                                  "expert's part of the fused experts tensor)",
                              "missing tensor " + down3 + ".weight_zero_point (expected I32 [16, 1]"});

    testing::rewrite_tensors(int4(), [&](std::vector<TensorToWrite>& tw, auto&) {
        std::erase_if(
            tw, [&](const TensorToWrite& t) { return t.name.rfind(prefix + "layers.2.experts.", 0) == 0; });
    });
    expect_has(load_error(), {"missing tensor " + prefix +
                              "layers.2.experts.gate_up_proj (expected BF16 [8, 256, 128], or "
                              "llm-compressor's per-expert int4 tensors " +
                              prefix + "layers.2.experts.{0..7}.{gate_proj,up_proj}.weight_packed)"});
}

}  // namespace
}  // namespace markbase
