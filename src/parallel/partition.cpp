#include "parallel/partition.h"

#include <algorithm>

#include "model/error.h"
#include "model/tensor_plan.h"

namespace markbase {

Slice even_slice(int64_t n, int parts, int i) {
    const int64_t base = n / parts, extra = n % parts;
    const int64_t begin = i * base + std::min<int64_t>(i, extra);
    return {begin, begin + base + (i < extra ? 1 : 0)};
}

namespace {

double product(const std::vector<int64_t>& shape) {
    double n = 1;
    for (int64_t d : shape) n *= static_cast<double>(d);
    return n;
}

// Layer i's share on this rank; q: the rank's query heads (the same in every layer).
LayerShard shard_layer(const ModelConfig& c, int i, const Slice& q, int world, int rank) {
    const LayerSpec& s = c.layers[i];
    LayerShard l;
    l.q_heads = q;
    if (s.n_kv_heads % world == 0) {
        l.kv_heads = even_slice(s.n_kv_heads, world, rank);
    } else if (world % s.n_kv_heads == 0) {
        // GQA with fewer KV heads than ranks (26B full layers: 2; E2B: 1): every rank's query heads read
        // one KV head, which that rank projects and caches itself (the KV weights are replicated
        // world/nKV times).
        const int group = c.n_heads / s.n_kv_heads;
        const int64_t g = q.begin / group;
        if ((q.end - 1) / group != g)
            throw Error("layer " + std::to_string(i) + ": the query heads of rank " + std::to_string(rank) +
                        " span two KV heads; use a tensor parallel size that divides num_attention_heads / "
                        "num_key_value_heads");
        l.kv_heads = {g, g + 1};
        l.kv_replicated = true;
    } else {
        throw Error("layer " + std::to_string(i) + ": " + std::to_string(s.n_kv_heads) +
                    " KV heads cannot be split over " + std::to_string(world) +
                    " ranks (neither divides the other)");
    }
    // MLP rows in groups of 8 (when the width allows) so each rank's down_proj columns, the K of its
    // GEMV, stay a multiple of 8 values: 16-byte rows for the vector loads
    if (s.mlp_width % 8 == 0) {
        const Slice g = even_slice(s.mlp_width / 8, world, rank);
        l.mlp_rows = {g.begin * 8, g.end * 8};
    } else {
        l.mlp_rows = even_slice(s.mlp_width, world, rank);
    }
    if (c.moe) l.experts = even_slice(c.n_experts, world, rank);
    return l;
}

// The fraction of tensor `name` this rank holds: split tensors their share, the rest (norms, router, PLE) 1.
double tensor_share(const std::string& name, const ModelConfig& c, const PartitionPlan& p) {
    const size_t dot = name.find('.', 7);  // "layers.<i>."
    const bool layered = name.rfind("layers.", 0) == 0;
    const int li = layered ? std::stoi(name.substr(7, dot - 7)) : -1;
    const LayerShard* l = layered ? &p.layers[li] : nullptr;
    const LayerSpec* s = layered ? &c.layers[li] : nullptr;
    if (name == "embed_tokens.weight") return static_cast<double>(p.vocab.size()) / c.vocab_size;
    if (l && (name.find("q_proj") != std::string::npos || name.find("o_proj") != std::string::npos))
        return static_cast<double>(l->q_heads.size()) / c.n_heads;
    if (l && (name.find("k_proj") != std::string::npos || name.find("v_proj") != std::string::npos))
        return static_cast<double>(l->kv_heads.size()) / s->n_kv_heads;
    if (l && name.find(".mlp.") != std::string::npos)
        return static_cast<double>(l->mlp_rows.size()) / s->mlp_width;
    if (l && name.find("experts.") != std::string::npos)
        return static_cast<double>(l->experts.size()) / c.n_experts;
    return 1.0;
}

// What this rank holds and streams.
void count_rank_bytes(const ModelConfig& c, PartitionPlan& p) {
    for (const PlannedTensor& t : plan_tensors(c, nullptr)) {
        const double n = product(t.shape), share = tensor_share(t.name, c, p);
        p.weight_bytes += 2 * n * share;
        if (t.name == "embed_tokens_per_layer.weight") continue;  // PLE rows are lookups, not streamed
        // each rank streams its share of the top-k experts on average (routing spreads them over the ranks)
        const double active =
            t.name.find("experts.") != std::string::npos ? static_cast<double>(c.top_k) / c.n_experts : 1.0;
        p.bytes_per_token += 2 * n * share * active;
    }
}

}  // namespace

PartitionPlan plan_partition(const ModelConfig& c, int world, int rank) {
    if (world < 1) throw Error("tensor parallel size must be >= 1, found " + std::to_string(world));
    if (rank < 0 || rank >= world)
        throw Error("rank " + std::to_string(rank) + " is outside the world of " + std::to_string(world));
    if (c.n_heads % world)
        throw Error("num_attention_heads (" + std::to_string(c.n_heads) +
                    ") is not divisible by the tensor parallel size " + std::to_string(world));
    PartitionPlan p;
    p.world = world;
    p.rank = rank;
    const Slice q = even_slice(c.n_heads, world, rank);
    p.layers.resize(c.n_layers);
    for (int i = 0; i < c.n_layers; ++i) p.layers[i] = shard_layer(c, i, q, world, rank);
    p.vocab = even_slice(c.vocab_size, world, rank);
    count_rank_bytes(c, p);
    // per layer: after o_proj and after the FFN (the MoE's dense partial and its experts' weighted sum travel
    // together, 2H floats, because the combine norms each before adding); PLE's small tensors are whole on
    // every rank, so its projection needs none. Once more for the embedding row, which only the rank owning
    // that vocabulary slice can look up (the others contribute zeros).
    p.allreduces_per_step = world > 1 ? 2 * c.n_layers + 1 : 0;
    p.allreduce_bytes_per_step =
        world > 1 ? (int64_t{2 * c.n_layers + 1} + (c.moe ? c.n_layers : 0)) * c.hidden * 4 : 0;
    return p;
}

ModelConfig rank_config(const ModelConfig& c, const PartitionPlan& plan) {
    if (static_cast<int>(plan.layers.size()) != c.n_layers)
        throw Error("internal: a partition plan of " + std::to_string(plan.layers.size()) + " layers for a " +
                    std::to_string(c.n_layers) + "-layer model");
    ModelConfig r = c;
    if (plan.world == 1) return r;
    r.n_heads = static_cast<int>(plan.layers.empty() ? c.n_heads : plan.layers[0].q_heads.size());
    for (int i = 0; i < c.n_layers; ++i) {
        r.layers[i].n_kv_heads = static_cast<int>(plan.layers[i].kv_heads.size());
        r.layers[i].mlp_width = static_cast<int>(plan.layers[i].mlp_rows.size());
    }
    r.vocab_size = plan.vocab.size();
    return r;
}

}  // namespace markbase
