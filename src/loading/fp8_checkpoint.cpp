#include "loading/fp8_checkpoint.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <sstream>

namespace markbase {

namespace {

constexpr const char* kWeight = ".weight";
constexpr const char* kWeightScale = ".weight_scale";
constexpr const char* kInputScale = ".input_scale";

bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string shape_str(const std::vector<int64_t>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
}

std::string number_str(float v) {
    std::ostringstream o;
    o << v;
    return o.str();
}

// Element i of a F32 or BF16 scale tensor (the mapping gives no alignment for a 4-byte load).
float scale_at(const TensorInfo& t, int64_t i) {
    if (t.dtype == DType::BF16) {
        bf16 v;
        std::memcpy(&v, t.data + i * 2, sizeof v);
        return bf16_to_float(v);
    }
    float v;
    std::memcpy(&v, t.data + i * 4, sizeof v);
    return v;
}

std::array<const QuantMatrix*, 9> matrices_of(const LayerQuant& l) {
    return {&l.q_proj,  &l.k_proj,    &l.v_proj,          &l.o_proj,      &l.gate_proj,
            &l.up_proj, &l.down_proj, &l.experts_gate_up, &l.experts_down};
}

// What config.json says about a linear module, for messages.
std::string config_says(const QuantizationConfig& qc, const std::string& module, bool quantized) {
    if (quantized) return "config.json's quantization_config quantizes " + module;
    if (qc.ignores(module)) return "config.json's quantization_config ignores " + module;
    return "no target of config.json's quantization_config names " + module;
}

}  // namespace

PublishedFp8::PublishedFp8(Checkpoint& ck, const QuantizationConfig& qc, std::set<std::string>& used,
                           std::vector<std::string>& problems)
    : ck_(ck), qc_(qc), used_(used), problems_(problems) {}

bool PublishedFp8::bind(const PlannedTensor& p) {
    if (p.role != TensorRole::Matrix) return false;
    if (p.shape.size() == 3) return bind_experts(p);
    const std::string full = ck_.config.weight_prefix + p.name;
    const TensorInfo* t = ck_.files.find(full);
    const std::string module = full.substr(0, full.size() - std::strlen(kWeight));
    const bool want = qc_.quantizes(module);
    if (!t && want) {
        problem("missing tensor " + full + " (expected F8_E4M3 " + shape_str(p.shape) +
                " with its weight_scale: " + config_says(qc_, module, true) + ")");
        return true;
    }
    if (!t) return false;  // the bf16 binding reports it
    if (t->dtype == DType::BF16 && !want) return false;
    if (t->dtype == DType::F8_E4M3 && want) return bind_matrix(p, *t, module);
    problem(t->file + ": tensor " + full + ": expected dtype " + (want ? "F8_E4M3" : "BF16") + " (" +
            config_says(qc_, module, want) + "), found " + dtype_name(t->dtype));
    return true;
}

bool PublishedFp8::bind_matrix(const PlannedTensor& p, const TensorInfo& t, const std::string& module) {
    if (t.shape != p.shape) {
        problem(t.file + ": tensor " + t.name + ": expected shape " + shape_str(p.shape) + ", found " +
                shape_str(t.shape));
        return true;
    }
    const int64_t rows = p.shape[0], K = p.shape[1];
    float* scale = ck_.owned.new_scales(rows);
    if (!read_scales(module, rows, scale)) return true;
    set_aside_input_scale(module);
    RowJob j;
    j.name = t.name;
    j.file = t.file;
    j.rows = rows;
    j.K = K;
    j.parts = {t.data};
    j.part_rows = rows;
    j.scale = scale;
    j.out = ck_.owned.new_bf16(rows * K);
    *p.slot = j.out;
    if (p.quant) *p.quant = {t.data, scale};
    ck_.bound_bytes += t.nbytes;
    jobs_.push_back(std::move(j));
    return true;
}

bool PublishedFp8::read_scales(const std::string& module, int64_t rows, float* out) {
    const std::string name = module + kWeightScale;
    used_.insert(name);
    const TensorInfo* s = ck_.files.find(name);
    const std::string shapes = "[" + std::to_string(rows) + ", 1] per channel, or [1] or [] per tensor";
    if (!s) {
        problem("missing tensor " + name + " (expected F32 or BF16 " + shapes + ": the scale of " + module +
                kWeight + ", stored F8_E4M3)");
        return false;
    }
    if (s->dtype != DType::F32 && s->dtype != DType::BF16) {
        problem(s->file + ": tensor " + name + ": expected dtype F32 or BF16, found " + dtype_name(s->dtype));
        return false;
    }
    const bool per_row = s->shape == std::vector<int64_t>{rows, 1};
    if (!per_row && !s->shape.empty() && s->shape != std::vector<int64_t>{1}) {
        problem(s->file + ": tensor " + name + ": expected shape " + shapes + ", found " +
                shape_str(s->shape));
        return false;
    }
    const int64_t stored = per_row ? rows : 1;
    int64_t bad = 0, first = 0;
    for (int64_t i = 0; i < stored; ++i) {
        const float v = scale_at(*s, i);
        if (std::isfinite(v) && v > 0) continue;
        if (bad++ == 0) first = i;
    }
    if (bad) {
        problem(s->file + ": tensor " + name + ": " + std::to_string(bad) + " of " + std::to_string(stored) +
                " scales are not finite numbers > 0 (" +
                (per_row ? "first at row " + std::to_string(first) + ": " : "") +
                number_str(scale_at(*s, first)) + ")");
        return false;
    }
    for (int64_t r = 0; r < rows; ++r) out[r] = scale_at(*s, per_row ? r : 0);
    ck_.bound_bytes += s->nbytes;
    return true;
}

void PublishedFp8::set_aside_input_scale(const std::string& module) {
    const std::string name = module + kInputScale;
    if (!ck_.files.find(name)) return;
    used_.insert(name);
    ck_.skipped.push_back(name);
    ++input_scales_;
}

bool PublishedFp8::bind_experts(const PlannedTensor& p) {
    const std::string full = ck_.config.weight_prefix + p.name;
    if (ck_.files.find(full)) return false;  // kept fused: the bf16 binding checks it
    const bool gate_up = ends_with(p.name, "gate_up_proj");
    const std::string base =
        full.substr(0, full.size() - std::strlen(gate_up ? "gate_up_proj" : "down_proj"));
    const std::vector<std::string> parts =
        gate_up ? std::vector<std::string>{"gate_proj", "up_proj"} : std::vector<std::string>{"down_proj"};
    const int64_t E = p.shape[0], rows = p.shape[1], K = p.shape[2];
    const int64_t part_rows = rows / static_cast<int64_t>(parts.size());
    if (!ck_.files.find(base + "0." + parts[0] + kWeight)) {
        problem("missing tensor " + full + " (expected BF16 " + shape_str(p.shape) +
                ", or llm-compressor's per-expert F8_E4M3 tensors " + base + "{0.." + std::to_string(E - 1) +
                "}." + (gate_up ? "{gate_proj,up_proj}" : "down_proj") + kWeight + ")");
        return true;
    }
    RowJob j;
    j.name = full;
    j.rows = E * rows;
    j.K = K;
    j.part_rows = part_rows;
    j.scale = ck_.owned.new_scales(E * rows);
    bool ok = true;
    for (int64_t e = 0; e < E; ++e)
        for (size_t i = 0; i < parts.size(); ++i)
            ok = take_expert_part(base + std::to_string(e) + "." + parts[i], part_rows, K,
                                  j.scale + e * rows + static_cast<int64_t>(i) * part_rows, j) &&
                 ok;
    if (!ok) return true;
    j.q_out = ck_.owned.new_quant(E * rows * K);
    j.out = ck_.owned.new_bf16(E * rows * K);
    *p.slot = j.out;
    if (p.quant) *p.quant = {j.q_out, j.scale};
    jobs_.push_back(std::move(j));
    return true;
}

bool PublishedFp8::take_expert_part(const std::string& module, int64_t rows, int64_t K, float* scale,
                                    RowJob& job) {
    const std::string name = module + kWeight;
    used_.insert(name);
    const TensorInfo* t = ck_.files.find(name);
    const std::vector<int64_t> shape{rows, K};
    if (!t) {
        problem("missing tensor " + name + " (expected F8_E4M3 " + shape_str(shape) +
                ": one expert's part of the fused experts tensor)");
        return false;
    }
    if (t->dtype != DType::F8_E4M3) {
        problem(t->file + ": tensor " + name + ": expected dtype F8_E4M3 (unfused experts are read in FP8 " +
                "only; a bf16 checkpoint keeps them fused), found " + dtype_name(t->dtype));
        return false;
    }
    if (!qc_.quantizes(module)) {
        problem(t->file + ": tensor " + name + ": stored F8_E4M3, but " + config_says(qc_, module, false) +
                " (expected the config to quantize it)");
        return false;
    }
    if (t->shape != shape) {
        problem(t->file + ": tensor " + name + ": expected shape " + shape_str(shape) + ", found " +
                shape_str(t->shape));
        return false;
    }
    if (!read_scales(module, rows, scale)) return false;
    set_aside_input_scale(module);
    job.parts.push_back(t->data);
    if (job.file.empty()) job.file = t->file;
    ck_.bound_bytes += t->nbytes;
    return true;
}

std::vector<std::string> PublishedFp8::finish() {
    std::vector<std::string> bad = run_row_jobs(jobs_);
    bool any = false;
    for (const LayerQuant& l : ck_.weights.quant)
        for (const QuantMatrix* m : matrices_of(l)) any = any || m->q;
    if (any)
        ck_.format = WeightFormat::kFp8;
    else
        ck_.weights.quant.clear();
    if (input_scales_)
        ck_.notes.push_back(std::to_string(input_scales_) +
                            " static activation scales (input_scale) set aside: the FP8 weights are used "
                            "weights-only, activations stay bf16/fp32");
    return bad;
}

std::vector<std::string> quantize_to_fp8(Checkpoint& ck) {
    ck.weights.quant.assign(static_cast<size_t>(ck.config.n_layers), LayerQuant{});
    std::vector<RowJob> jobs;
    for (const PlannedTensor& p : plan_bound_tensors(ck.config, ck.weights)) {
        if (!p.quant) continue;
        RowJob j;
        j.name = ck.config.weight_prefix + p.name;
        const TensorInfo* t = ck.files.find(j.name);
        j.file = t ? t->file : ck.dir.string();
        j.K = p.shape.back();
        j.rows = 1;
        for (size_t d = 0; d + 1 < p.shape.size(); ++d) j.rows *= p.shape[d];
        j.src = *p.slot;
        j.q_out = ck.owned.new_quant(j.rows * j.K);
        j.scale = ck.owned.new_scales(j.rows);
        j.out = ck.owned.new_bf16(j.rows * j.K);
        *p.quant = {j.q_out, j.scale};
        *p.slot = j.out;
        jobs.push_back(std::move(j));
    }
    ck.format = WeightFormat::kFp8;
    return run_row_jobs(jobs);
}

std::string fp8_companion_owner(const std::string& name) {
    for (const char* suffix : {kWeightScale, kInputScale})
        if (ends_with(name, suffix)) return name.substr(0, name.size() - std::strlen(suffix)) + kWeight;
    return "";
}

std::string weight_format_summary(const Checkpoint& ck) {
    if (ck.format == WeightFormat::kBf16 && ck.owned.dequantized.empty()) return "bf16";
    Weights w = ck.weights;
    std::vector<std::string> fp8, stored_fp8, kept;  // kinds, in plan order
    int n_fp8 = 0;
    auto add = [](std::vector<std::string>& v, const std::string& k) {
        if (std::find(v.begin(), v.end(), k) == v.end()) v.push_back(k);
    };
    for (const PlannedTensor& p : plan_bound_tensors(ck.config, w)) {
        if (p.role != TensorRole::Matrix) continue;
        std::string kind = p.name;
        if (kind.rfind("layers.", 0) == 0) kind = kind.substr(kind.find('.', 7) + 1);
        if (ends_with(kind, kWeight)) kind.resize(kind.size() - std::strlen(kWeight));
        if (p.quant && p.quant->q) {
            add(fp8, kind);
            ++n_fp8;
        } else {
            add(ck.owned.holds(*p.slot) ? stored_fp8 : kept, kind);
        }
    }
    auto join = [](const std::vector<std::string>& v) {
        std::string s;
        for (const std::string& k : v) s += (s.empty() ? "" : ", ") + k;
        return s;
    };
    std::string out = fp8.empty() ? "bf16"
                                  : "FP8 e4m3 with per-row scales: " + std::to_string(n_fp8) + " matrices (" +
                                        join(fp8) + ")";
    out += "; bf16: embeddings, norms" + (kept.empty() ? "" : ", " + join(kept));
    if (!stored_fp8.empty()) out += "; stored FP8, dequantised to bf16: " + join(stored_fp8);
    return out;
}

}  // namespace markbase
