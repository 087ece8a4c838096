#include "support/fp8_checkpoints.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>

#include "loading/checkpoint.h"
#include "model/fp8.h"
#include "model/tensor_plan.h"

namespace markbase::testing {

namespace fs = std::filesystem;

namespace {

struct Quantized {
    std::vector<uint8_t> q;
    std::vector<float> scale;  // one per row, or one for the tensor
    std::vector<bf16> deq;
};

Quantized per_channel(const bf16* w, int64_t rows, int64_t K) {
    Quantized out{std::vector<uint8_t>(rows * K), std::vector<float>(rows), std::vector<bf16>(rows * K)};
    for (int64_t r = 0; r < rows; ++r) {
        out.scale[r] = quantize_row_fp8(w + r * K, K, out.q.data() + r * K);
        dequantize_row_fp8(out.q.data() + r * K, out.scale[r], K, out.deq.data() + r * K);
    }
    return out;
}

// One scale for the matrix, stored as bf16 (its value rounded before use, so file and reference agree).
Quantized per_tensor(const bf16* w, int64_t rows, int64_t K) {
    float amax = 0;
    for (int64_t i = 0; i < rows * K; ++i) amax = std::max(amax, std::fabs(bf16_to_float(w[i])));
    const float s = round_to_bf16(amax > 0 ? amax / kFp8Max : 1.0f);
    Quantized out{std::vector<uint8_t>(rows * K), {s}, std::vector<bf16>(rows * K)};
    for (int64_t i = 0; i < rows * K; ++i) out.q[i] = float_to_fp8_e4m3(bf16_to_float(w[i]) / s);
    for (int64_t r = 0; r < rows; ++r) dequantize_row_fp8(out.q.data() + r * K, s, K, out.deq.data() + r * K);
    return out;
}

// The tensors of both outputs, and the bytes behind them (a deque: what is added never moves what is there).
struct Outputs {
    std::vector<TensorToWrite> fp8, ref;
    std::deque<std::vector<uint8_t>> bytes;

    template <class T>
    const void* own(const std::vector<T>& v) {
        bytes.emplace_back(v.size() * sizeof(T));
        std::memcpy(bytes.back().data(), v.data(), bytes.back().size());
        return bytes.back().data();
    }
    void fp8_module(const std::string& module, const Quantized& qz, int64_t rows, int64_t K,
                    bool tensor_scale, bool input_scale) {
        fp8.push_back({module + ".weight", DType::F8_E4M3, {rows, K}, own(qz.q)});
        if (tensor_scale) {
            fp8.push_back({module + ".weight_scale",
                           DType::BF16,
                           {},
                           own(std::vector<bf16>{float_to_bf16(qz.scale[0])})});
        } else {
            fp8.push_back({module + ".weight_scale", DType::F32, {rows, 1}, own(qz.scale)});
        }
        if (input_scale)
            fp8.push_back({module + ".input_scale", DType::F32, {1}, own(std::vector<float>{0.05f})});
    }
};

// Fused experts [E, R, K] as llm-compressor unfuses them: per expert gate_proj + up_proj (R = 2 Ie) or
// down_proj.
void write_experts(Outputs& out, const std::string& name, const std::vector<bf16>& w,
                   const std::vector<int64_t>& shape, bool input_scales) {
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
            const Quantized qz = per_channel(w.data() + r0 * K, part_rows, K);
            std::copy(qz.deq.begin(), qz.deq.end(), deq.begin() + r0 * K);
            out.fp8_module(base + std::to_string(e) + "." + parts[i], qz, part_rows, K, false, input_scales);
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

void write_fp8_copy(const fs::path& src, const fs::path& fp8_dir, const fs::path& ref_dir,
                    const Fp8Layout& layout) {
    const auto ck = load_checkpoint(src);
    std::map<std::string, std::vector<int64_t>> matrices;
    for (const PlannedTensor& p : plan_tensors(ck->config, nullptr))
        if (p.role == TensorRole::Matrix) matrices[ck->config.weight_prefix + p.name] = p.shape;

    Outputs out;
    const SafetensorsSet files = SafetensorsSet::open(src / "model.safetensors");
    for (const auto& [name, t] : files.tensors()) {
        if (!matrices.count(name) || !layout.quantized(name)) {
            out.fp8.push_back({name, t.dtype, t.shape, t.data});
            out.ref.push_back({name, t.dtype, t.shape, t.data});
            continue;
        }
        std::vector<bf16> w(static_cast<size_t>(t.numel()));  // copied: the mapping promises no alignment
        std::memcpy(w.data(), t.data, t.nbytes);
        if (t.shape.size() == 3) {
            write_experts(out, name, w, t.shape, layout.input_scales);
            continue;
        }
        const int64_t rows = t.shape[0], K = t.shape[1];
        const bool tensor_scale = layout.per_tensor.count(name) > 0;
        const Quantized qz = tensor_scale ? per_tensor(w.data(), rows, K) : per_channel(w.data(), rows, K);
        out.fp8_module(name.substr(0, name.size() - 7), qz, rows, K, tensor_scale, layout.input_scales);
        out.ref.push_back({name, DType::BF16, t.shape, out.own(qz.deq)});
    }
    fs::create_directories(fp8_dir);
    fs::create_directories(ref_dir);
    write_safetensors(fp8_dir / "model.safetensors", out.fp8);
    write_safetensors(ref_dir / "model.safetensors", out.ref);

    nlohmann::json config = read_json(src / "config.json");
    write_json(ref_dir / "config.json", config);
    nlohmann::json qc = fp8_quantization_config(layout.ignore);
    if (layout.input_scales)
        qc["config_groups"]["group_0"]["input_activations"].update(
            {{"dynamic", false}, {"strategy", "tensor"}});
    config["quantization_config"] = qc;
    write_json(fp8_dir / "config.json", config);
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
