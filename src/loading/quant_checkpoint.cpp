#include "loading/quant_checkpoint.h"

#include <algorithm>
#include <cstring>

#include "loading/quant_rows.h"
#include "model/int4.h"
#include "model/tensor_plan.h"

namespace markbase {

namespace {

constexpr const char* kWeight = ".weight";

bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string join(const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& k : v) s += (s.empty() ? "" : ", ") + k;
    return s;
}

void add_once(std::vector<std::string>& v, const std::string& k) {
    if (std::find(v.begin(), v.end(), k) == v.end()) v.push_back(k);
}

// "self_attn.q_proj" for "layers.3.self_attn.q_proj.weight".
std::string kind_of(const PlannedTensor& p) {
    std::string kind = p.name;
    if (kind.rfind("layers.", 0) == 0) kind = kind.substr(kind.find('.', 7) + 1);
    if (ends_with(kind, kWeight)) kind.resize(kind.size() - std::strlen(kWeight));
    return kind;
}

// The format the files store where the loader made bf16 of it (a checkpoint whose only quantised matrices
// have no quantised form keeps format kBf16).
const char* stored_format(const Checkpoint& ck) {
    if (ck.format != WeightFormat::kBf16) return ck.format == WeightFormat::kFp8 ? "FP8" : "int4";
    for (const auto& [name, t] : ck.files.tensors())
        if (ends_with(name, ".weight_packed")) return "int4";
    return "FP8";
}

}  // namespace

std::array<const QuantMatrix*, 9> quant_matrices(const LayerQuant& l) {
    return {&l.q_proj,  &l.k_proj,    &l.v_proj,          &l.o_proj,      &l.gate_proj,
            &l.up_proj, &l.down_proj, &l.experts_gate_up, &l.experts_down};
}

bool has_zero_points(const Weights& w) {
    for (const LayerQuant& l : w.quant)
        for (const QuantMatrix* m : quant_matrices(l))
            if (m->zero) return true;
    return false;
}

const char* weight_format_name(WeightFormat f) {
    return f == WeightFormat::kFp8 ? "fp8" : f == WeightFormat::kInt4 ? "int4" : "bf16";
}

std::vector<std::string> quantize_weights(Checkpoint& ck, WeightFormat f) {
    ck.weights.quant.assign(static_cast<size_t>(ck.config.n_layers), LayerQuant{});
    std::vector<RowJob> jobs;
    std::vector<std::string> kept;  // int4: kinds whose K is not a multiple of 64 (the GPU kernel's step)
    int64_t n_kept = 0;
    for (const PlannedTensor& p : plan_bound_tensors(ck.config, ck.weights)) {
        if (!p.quant) continue;
        RowJob j;
        j.format = f;
        j.K = p.shape.back();
        if (f == WeightFormat::kInt4 && j.K % 64 != 0) {
            add_once(kept, kind_of(p));
            ++n_kept;
            continue;
        }
        j.name = ck.config.weight_prefix + p.name;
        const TensorInfo* t = ck.files.find(j.name);
        j.file = t ? t->file : ck.dir.string();
        j.rows = 1;
        for (size_t d = 0; d + 1 < p.shape.size(); ++d) j.rows *= p.shape[d];
        j.src = *p.slot;
        j.q_out = ck.owned.new_quant(j.rows * quant_row_bytes(f, j.K));
        j.scale = ck.owned.new_scales(j.rows * quant_scales_per_row(f, j.K));
        j.out = ck.owned.new_bf16(j.rows * j.K);
        *p.quant = {j.q_out, j.scale, nullptr};
        *p.slot = j.out;
        jobs.push_back(std::move(j));
    }
    if (jobs.empty())
        ck.weights.quant.clear();
    else
        ck.format = f;
    if (n_kept)
        ck.notes.push_back("--quantize int4: " + std::to_string(n_kept) +
                           " matrices whose width is not a multiple of 64 stay bf16 (" + join(kept) + ")");
    return run_row_jobs(jobs);
}

std::string quant_companion_owner(const std::string& name) {
    for (const char* suffix : {".weight_scale", ".input_scale", ".weight_packed", ".weight_zero_point",
                               ".weight_shape", ".weight_g_idx"})
        if (ends_with(name, suffix)) return name.substr(0, name.size() - std::strlen(suffix)) + kWeight;
    return "";
}

std::string weight_format_summary(const Checkpoint& ck) {
    if (ck.format == WeightFormat::kBf16 && ck.owned.dequantized.empty()) return "bf16";
    Weights w = ck.weights;
    std::vector<std::string> quant, stored, kept;  // kinds, in plan order
    int n_quant = 0;
    bool zero_points = false;
    for (const PlannedTensor& p : plan_bound_tensors(ck.config, w)) {
        if (p.role != TensorRole::Matrix) continue;
        if (p.quant && p.quant->q) {
            add_once(quant, kind_of(p));
            ++n_quant;
            zero_points = zero_points || p.quant->zero;
        } else {
            add_once(ck.owned.holds(*p.slot) ? stored : kept, kind_of(p));
        }
    }
    std::string out = "bf16";
    if (ck.format == WeightFormat::kFp8) out = "FP8 e4m3 with per-row scales";
    if (ck.format == WeightFormat::kInt4)
        out = std::string("int4 with a scale ") + (zero_points ? "and a zero point " : "") +
              "per 128 weights" + (zero_points ? "" : " (symmetric)");
    if (!quant.empty()) out += ": " + std::to_string(n_quant) + " matrices (" + join(quant) + ")";
    out += "; bf16: embeddings, norms" + (kept.empty() ? "" : ", " + join(kept));
    if (!stored.empty())
        out += std::string("; stored ") + stored_format(ck) + ", dequantised to bf16: " + join(stored);
    return out;
}

}  // namespace markbase
