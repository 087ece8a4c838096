#include "loading/saved_tensors.h"

#include <cstring>
#include <set>

#include "loading/quant_checkpoint.h"
#include "loading/quant_rows.h"
#include "model/fp8.h"
#include "model/int4.h"
#include "model/tensor_plan.h"

namespace markbase {

namespace {

constexpr const char* kWeight = ".weight";

bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string module_of(const std::string& weight) {
    return weight.substr(0, weight.size() - std::strlen(kWeight));
}

// "mlp.down_proj" for "model.layers.3.mlp.down_proj.weight", for notes.
std::string kind_of(const std::string& name) {
    std::string kind = ends_with(name, kWeight) ? module_of(name) : name;
    if (const size_t at = kind.find("layers."); at != std::string::npos)
        if (const size_t dot = kind.find('.', at + 7); dot != std::string::npos) kind = kind.substr(dot + 1);
    return kind;
}

void add_once(std::vector<std::string>& v, const std::string& s) {
    for (const std::string& x : v)
        if (x == s) return;
    v.push_back(s);
}

std::string join(const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& k : v) s += (s.empty() ? "" : ", ") + k;
    return s;
}

// compressed-tensors' weight_zero_point: [rows, G] zero points (0..15) packed eight to an int32 along the
// output dimension, row r of word [r / 8][g] at bits 4 (r % 8); the words' little-endian bytes.
std::vector<uint8_t> pack_zero_points(const uint8_t* zero, int64_t rows, int64_t G) {
    std::vector<uint8_t> bytes(static_cast<size_t>(4 * ((rows + 7) / 8) * G), 0);
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t g = 0; g < G; ++g) {
            const int64_t word = (r / 8) * G + g, nibble = r % 8;
            bytes[static_cast<size_t>(4 * word + nibble / 2)] |=
                static_cast<uint8_t>((zero[r * G + g] & 0xf) << (4 * (nibble % 2)));
        }
    }
    return bytes;
}

class Builder {
  public:
    explicit Builder(const Checkpoint& ck) : ck_(ck), format_(ck.format) {
        out_.symmetric = !has_zero_points(ck.weights);
        // tied to embed_tokens, never quantised (published checkpoints list it)
        out_.ignore.push_back("lm_head");
        // vLLM's fused MoE takes one scheme for an expert's gate, up and down projections, so where one of
        // the experts' matrices has no quantised form the file can hold (int4 at a width not in 128s, or
        // experts a source kept bf16), all of them are written bf16
        Weights w = ck.weights;
        for (const PlannedTensor& p : plan_bound_tensors(ck.config, w))
            if (p.shape.size() == 3 && !(p.quant && p.quant->q && keeps_form(p.shape.back())))
                experts_bf16_ = true;
    }
    void planned();
    void skipped();
    SavedTensors finish();

  private:
    void add(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data) {
        out_.tensors.push_back({name, dtype, std::move(shape), data});
    }
    template <class T>
    const void* own(const std::vector<T>& v) {
        out_.made.emplace_back(v.size() * sizeof(T));
        std::memcpy(out_.made.back().data(), v.data(), out_.made.back().size());
        return out_.made.back().data();
    }
    bool keeps_form(int64_t K) const { return format_ == WeightFormat::kFp8 || K % kInt4Group == 0; }
    void experts(const std::string& name, const std::vector<int64_t>& shape, const QuantMatrix& m);
    // Rows [r0, r0 + rows) of m as the module's tensors; m's bytes must outlive the save (`borrowed`), else
    // its scales are copied (its q is already in `made`).
    void module(const std::string& mod, const QuantMatrix& m, int64_t r0, int64_t rows, int64_t K,
                bool borrowed = true);
    void scales(const std::string& name, const float* s, int64_t rows, int64_t per_row, bool borrowed);
    bool quantise_unused(const TensorInfo& t);

    const Checkpoint& ck_;
    WeightFormat format_;
    bool experts_bf16_ = false;
    SavedTensors out_;
    std::vector<std::string> short_kinds_;
    int n_short_ = 0, n_experts_bf16_ = 0, input_scales_ = 0, requantised_ = 0;
};

void Builder::planned() {
    Weights w = ck_.weights;  // plan_bound_tensors points into it
    for (const PlannedTensor& p : plan_bound_tensors(ck_.config, w)) {
        const std::string name = ck_.config.weight_prefix + p.name;
        const int64_t K = p.shape.back();
        const bool quantised = p.quant && p.quant->q, fused = p.shape.size() == 3;
        if (quantised && fused && !experts_bf16_) {
            experts(name, p.shape, *p.quant);
            continue;
        }
        if (quantised && !fused && keeps_form(K)) {
            module(module_of(name), *p.quant, 0, p.shape[0], K);
            continue;
        }
        // the rest as bf16; a quantised matrix as its dequantised values, which its bf16 slot holds
        if (fused) {
            n_experts_bf16_ += quantised;
            add_once(out_.ignore, "re:.*\\.experts\\..*");  // matches vLLM's per-expert names too
        } else if (quantised) {
            add_once(short_kinds_, kind_of(name));
            ++n_short_;
        }
        add(name, DType::BF16, p.shape, *p.slot);
        if (p.role == TensorRole::Matrix && p.shape.size() == 2) add_once(out_.ignore, module_of(name));
    }
}

void Builder::experts(const std::string& name, const std::vector<int64_t>& shape, const QuantMatrix& m) {
    const bool gate_up = ends_with(name, "gate_up_proj");
    const std::string base =
        name.substr(0, name.size() - std::strlen(gate_up ? "gate_up_proj" : "down_proj"));
    const std::vector<std::string> parts =
        gate_up ? std::vector<std::string>{"gate_proj", "up_proj"} : std::vector<std::string>{"down_proj"};
    const int64_t E = shape[0], R = shape[1], K = shape[2];
    const int64_t part_rows = R / static_cast<int64_t>(parts.size());
    for (int64_t e = 0; e < E; ++e)
        for (size_t i = 0; i < parts.size(); ++i)
            module(base + std::to_string(e) + "." + parts[i], m, e * R + static_cast<int64_t>(i) * part_rows,
                   part_rows, K);
}

void Builder::module(const std::string& mod, const QuantMatrix& m, int64_t r0, int64_t rows, int64_t K,
                     bool borrowed) {
    if (format_ == WeightFormat::kFp8) {
        add(mod + ".weight", DType::F8_E4M3, {rows, K}, m.q + r0 * K);
        scales(mod + ".weight_scale", m.scale + r0, rows, 1, borrowed);
        return;
    }
    const int64_t G = K / kInt4Group;
    // the in-memory rows (two codes a byte, k even low) are weight_packed's int32 words' little-endian bytes
    add(mod + ".weight_packed", DType::I32, {rows, K / 8}, m.q + r0 * K / 2);
    scales(mod + ".weight_scale", m.scale + r0 * G, rows, G, borrowed);
    add(mod + ".weight_shape", DType::I64, {2}, own(std::vector<int64_t>{rows, K}));
    if (m.zero)
        add(mod + ".weight_zero_point", DType::I32, {(rows + 7) / 8, G},
            own(pack_zero_points(m.zero + r0 * G, rows, G)));
}

void Builder::scales(const std::string& name, const float* s, int64_t rows, int64_t per_row, bool borrowed) {
    const int64_t n = rows * per_row;
    bool bf16_values = true;
    for (int64_t i = 0; i < n && bf16_values; ++i) bf16_values = round_to_bf16(s[i]) == s[i];
    if (bf16_values) {
        std::vector<bf16> b(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) b[i] = float_to_bf16(s[i]);
        add(name, DType::BF16, {rows, per_row}, own(b));
    } else {
        add(name, DType::F32, {rows, per_row}, borrowed ? s : own(std::vector<float>(s, s + n)));
    }
}

// A bf16 K/V projection of a KV-shared layer, quantised as --quantize would quantise it. False where int4
// cannot hold its width (it stays bf16).
bool Builder::quantise_unused(const TensorInfo& t) {
    const int64_t rows = t.shape[0], K = t.shape[1];
    if (!keeps_form(K)) return false;
    std::vector<bf16> w(static_cast<size_t>(rows * K));  // copied: the mapping promises no alignment
    std::memcpy(w.data(), t.data, t.nbytes);
    const int64_t bytes = quant_row_bytes(format_, K), spr = quant_scales_per_row(format_, K);
    std::vector<uint8_t> q(static_cast<size_t>(rows * bytes)), zero(static_cast<size_t>(rows * spr));
    std::vector<float> scale(static_cast<size_t>(rows * spr));
    const bool zeros = format_ == WeightFormat::kInt4 && !out_.symmetric;
    for (int64_t r = 0; r < rows; ++r) {
        if (format_ == WeightFormat::kFp8)
            scale[r] = quantize_row_fp8(w.data() + r * K, K, q.data() + r * bytes);
        else
            quantize_row_int4(w.data() + r * K, K, q.data() + r * bytes, scale.data() + r * spr,
                              zeros ? zero.data() + r * spr : nullptr);
    }
    const QuantMatrix m{static_cast<const uint8_t*>(own(q)), scale.data(), zeros ? zero.data() : nullptr};
    module(module_of(t.name), m, 0, rows, K, false);
    ++requantised_;
    return true;
}

void Builder::skipped() {
    std::set<std::string> unused;
    for (const std::string& n : unused_tensor_names(ck_.config)) unused.insert(ck_.config.weight_prefix + n);
    for (const std::string& name : ck_.skipped) {
        const TensorInfo* t = ck_.files.find(name);
        if (!t) continue;
        if (ends_with(name, ".input_scale")) {
            ++input_scales_;
            continue;
        }
        const bool plain_matrix =
            (t->dtype == DType::BF16 || t->dtype == DType::F16 || t->dtype == DType::F32) &&
            t->shape.size() == 2 && ends_with(name, kWeight);
        if (plain_matrix && t->dtype == DType::BF16 && unused.count(name) && quantise_unused(*t)) continue;
        add(name, t->dtype, t->shape, t->data);
        if (plain_matrix) add_once(out_.ignore, module_of(name));
    }
}

SavedTensors Builder::finish() {
    if (n_short_)
        out_.notes.push_back(std::to_string(n_short_) +
                             " int4 matrices whose width is not a multiple of 128 written as bf16 of their "
                             "dequantised values, listed in ignore where they are Linear layers "
                             "(compressed-tensors holds whole groups of 128; they load back as the same "
                             "values, without an int4 form): " +
                             join(short_kinds_));
    if (n_experts_bf16_)
        out_.notes.push_back(
            "the MoE experts written as bf16 (" + std::to_string(n_experts_bf16_) +
            " fused matrices as their dequantised values) and ignored: one of the experts' matrices has no "
            "quantised form compressed-tensors can hold (int4 groups of 128 along widths of " +
            std::to_string(ck_.config.hidden) + " and " + std::to_string(ck_.config.expert_width) +
            "), and vLLM's fused MoE takes one scheme for an expert's gate, up and down projections");
    if (requantised_)
        out_.notes.push_back(std::to_string(requantised_) +
                             " K/V projections of KV-shared layers (unused by the model, present in the "
                             "source) written quantised as their layers' other projections");
    if (input_scales_)
        out_.notes.push_back(std::to_string(input_scales_) +
                             " static activation scales (input_scale) not written: the saved FP8 "
                             "scheme quantises activations dynamically (FP8_DYNAMIC)");
    return std::move(out_);
}

}  // namespace

SavedTensors saved_tensors(const Checkpoint& ck) {
    Builder b(ck);
    b.planned();
    b.skipped();
    return b.finish();
}

}  // namespace markbase
