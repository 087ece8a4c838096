#include "loading/checkpoint.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <sstream>

#include "loading/config_json.h"
#include "loading/published_quant.h"
#include "loading/quant_checkpoint.h"
#include "loading/regular_file.h"
#include "loading/weight_check.h"
#include "model/error.h"
#include "model/int4.h"
#include "model/tensor_plan.h"

namespace markbase {

namespace {

std::string shape_to_string(const std::vector<int64_t>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
}

bool is_other_modality(const std::string& name) {
    // towers of E2B-31B; the 12B's encoder-free embedders (embed_vision holds its patch embedder, and some
    // conversions name it vision_embedder); their projectors
    for (const char* p :
         {"model.vision_tower.", "model.audio_tower.", "model.embed_vision.", "model.embed_audio.",
          "model.vision_embedder.", "vision_tower.", "audio_tower.", "multi_modal_projector."}) {
        if (name.rfind(p, 0) == 0) return true;
    }
    return false;
}

// What a skipped tensor is, for `inspect`.
std::string skipped_kind(const std::string& name, const ModelConfig& c) {
    const auto starts = [&](const char* p) { return name.rfind(p, 0) == 0; };
    if (name == "lm_head.weight") return "lm_head (tied to embed_tokens)";
    if (name.size() > 12 && name.compare(name.size() - 12, 12, ".input_scale") == 0)
        return "static activation scales (input_scale: the FP8 weights are used weights-only)";
    if (starts("model.vision_tower.") || starts("vision_tower.")) return "vision tower";
    if (starts("model.audio_tower.") || starts("audio_tower.")) return "audio tower";
    if (starts("model.vision_embedder.")) return "encoder-free vision embedder";
    if (starts("model.embed_vision."))
        return c.unified ? "encoder-free vision embedder" : "vision projection";
    if (starts("model.embed_audio.")) return c.unified ? "encoder-free audio embedder" : "audio projection";
    if (starts("multi_modal_projector.")) return "multimodal projector";
    if (name.rfind(c.weight_prefix, 0) == 0) return "K/V of KV-shared layers (transformers ignores them too)";
    return "outside the text model";
}

// "<head> (N <noun>s):" and the first 12 lines of `lines`.
Error problem_list(const std::string& head, const std::vector<std::string>& lines, const char* noun) {
    std::ostringstream msg;
    msg << head << " (" << lines.size() << " " << noun << (lines.size() > 1 ? "s" : "") << "):";
    for (size_t i = 0; i < lines.size(); ++i) {
        if (i == 12) {
            msg << "\n  ... and " << (lines.size() - 12) << " more";
            break;
        }
        msg << "\n  " << lines[i];
    }
    return Error(msg.str());
}

// Binds one planned bf16 tensor, or lists why it cannot be.
void bind_bf16(Checkpoint& ck, const PlannedTensor& p, bool quantized, std::vector<std::string>& problems,
               std::vector<const TensorInfo*>& bound) {
    const std::string full = ck.config.weight_prefix + p.name;
    const TensorInfo* t = ck.files.find(full);
    if (!t) {
        problems.push_back("missing tensor " + full + " (expected BF16 " + shape_to_string(p.shape) + ")");
    } else if (t->dtype != DType::BF16) {
        problems.push_back(
            t->file + ": tensor " + full + ": expected dtype BF16, found " + dtype_name(t->dtype) +
            (t->dtype != DType::F8_E4M3 ? ""
             : quantized ? " (embeddings, norms, scalars and fused experts stay bf16 in FP8 checkpoints)"
                         : " (an FP8 checkpoint's config.json has a compressed-tensors "
                           "quantization_config)"));
    } else if (t->shape != p.shape) {
        problems.push_back(t->file + ": tensor " + full + ": expected shape " + shape_to_string(p.shape) +
                           ", found " + shape_to_string(t->shape));
    } else {
        *p.slot = reinterpret_cast<const bf16*>(t->data);
        ck.bound_bytes += t->nbytes;
        bound.push_back(t);
    }
}

// Anything else that claims to be part of the text stack means the config and the checkpoint disagree.
void check_the_rest(Checkpoint& ck, const std::set<std::string>& used, std::vector<std::string>& problems) {
    const std::string& prefix = ck.config.weight_prefix;
    std::set<std::string> unused;
    for (const std::string& n : unused_tensor_names(ck.config)) unused.insert(prefix + n);
    for (const auto& [name, info] : ck.files.tensors()) {
        if (used.count(name)) continue;
        // lm_head.weight is tied to embed_tokens (HF normally does not even save it); released E2B/E4B files
        // carry K/V tensors for KV-shared layers that transformers ignores too (quantised ones with their
        // scales and the rest).
        const std::string owner = quant_companion_owner(name);
        if (unused.count(name) || unused.count(owner) || name == "lm_head.weight" ||
            is_other_modality(name) || name.rfind(prefix, 0) != 0) {
            ck.skipped.push_back(name);
            continue;
        }
        problems.push_back(info.file + ": unexpected tensor " + name + " " + info.shape_str() +
                           " (config.json implies no such tensor: does the config match the weights?)");
    }
}

// --quantize where it applies; a checkpoint that is quantised already loads as published.
void quantize_at_load(Checkpoint& ck, const LoadOptions& options,
                      const std::optional<QuantizationConfig>& qc) {
    if (options.quantize == WeightFormat::kBf16) return;
    const std::string flag = std::string("--quantize ") + weight_format_name(options.quantize);
    if (qc) {
        ck.notes.push_back(flag + ": " + ck.dir.string() + " is an " +
                           (qc->format == WeightFormat::kFp8 ? "FP8" : "int4") +
                           " checkpoint already; its weights load as published");
        return;
    }
    if (const auto bad = quantize_weights(ck, options.quantize); !bad.empty())
        throw problem_list(ck.dir.string() + ": weights hold values that are not finite", bad, "tensor");
}

}  // namespace

std::unique_ptr<Checkpoint> load_checkpoint(const std::filesystem::path& dir, const LoadOptions& options) {
    auto ck = std::make_unique<Checkpoint>();
    ck->dir = dir;
    if (const std::string why = path_problem(dir, true); !why.empty())
        throw Error(dir.string() + ": not a model folder (it " + why + ")");
    ck->config = parse_config_file((dir / "config.json").string());
    const std::optional<QuantizationConfig> qc = read_quantization_config(dir / "config.json");
    ck->files = SafetensorsSet::open(dir);
    const ModelConfig& c = ck->config;

    // Bind every tensor the config implies; collect all problems so one load reports them all.
    std::vector<std::string> problems;
    std::set<std::string> used;
    std::vector<const TensorInfo*> bound;
    std::optional<PublishedQuant> published;
    if (qc) {
        // plan_tensors points into it
        ck->weights.quant.assign(static_cast<size_t>(c.n_layers), LayerQuant{});
        published.emplace(*ck, *qc, used, problems);
    }
    for (const PlannedTensor& p : plan_tensors(c, &ck->weights)) {
        used.insert(c.weight_prefix + p.name);
        if (!published || !published->bind(p)) bind_bf16(*ck, p, qc.has_value(), problems, bound);
    }
    check_the_rest(*ck, used, problems);
    if (!problems.empty())
        throw problem_list(dir.string() + ": checkpoint does not match config.json", problems, "problem");
    if (const auto bad = find_non_finite(bound, options.check_weights); !bad.empty())
        throw problem_list(dir.string() + ": weights hold values that are not finite", bad, "tensor");
    if (published) {
        if (const auto bad = published->finish(); !bad.empty())
            throw problem_list(dir.string() + ": weights hold values that are not finite", bad, "tensor");
    }
    quantize_at_load(*ck, options, qc);
    for (LayerWeights& l : ck->weights.layers) l.layer_scalar = bf16_to_float(l.layer_scalar_raw[0]);
    return ck;
}

std::vector<std::pair<std::string, size_t>> skipped_groups(const Checkpoint& ck) {
    std::vector<std::pair<std::string, size_t>> groups;
    for (const std::string& name : ck.skipped) {
        const std::string kind = skipped_kind(name, ck.config);
        auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == kind; });
        if (it == groups.end())
            groups.emplace_back(kind, 1);
        else
            ++it->second;
    }
    return groups;
}

uint8_t* OwnedWeights::new_quant(int64_t n) {
    quant.push_back(std::make_unique_for_overwrite<uint8_t[]>(static_cast<size_t>(n)));
    bytes += static_cast<uint64_t>(n);
    return quant.back().get();
}

float* OwnedWeights::new_scales(int64_t n) {
    scales.push_back(std::make_unique_for_overwrite<float[]>(static_cast<size_t>(n)));
    bytes += static_cast<uint64_t>(n) * sizeof(float);
    return scales.back().get();
}

bf16* OwnedWeights::new_bf16(int64_t n) {
    dequantized.push_back(std::make_unique_for_overwrite<bf16[]>(static_cast<size_t>(n)));
    const uint64_t b = static_cast<uint64_t>(n) * sizeof(bf16);
    bytes += b;
    // The CPU backend streams these every token, from here (its resident copy skips them): huge pages, as
    // for that copy (cpu/resident_weights.h). Random E2B at 4 layers, 2 threads, two bench runs each:
    // --quantize fp8 decoded at 34.4 ms/token without them (bf16 33.4), 33.3 with them (bf16 33.1). Advice
    // only, on the whole 2 MiB pages inside the allocation, before anything touches them.
    const uintptr_t huge = uintptr_t{2} << 20, at = reinterpret_cast<uintptr_t>(dequantized.back().get());
    const uintptr_t lo = (at + huge - 1) / huge * huge, hi = (at + b) / huge * huge;
    if (hi > lo) (void)::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
    return dequantized.back().get();
}

bool OwnedWeights::holds(const void* p) const {
    for (const auto& d : dequantized)
        if (d.get() == p) return true;
    return false;
}

bool decode_reads_quantized(const PlannedTensor& p, WeightFormat f) {
    if (!p.quant_eligible || f == WeightFormat::kBf16) return false;
    const int64_t K = p.shape.back();
    int64_t rows = p.shape[p.shape.size() - 2];
    // the experts' gate and up halves are read as two matrices of Ie rows each
    if (p.name.ends_with("experts.gate_up_proj")) rows /= 2;
    return K % 64 == 0 && rows % 16 == 0;  // gemv_quant.cu: tiles of 16 rows
}

double quantized_bytes_per_weight(const PlannedTensor& p, WeightFormat f, bool zero_points) {
    if (!decode_reads_quantized(p, f)) return 0;
    const double K = static_cast<double>(p.shape.back());
    if (f == WeightFormat::kFp8) return 1.0 + 4.0 / K;  // a float a row
    // a float (and a byte) a group, the last one possibly short
    return 0.5 + (4.0 + (zero_points ? 1.0 : 0.0)) * static_cast<double>(int4_groups(p.shape.back())) / K;
}

ModelCounts count_params(const ModelConfig& c, WeightFormat f, bool zero_points) {
    ModelCounts m;
    for (const PlannedTensor& p : plan_tensors(c, nullptr)) {
        double n = 1;
        for (int64_t d : p.shape) n *= static_cast<double>(d);
        m.total_params += n;
        if (p.name == "embed_tokens_per_layer.weight") continue;  // PLE rows are lookups, not reads
        if (p.name.find("experts.") != std::string::npos) n *= static_cast<double>(c.top_k) / c.n_experts;
        m.active_params += n;  // the tied lm_head (embed_tokens) is read in full every token
        const double q = quantized_bytes_per_weight(p, f, zero_points);
        m.bytes_per_token += n * (q > 0 ? q : 2.0);
    }
    return m;
}

StepBytes batched_step_bytes(const ModelConfig& c, int seqs, int64_t keys, int kv_elem_bytes,
                             double expert_weight_bytes) {
    StepBytes b;
    if (c.n_experts > 0)
        b.experts_touched = c.n_experts * (1.0 - std::pow(1.0 - static_cast<double>(c.top_k) / c.n_experts,
                                                          std::max(seqs, 0)));
    for (const PlannedTensor& p : plan_tensors(c, nullptr)) {
        if (p.name == "embed_tokens_per_layer.weight") continue;
        double n = 1;
        for (int64_t d : p.shape) n *= static_cast<double>(d);
        const bool expert = p.name.find("experts.") != std::string::npos;
        if (expert) n *= b.experts_touched / c.n_experts;
        b.weights += (expert ? expert_weight_bytes : 2.0) * n;
    }
    for (const LayerSpec& s : c.layers) {
        const int64_t k = s.kind == AttentionKind::Sliding ? std::min<int64_t>(keys, c.sliding_window) : keys;
        b.kv += 2.0 * seqs * static_cast<double>(k) * s.n_kv_heads * s.head_dim * kv_elem_bytes;
    }
    return b;
}

}  // namespace markbase
