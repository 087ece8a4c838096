// markbase inspect -m DIR : variant, layer plan, parameter count and bytes per token.
#include <cstdio>
#include <string>

#include "cli/commands/args.h"
#include "cli/commands/commands.h"
#include "loading/checkpoint.h"
#include "parallel/partition.h"

namespace markbase::cli {

namespace {

std::string guess_variant(const ModelConfig& c) {
    if (c.moe) return c.hidden == 2816 && c.n_layers == 30 ? "26B-A4B" : "MoE (26B-A4B-like)";
    if (c.ple_dim) {
        if (c.hidden == 1536 && c.n_layers == 35) return "E2B";
        if (c.hidden == 2560 && c.n_layers == 42) return "E4B";
        return "PLE (E2B/E4B-like)";
    }
    if (c.hidden == 5376 && c.n_layers == 60) return "31B";
    return "dense (31B-like)";
}

}  // namespace

int cmd_inspect(const Args& args) {
    ArgReader a("inspect", args);
    std::string dir = a.required({"-m", "--model"}, "DIR");
    const int tp = a.integer({"-tp", "--tp", "--tensor-parallel-size"}, 1, 1, kMaxGpus);
    a.finish();
    auto ck = load_checkpoint(dir);
    const ModelConfig& c = ck->config;
    ModelCounts n = count_params(c);
    std::printf("model        %s\n", dir.c_str());
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
    std::printf("parameters   %.3f B total, %.3f B active per token\n", n.total_params / 1e9,
                n.active_params / 1e9);
    std::printf("bytes/token  %.3f GB (bf16 weights read per decoded token, KV cache excluded)\n",
                n.bytes_per_token / 1e9);
    std::printf("checkpoint   %zu file(s), %.3f GB bound, %zu tensor(s) skipped (vision/audio/unused KV)\n",
                ck->files.files().size(), ck->bound_bytes / 1e9, ck->skipped.size());
    if (tp > 1) {
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
                static_cast<long long>(p.vocab.begin), static_cast<long long>(p.vocab.end),
                p.weight_bytes / 1e9, p.bytes_per_token / 1e9, p.bytes_per_token / 4.16e12 * 1e3,
                p.allreduces_per_step, c.hidden);
        }
    }
    return 0;
}

}  // namespace markbase::cli
