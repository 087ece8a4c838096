#include "support/quant_checkpoints.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>

#include "loading/checkpoint.h"
#include "model/fp8.h"
#include "model/int4.h"
#include "model/tensor_plan.h"
#include "runtime/backend.h"
#include "support/exact_options.h"
#include "support/logits_compare.h"

namespace markbase::testing {

namespace fs = std::filesystem;

namespace {

// The tensors of both outputs, and the bytes behind them (a deque: what is added never moves what is there).
struct Outputs {
    std::vector<TensorToWrite> q, ref;
    std::deque<std::vector<uint8_t>> bytes;

    template <class T>
    const void* own(const std::vector<T>& v) {
        bytes.emplace_back(v.size() * sizeof(T));
        std::memcpy(bytes.back().data(), v.data(), bytes.back().size());
        return bytes.back().data();
    }
};

// Writes one module's quantised tensors for rows x K weights w into out.q; returns their dequantised values.
using ModuleWriter = std::function<std::vector<bf16>(Outputs&, const std::string& module, const bf16* w,
                                                     int64_t rows, int64_t K)>;

// Fused experts [E, R, K] as llm-compressor unfuses them: per expert gate_proj + up_proj (R = 2 Ie) or
// down_proj, each a module.
void write_experts(Outputs& out, const std::string& name, const std::vector<bf16>& w,
                   const std::vector<int64_t>& shape, const ModuleWriter& module) {
    const bool gate_up = name.size() > 12 && name.compare(name.size() - 12, 12, "gate_up_proj") == 0;
    const std::string base = name.substr(0, name.size() - (gate_up ? 12 : 9));
    const int64_t E = shape[0], R = shape[1], K = shape[2];
    const std::vector<std::string> parts =
        gate_up ? std::vector<std::string>{"gate_proj", "up_proj"} : std::vector<std::string>{"down_proj"};
    const int64_t part_rows = R / static_cast<int64_t>(parts.size());
    std::vector<bf16> deq(w.size());
    for (int64_t e = 0; e < E; ++e) {
        for (size_t i = 0; i < parts.size(); ++i) {
            const int64_t r0 = e * R + static_cast<int64_t>(i) * part_rows;
            const std::vector<bf16> d =
                module(out, base + std::to_string(e) + "." + parts[i], w.data() + r0 * K, part_rows, K);
            std::copy(d.begin(), d.end(), deq.begin() + r0 * K);
        }
    }
    out.ref.push_back({name, DType::BF16, shape, out.own(deq)});
}

nlohmann::json read_json(const fs::path& p) {
    return nlohmann::json::parse(std::ifstream(p));
}

void write_json(const fs::path& p, const nlohmann::json& j) {
    std::ofstream(p) << j.dump(1) << "\n";
}

// The quantised copy of src and its dequantised bf16 reference, with `qc` as config.json's
// quantization_config.
void write_copy(const fs::path& src, const fs::path& q_dir, const fs::path& ref_dir,
                const std::function<bool(const std::string&)>& quantized, const ModuleWriter& module,
                const nlohmann::json& qc) {
    const auto ck = load_checkpoint(src);
    std::map<std::string, std::vector<int64_t>> matrices;
    for (const PlannedTensor& p : plan_tensors(ck->config, nullptr))
        if (p.role == TensorRole::Matrix) matrices[ck->config.weight_prefix + p.name] = p.shape;

    Outputs out;
    const SafetensorsSet files = SafetensorsSet::open(src / "model.safetensors");
    for (const auto& [name, t] : files.tensors()) {
        if (!matrices.count(name) || !quantized(name)) {
            out.q.push_back({name, t.dtype, t.shape, t.data});
            out.ref.push_back({name, t.dtype, t.shape, t.data});
            continue;
        }
        std::vector<bf16> w(static_cast<size_t>(t.numel()));  // copied: the mapping promises no alignment
        std::memcpy(w.data(), t.data, t.nbytes);
        if (t.shape.size() == 3) {
            write_experts(out, name, w, t.shape, module);
            continue;
        }
        const std::vector<bf16> deq =
            module(out, name.substr(0, name.size() - 7), w.data(), t.shape[0], t.shape[1]);
        out.ref.push_back({name, DType::BF16, t.shape, out.own(deq)});
    }
    fs::create_directories(q_dir);
    fs::create_directories(ref_dir);
    write_safetensors(q_dir / "model.safetensors", out.q);
    write_safetensors(ref_dir / "model.safetensors", out.ref);

    nlohmann::json config = read_json(src / "config.json");
    write_json(ref_dir / "config.json", config);
    config["quantization_config"] = qc;
    write_json(q_dir / "config.json", config);
}

// One FP8 module: a scale per row (F32 [rows, 1]), or one for the matrix stored as bf16 (its value rounded
// before use, so file and reference agree).
std::vector<bf16> write_fp8_module(Outputs& out, const std::string& module, const bf16* w, int64_t rows,
                                   int64_t K, bool tensor_scale, bool input_scale) {
    std::vector<uint8_t> q(static_cast<size_t>(rows * K));
    std::vector<float> scale(static_cast<size_t>(rows));
    std::vector<bf16> deq(static_cast<size_t>(rows * K));
    if (tensor_scale) {
        float amax = 0;
        for (int64_t i = 0; i < rows * K; ++i) amax = std::max(amax, std::fabs(bf16_to_float(w[i])));
        const float s = round_to_bf16(amax > 0 ? amax / kFp8Max : 1.0f);
        for (int64_t i = 0; i < rows * K; ++i) q[i] = float_to_fp8_e4m3(bf16_to_float(w[i]) / s);
        std::fill(scale.begin(), scale.end(), s);
    } else {
        for (int64_t r = 0; r < rows; ++r) scale[r] = quantize_row_fp8(w + r * K, K, q.data() + r * K);
    }
    for (int64_t r = 0; r < rows; ++r) dequantize_row_fp8(q.data() + r * K, scale[r], K, deq.data() + r * K);
    out.q.push_back({module + ".weight", DType::F8_E4M3, {rows, K}, out.own(q)});
    if (tensor_scale)
        out.q.push_back(
            {module + ".weight_scale", DType::BF16, {}, out.own(std::vector<bf16>{float_to_bf16(scale[0])})});
    else
        out.q.push_back({module + ".weight_scale", DType::F32, {rows, 1}, out.own(scale)});
    if (input_scale)
        out.q.push_back({module + ".input_scale", DType::F32, {1}, out.own(std::vector<float>{0.05f})});
    return deq;
}

// One int4 module: model/int4.h's codes and scales, packed and stored as compressed-tensors does.
std::vector<bf16> write_int4_module(Outputs& out, const std::string& module, const bf16* w, int64_t rows,
                                    int64_t K, const Int4Layout& layout) {
    const int64_t G = int4_groups(K), bytes = (K + 1) / 2;
    std::vector<uint8_t> q(static_cast<size_t>(rows * bytes)), zero(static_cast<size_t>(rows * G));
    std::vector<float> scale(static_cast<size_t>(rows * G));
    std::vector<bf16> deq(static_cast<size_t>(rows * K));
    std::vector<uint8_t> codes(static_cast<size_t>(rows * K));
    for (int64_t r = 0; r < rows; ++r) {
        uint8_t* z = layout.symmetric ? nullptr : zero.data() + r * G;
        quantize_row_int4(w + r * K, K, q.data() + r * bytes, scale.data() + r * G, z);
        dequantize_row_int4(q.data() + r * bytes, scale.data() + r * G, z, K, deq.data() + r * K);
        for (int64_t k = 0; k < K; ++k) codes[r * K + k] = (q[r * bytes + k / 2] >> (4 * (k % 2))) & 0xf;
    }
    out.q.push_back({module + ".weight_packed",
                     DType::I32,
                     {rows, (K + 7) / 8},
                     out.own(pack_int4_codes(codes, rows, K, 1))});
    if (layout.scale_dtype == DType::F32) {
        out.q.push_back({module + ".weight_scale", DType::F32, {rows, G}, out.own(scale)});
    } else {
        std::vector<bf16> s(scale.size());
        for (size_t i = 0; i < s.size(); ++i) s[i] = float_to_bf16(scale[i]);
        out.q.push_back({module + ".weight_scale", DType::BF16, {rows, G}, out.own(s)});
    }
    if (layout.shape_dtype == DType::I32)
        out.q.push_back({module + ".weight_shape",
                         DType::I32,
                         {2},
                         out.own(std::vector<int32_t>{static_cast<int32_t>(rows), static_cast<int32_t>(K)})});
    else
        out.q.push_back({module + ".weight_shape", DType::I64, {2}, out.own(std::vector<int64_t>{rows, K})});
    if (layout.symmetric) return deq;
    if (layout.unpacked_zero_points) {
        std::vector<int8_t> z(zero.size());
        for (size_t i = 0; i < z.size(); ++i) z[i] = static_cast<int8_t>(zero[i] - 8);
        out.q.push_back({module + ".weight_zero_point", DType::I8, {rows, G}, out.own(z)});
    } else {
        out.q.push_back({module + ".weight_zero_point",
                         DType::I32,
                         {(rows + 7) / 8, G},
                         out.own(pack_int4_codes(zero, rows, G, 0))});
    }
    return deq;
}

}  // namespace

nlohmann::json fp8_quantization_config(const nlohmann::json& ignore) {
    const nlohmann::json weights = {
        {"num_bits", 8},       {"type", "float"},       {"strategy", "channel"},      {"symmetric", true},
        {"dynamic", false},    {"group_size", nullptr}, {"block_structure", nullptr}, {"actorder", nullptr},
        {"observer", "minmax"}};
    const nlohmann::json acts = {{"num_bits", 8},     {"type", "float"}, {"strategy", "token"},
                                 {"symmetric", true}, {"dynamic", true}, {"observer", nullptr}};
    return {{"quant_method", "compressed-tensors"},
            {"format", "float-quantized"},
            {"quantization_status", "compressed"},
            {"config_groups",
             {{"group_0",
               {{"targets", {"Linear"}},
                {"weights", weights},
                {"input_activations", acts},
                {"output_activations", nullptr},
                {"format", "float-quantized"}}}}},
            {"ignore", ignore},
            {"kv_cache_scheme", nullptr},
            {"sparsity_config", nlohmann::json::object()},
            {"version", "0.10.2"}};
}

nlohmann::json int4_quantization_config(const nlohmann::json& ignore, bool symmetric) {
    const nlohmann::json weights = {{"num_bits", 4},
                                    {"type", "int"},
                                    {"strategy", "group"},
                                    {"symmetric", symmetric},
                                    {"dynamic", false},
                                    {"group_size", 128},
                                    {"block_structure", nullptr},
                                    {"actorder", nullptr},
                                    {"observer", "minmax"},
                                    {"observer_kwargs", nlohmann::json::object()}};
    return {{"quant_method", "compressed-tensors"},
            {"format", "pack-quantized"},
            {"quantization_status", "compressed"},
            {"config_groups",
             {{"group_0",
               {{"targets", {"Linear"}},
                {"weights", weights},
                {"input_activations", nullptr},
                {"output_activations", nullptr},
                {"format", "pack-quantized"}}}}},
            {"ignore", ignore},
            {"kv_cache_scheme", nullptr},
            {"sparsity_config", nlohmann::json::object()},
            {"transform_config", nlohmann::json::object()},
            {"global_compression_ratio", nullptr},
            {"version", "0.12.2"}};
}

std::vector<int32_t> pack_int4_codes(const std::vector<uint8_t>& codes, int64_t rows, int64_t n,
                                     int packed_dim) {
    const int64_t words_r = packed_dim == 1 ? rows : (rows + 7) / 8;
    const int64_t words_c = packed_dim == 1 ? (n + 7) / 8 : n;
    std::vector<uint32_t> w(static_cast<size_t>(words_r * words_c), 0);
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < n; ++c) {
            const uint32_t code = codes[r * n + c] & 0xfu;
            if (packed_dim == 1)
                w[r * words_c + c / 8] |= code << (4 * (c % 8));
            else
                w[(r / 8) * words_c + c] |= code << (4 * (r % 8));
        }
    }
    std::vector<int32_t> out(w.size());
    std::memcpy(out.data(), w.data(), w.size() * 4);  // the int32 torch holds: the same bits
    return out;
}

void write_fp8_copy(const fs::path& src, const fs::path& fp8_dir, const fs::path& ref_dir,
                    const Fp8Layout& layout) {
    nlohmann::json qc = fp8_quantization_config(layout.ignore);
    if (layout.input_scales)
        qc["config_groups"]["group_0"]["input_activations"].update(
            {{"dynamic", false}, {"strategy", "tensor"}});
    write_copy(
        src, fp8_dir, ref_dir, layout.quantized,
        [&](Outputs& out, const std::string& module, const bf16* w, int64_t rows, int64_t K) {
            return write_fp8_module(out, module, w, rows, K, layout.per_tensor.count(module + ".weight") > 0,
                                    layout.input_scales);
        },
        qc);
}

void write_int4_copy(const fs::path& src, const fs::path& int4_dir, const fs::path& ref_dir,
                     const Int4Layout& layout) {
    write_copy(
        src, int4_dir, ref_dir, layout.quantized,
        [&](Outputs& out, const std::string& module, const bf16* w, int64_t rows, int64_t K) {
            return write_int4_module(out, module, w, rows, K, layout);
        },
        int4_quantization_config(layout.ignore, layout.symmetric));
}

void expect_same_bf16(const Checkpoint& a, const Checkpoint& b) {
    Weights wa = a.weights, wb = b.weights;
    const std::vector<PlannedTensor> pa = plan_bound_tensors(a.config, wa),
                                     pb = plan_bound_tensors(b.config, wb);
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
        int64_t n = 1;
        for (int64_t d : pa[i].shape) n *= d;
        EXPECT_EQ(std::memcmp(*pa[i].slot, *pb[i].slot, static_cast<size_t>(n) * 2), 0) << pa[i].name;
    }
}

void expect_same_logits(const Checkpoint& a, const Checkpoint& b) {
    auto logits = [](const Checkpoint& ck) {
        BackendOptions o = testing::exact_options();
        o.threads = 2;
        o.ctx_size = 64;
        auto be = make_cpu_backend(ck, o);
        return all_logits(*be, random_ids(12, static_cast<int>(ck.config.vocab_size), 5), false);
    };
    const std::vector<float> la = logits(a), lb = logits(b);
    ASSERT_EQ(la.size(), lb.size());
    EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)), 0) << "logits differ";
}

std::vector<uint8_t> file_bytes(const Checkpoint& ck, const std::string& name) {
    const TensorInfo& t = ck.files.get(name);
    return {t.data, t.data + t.nbytes};
}

void rewrite_tensors(const fs::path& dir, const TensorEdit& edit) {
    std::vector<TensorToWrite> tw;
    std::vector<std::vector<uint8_t>> keep;
    {
        const SafetensorsSet s = SafetensorsSet::open(dir / "model.safetensors");
        for (const auto& [name, t] : s.tensors()) {
            keep.emplace_back(t.data, t.data + t.nbytes);
            tw.push_back({name, t.dtype, t.shape, keep.back().data()});
        }
        edit(tw, keep);
    }
    write_safetensors(dir / "model.safetensors", tw);
}

void rewrite_config(const fs::path& dir, const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = read_json(dir / "config.json");
    edit(j);
    write_json(dir / "config.json", j);
}

}  // namespace markbase::testing
