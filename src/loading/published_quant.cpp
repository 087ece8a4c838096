#include "loading/published_quant.h"

#include <cmath>
#include <cstring>
#include <sstream>

#include "loading/quant_checkpoint.h"
#include "model/int4.h"

namespace markbase {

namespace {

constexpr const char* kWeight = ".weight";

bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string number_str(float v) {
    std::ostringstream o;
    o << v;
    return o.str();
}

// IEEE half to float, subnormals included (every half is a float exactly).
float half_to_float(uint16_t h) {
    const int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    const float mag = exp == 0    ? std::ldexp(static_cast<float>(man), -24)
                      : exp == 31 ? (man ? NAN : INFINITY)
                                  : std::ldexp(static_cast<float>(man + 1024), exp - 25);
    return sign ? -mag : mag;
}

}  // namespace

std::string shape_text(const std::vector<int64_t>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
}

float scale_at(const TensorInfo& t, int64_t i) {
    if (t.dtype == DType::BF16 || t.dtype == DType::F16) {
        uint16_t v;
        std::memcpy(&v, t.data + i * 2, sizeof v);
        return t.dtype == DType::BF16 ? bf16_to_float(v) : half_to_float(v);
    }
    float v;
    std::memcpy(&v, t.data + i * 4, sizeof v);
    return v;
}

std::string scale_problem(const TensorInfo& s, int64_t n, int64_t cols) {
    int64_t bad = 0, first = 0;
    for (int64_t i = 0; i < n; ++i) {
        const float v = scale_at(s, i);
        if (std::isfinite(v) && v > 0) continue;
        if (bad++ == 0) first = i;
    }
    if (!bad) return "";
    std::string where;
    if (cols == 1) where = "first at row " + std::to_string(first) + ": ";
    if (cols > 1)
        where =
            "first at row " + std::to_string(first / cols) + ", group " + std::to_string(first % cols) + ": ";
    return s.file + ": tensor " + s.name + ": " + std::to_string(bad) + " of " + std::to_string(n) +
           " scales are not finite numbers > 0 (" + where + number_str(scale_at(s, first)) + ")";
}

PublishedQuant::PublishedQuant(Checkpoint& ck, const QuantizationConfig& qc, std::set<std::string>& used,
                               std::vector<std::string>& problems)
    : ck_(ck), qc_(qc), used_(used), problems_(problems) {}

std::string PublishedQuant::config_says(const std::string& module, bool quantized) const {
    if (quantized) return "config.json's quantization_config quantizes " + module;
    if (qc_.ignores(module)) return "config.json's quantization_config ignores " + module;
    return "no target of config.json's quantization_config names " + module;
}

bool PublishedQuant::keeps_form(int64_t K) const {
    return qc_.format == WeightFormat::kFp8 || K % kInt4Group == 0;
}

std::string PublishedQuant::stored_name(const std::string& module) const {
    return module + (qc_.format == WeightFormat::kFp8 ? ".weight" : ".weight_packed");
}

const TensorInfo* PublishedQuant::stored_weight(const std::string& module) const {
    const TensorInfo* t = ck_.files.find(stored_name(module));
    // FP8's name is also bf16's: the dtype says which it is
    return t && (qc_.format != WeightFormat::kFp8 || t->dtype == DType::F8_E4M3) ? t : nullptr;
}

std::string PublishedQuant::stored_what(int64_t rows, int64_t K) const {
    if (qc_.format == WeightFormat::kFp8) return "F8_E4M3 " + shape_text({rows, K});
    return "I32 " + shape_text({rows, (K + 7) / 8}) + ", eight int4 weights a word";
}

std::string PublishedQuant::companions() const {
    if (qc_.format == WeightFormat::kFp8) return "its weight_scale";
    return qc_.symmetric ? "its weight_scale and weight_shape"
                         : "its weight_scale, weight_zero_point and weight_shape";
}

bool PublishedQuant::read_module(const std::string& module, const TensorInfo& t, int64_t rows, int64_t K,
                                 int64_t r0, RowJob& job) {
    return qc_.format == WeightFormat::kFp8 ? read_fp8_module(module, t, rows, K, r0, job)
                                            : read_int4_module(module, t, rows, K, r0, job);
}

bool PublishedQuant::bind(const PlannedTensor& p) {
    if (p.role != TensorRole::Matrix) return false;
    if (p.shape.size() == 3) return bind_experts(p);
    const std::string full = ck_.config.weight_prefix + p.name;
    const std::string module = full.substr(0, full.size() - std::strlen(kWeight));
    const bool want = qc_.quantizes(module);
    const TensorInfo* stored = stored_weight(module);
    if (want && stored) return bind_matrix(p, *stored, module);
    if (!want && !stored) return false;  // bf16: the ordinary binding checks it (or reports it missing)
    const bool fp8 = qc_.format == WeightFormat::kFp8;
    if (stored) {
        used_.insert(stored->name);
        problem(stored->file + ": tensor " + stored->name + ": expected " +
                (fp8 ? "dtype BF16" : "BF16 " + full + " in its place") + " (" + config_says(module, false) +
                "), found " + dtype_name(stored->dtype) + (fp8 ? "" : " packed int4 weights"));
        return true;
    }
    if (const TensorInfo* plain = ck_.files.find(full))
        problem(plain->file + ": tensor " + full + ": expected " +
                (fp8 ? "dtype F8_E4M3" : "int4 " + stored_name(module) + " in its place") + " (" +
                config_says(module, true) + "), found " + dtype_name(plain->dtype));
    else
        problem("missing tensor " + stored_name(module) + " (expected " +
                stored_what(p.shape[0], p.shape[1]) + " with " + companions() + ": " +
                config_says(module, true) + ")");
    return true;
}

RowJob PublishedQuant::new_job(const std::string& name, int64_t rows, int64_t K) {
    RowJob j;
    j.format = qc_.format;
    j.name = name;
    j.rows = rows;
    j.K = K;
    j.scale = ck_.owned.new_scales(rows * quant_scales_per_row(j.format, K));
    if (j.format == WeightFormat::kInt4 && !qc_.symmetric)
        j.zero = ck_.owned.new_quant(rows * int4_groups(K));
    return j;
}

bool PublishedQuant::bind_matrix(const PlannedTensor& p, const TensorInfo& t, const std::string& module) {
    used_.insert(t.name);
    const int64_t rows = p.shape[0], K = p.shape[1];
    RowJob j = new_job(t.name, rows, K);
    j.file = t.file;
    j.part_rows = rows;
    if (!read_module(module, t, rows, K, 0, j)) return true;
    j.out = ck_.owned.new_bf16(rows * K);
    *p.slot = j.out;
    if (p.quant && keeps_form(K)) *p.quant = {t.data, j.scale, j.zero};
    jobs_.push_back(std::move(j));
    return true;
}

bool PublishedQuant::bind_experts(const PlannedTensor& p) {
    const std::string full = ck_.config.weight_prefix + p.name;
    if (ck_.files.find(full)) return false;  // kept fused: the bf16 binding checks it
    const bool gate_up = ends_with(p.name, "gate_up_proj");
    const std::string base =
        full.substr(0, full.size() - std::strlen(gate_up ? "gate_up_proj" : "down_proj"));
    const std::vector<std::string> parts =
        gate_up ? std::vector<std::string>{"gate_proj", "up_proj"} : std::vector<std::string>{"down_proj"};
    const int64_t E = p.shape[0], rows = p.shape[1], K = p.shape[2];
    const int64_t part_rows = rows / static_cast<int64_t>(parts.size());
    const std::string suffix = stored_name("");
    if (!ck_.files.find(base + "0." + parts[0] + suffix)) {
        problem("missing tensor " + full + " (expected BF16 " + shape_text(p.shape) +
                ", or llm-compressor's per-expert " +
                (qc_.format == WeightFormat::kFp8 ? "F8_E4M3" : "int4") + " tensors " + base + "{0.." +
                std::to_string(E - 1) + "}." + (gate_up ? "{gate_proj,up_proj}" : "down_proj") + suffix +
                ")");
        return true;
    }
    RowJob j = new_job(full, E * rows, K);
    j.part_rows = part_rows;
    bool ok = true;
    for (int64_t e = 0; e < E; ++e)
        for (size_t i = 0; i < parts.size(); ++i)
            ok = take_expert_part(base + std::to_string(e) + "." + parts[i], part_rows, K,
                                  e * rows + static_cast<int64_t>(i) * part_rows, j) &&
                 ok;
    if (!ok) return true;
    if (keeps_form(K)) j.q_out = ck_.owned.new_quant(E * rows * quant_row_bytes(j.format, K));
    j.out = ck_.owned.new_bf16(E * rows * K);
    *p.slot = j.out;
    if (p.quant && j.q_out) *p.quant = {j.q_out, j.scale, j.zero};
    jobs_.push_back(std::move(j));
    return true;
}

bool PublishedQuant::take_expert_part(const std::string& module, int64_t rows, int64_t K, int64_t r0,
                                      RowJob& job) {
    const std::string name = stored_name(module);
    used_.insert(name);
    const TensorInfo* t = ck_.files.find(name);
    if (!t) {
        problem("missing tensor " + name + " (expected " + stored_what(rows, K) +
                ": one expert's part of the fused experts tensor)");
        return false;
    }
    if (!qc_.quantizes(module)) {
        problem(t->file + ": tensor " + name + ": stored " + dtype_name(t->dtype) + ", but " +
                config_says(module, false) + " (expected the config to quantize it)");
        return false;
    }
    if (!read_module(module, *t, rows, K, r0, job)) return false;
    if (job.file.empty()) job.file = t->file;
    return true;
}

std::vector<std::string> PublishedQuant::finish() {
    std::vector<std::string> bad = run_row_jobs(jobs_);
    bool any = false;
    for (const LayerQuant& l : ck_.weights.quant)
        for (const QuantMatrix* m : quant_matrices(l)) any = any || m->q;
    if (any)
        ck_.format = qc_.format;
    else
        ck_.weights.quant.clear();
    if (input_scales_)
        ck_.notes.push_back(std::to_string(input_scales_) +
                            " static activation scales (input_scale) set aside: the FP8 weights are used "
                            "weights-only, activations stay bf16/fp32");
    return bad;
}

}  // namespace markbase
