// markbase inspect (-m DIR | --synthetic VARIANT [--layers N]) [-tp N]: variant, layer plan, parameter count,
// bytes per token, the tensors a checkpoint carries that the text model skips, and a tensor-parallel split.
#include <cstdio>
#include <optional>
#include <string>

#include "cli/commands/args.h"
#include "cli/commands/commands.h"
#include "cli/commands/model_options.h"
#include "loading/checkpoint.h"
#include "loading/config_json.h"
#include "loading/quant_checkpoint.h"
#include "model/error.h"
#include "model/variants.h"
#include "parallel/partition.h"

namespace markbase::cli {

namespace {

std::string guess_variant(const ModelConfig& c) {
    if (c.unified) return c.hidden == 3840 && c.n_layers == 48 ? "12B (Unified)" : "Unified (12B-like)";
    if (c.moe) return c.hidden == 2816 && c.n_layers == 30 ? "26B-A4B" : "MoE (26B-A4B-like)";
    if (c.ple_dim) {
        if (c.hidden == 1536 && c.n_layers == 35) return "E2B";
        if (c.hidden == 2560 && c.n_layers == 42) return "E4B";
        return "PLE (E2B/E4B-like)";
    }
    if (c.hidden == 5376 && c.n_layers == 60) return "31B";
    if (c.hidden == 3840 && c.n_layers == 48) return "12B (text layout)";
    if (c.hidden == 2816 && c.n_layers == 30) return "26B-Standard (dense baseline of the 26B-A4B)";
    return "dense (31B-like)";
}

void print_model(const ModelConfig& c) {
    std::printf("architecture %s (weights under '%s')\n", c.architecture.c_str(), c.weight_prefix.c_str());
    std::printf("variant      %s\n", guess_variant(c).c_str());
    std::printf("hidden %d, layers %d, heads %d, vocab %lld, sliding window %d, max positions %lld\n",
                c.hidden, c.n_layers, c.n_heads, static_cast<long long>(c.vocab_size), c.sliding_window,
                static_cast<long long>(c.max_positions));
    if (c.ple_dim) std::printf("per-layer embeddings: %d per layer\n", c.ple_dim);
    if (c.moe)
        std::printf("MoE: %d experts, top %d, expert width %d (beside a dense MLP)\n", c.n_experts, c.top_k,
                    c.expert_width);
    if (c.n_kv_shared)
        std::printf("KV sharing: layers %d-%d reuse earlier caches\n", c.first_shared_layer(),
                    c.n_layers - 1);
    std::printf("final logit softcap %.1f, embedding scale %.4g\n", c.final_softcap, c.embed_scale());
    std::printf("layer plan:\n");
    for (int i = 0; i < c.n_layers; ++i) {
        const LayerSpec& s = c.layers[i];
        std::printf("  %2d %-7s d=%-3d kv_heads=%-2d mlp=%-5d%s%s\n", i,
                    s.kind == AttentionKind::Full ? "full" : "sliding", s.head_dim, s.n_kv_heads, s.mlp_width,
                    s.k_eq_v ? " k_eq_v" : "",
                    s.has_own_kv() ? "" : (" kv<-" + std::to_string(s.kv_source)).c_str());
    }
    const ModelCounts n = count_params(c);
    std::printf("parameters   %.3f B total, %.3f B active per token\n", n.total_params / 1e9,
                n.active_params / 1e9);
    std::printf(
        "bytes/token  %.3f GB (bf16 weights read per decoded token, KV cache excluded; %.2f ms at "
        "4.16 TB/s)\n",
        n.bytes_per_token / 1e9, n.bytes_per_token / 4.16e12 * 1e3);
}

void print_checkpoint(const Checkpoint& ck) {
    std::printf("checkpoint   %zu file(s), %.3f GB bound, %zu tensor(s) skipped\n", ck.files.files().size(),
                ck.bound_bytes / 1e9, ck.skipped.size());
    for (const auto& [kind, count] : skipped_groups(ck))
        std::printf("  skipped    %zu tensor(s): %s\n", count, kind.c_str());
    std::printf("weights      %s\n", weight_format_summary(ck).c_str());
    if (ck.format != WeightFormat::kBf16) {
        const double b = count_params(ck.config, ck.format, has_zero_points(ck.weights)).bytes_per_token;
        std::printf(
            "bytes/token  %.3f GB as the GPU's decode step reads them (%s projections; %.2f ms at 4.16 "
            "TB/s)\n",
            b / 1e9, ck.format == WeightFormat::kFp8 ? "FP8" : "int4", b / 4.16e12 * 1e3);
#ifdef MARKBASE_HAS_CUDA
        // what --bf16-copy decides between (a MoE's experts' copy is never kept where every path reads rows)
        const Tuning t;
        const uint64_t keep = gpu_weight_bytes(ck, cuda::copy_drop(ck.config, ck.format, t, Bf16Copy::kKeep));
        const uint64_t drop = gpu_weight_bytes(ck, cuda::copy_drop(ck.config, ck.format, t, Bf16Copy::kDrop));
        std::printf(
            "gpu weights  %.3f GB with the projections' bf16 copy (the fastest prompts and batched steps), "
            "%.3f "
            "GB without it (--bf16-copy drop; auto drops it only where the model would not fit)\n",
            keep / 1e9, drop / 1e9);
#endif
    }
    for (const std::string& n : ck.notes) std::printf("note         %s\n", n.c_str());
}

void print_split(const ModelConfig& c, int tp) {
    // the split issue 7 uses: heads and MLP rows by tensor parallelism, experts by expert parallelism
    std::printf(
        "split over %d GPUs (tensor parallel attention/MLP, expert parallel MoE, vocab-split lm_head):\n",
        tp);
    for (int r = 0; r < tp; ++r) {
        const PartitionPlan p = plan_partition(c, tp, r);
        const LayerShard& l0 = p.layers.front();
        const LayerShard& lf = p.layers.back();
        std::printf(
            "  rank %d: q heads [%lld,%lld) kv [%lld,%lld)%s/full [%lld,%lld)%s, mlp rows [%lld,%lld)", r,
            static_cast<long long>(l0.q_heads.begin), static_cast<long long>(l0.q_heads.end),
            static_cast<long long>(l0.kv_heads.begin), static_cast<long long>(l0.kv_heads.end),
            l0.kv_replicated ? " (replicated)" : "", static_cast<long long>(lf.kv_heads.begin),
            static_cast<long long>(lf.kv_heads.end), lf.kv_replicated ? " (replicated)" : "",
            static_cast<long long>(l0.mlp_rows.begin), static_cast<long long>(l0.mlp_rows.end));
        if (c.moe)
            std::printf(", experts [%lld,%lld)", static_cast<long long>(l0.experts.begin),
                        static_cast<long long>(l0.experts.end));
        std::printf(
            ", vocab [%lld,%lld)\n          holds %.2f GB, streams %.3f GB/token (%.2f ms at 4.16 TB/s), "
            "%d all-reduces of %d floats per step\n",
            static_cast<long long>(p.vocab.begin), static_cast<long long>(p.vocab.end), p.weight_bytes / 1e9,
            p.bytes_per_token / 1e9, p.bytes_per_token / 4.16e12 * 1e3, p.allreduces_per_step, c.hidden);
    }
}

}  // namespace

int cmd_inspect(const Args& args) {
    ArgReader a("inspect", args);
    const auto synthetic = a.value({"--synthetic"});
    const int layers = a.integer({"--layers"}, 0, 0, 1024);
    const std::optional<std::string> dir = a.value({"-m", "--model"});
    const int tp = a.integer({"-tp", "--tp", "--tensor-parallel-size"}, 1, 1, kMaxGpus);
    a.finish();
    if (synthetic && dir) throw Error("inspect: give either -m DIR or --synthetic VARIANT, not both");
    if (!synthetic && layers) throw Error("inspect: --layers applies to --synthetic only");
    if (synthetic) {
        // the preset's config alone, as `bench --synthetic` and make_random_ckpt.py build it
        const ModelConfig c =
            parse_config_text(variant_config(*synthetic, layers).dump(), "synthetic " + *synthetic);
        std::printf("model        synthetic %s%s (random weights at real widths)\n", synthetic->c_str(),
                    layers ? (", " + std::to_string(layers) + " layers").c_str() : "");
        print_model(c);
        if (tp > 1) print_split(c, tp);
        return 0;
    }
    const std::string model_dir = dir ? *dir : default_model_dir();  // the bundled model without -m
    auto ck = load_checkpoint(model_dir);
    std::printf("model        %s\n", model_dir.c_str());
    print_model(ck->config);
    print_checkpoint(*ck);
    if (tp > 1) print_split(ck->config, tp);
    return 0;
}

}  // namespace markbase::cli
