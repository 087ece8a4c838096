// How one Gemma 4 model is split over the GPUs of a host (issue 7): tensor parallelism for attention and the
// dense MLPs, expert parallelism for the 26B-A4B's experts, the tied lm_head split by vocabulary rows.
// This is the arithmetic only — which rank owns which heads, rows and experts, what is replicated, which
// collectives a decode step needs and what each rank streams per token — shared by the CUDA backend's sharded
// loading and by `markbase inspect --tp N`. World size 1 is the same code path with one rank owning
// everything.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace markbase {

struct Slice {
    int64_t begin = 0, end = 0;  // [begin, end)
    int64_t size() const { return end - begin; }
    bool operator==(const Slice&) const = default;
};

// Splits [0, n) into `parts` contiguous slices whose sizes differ by at most one; part `i`'s slice.
Slice even_slice(int64_t n, int parts, int i);

struct LayerShard {
    Slice q_heads;               // query heads (and their rows of q_proj, columns of o_proj)
    Slice kv_heads;              // KV heads this rank stores and projects
    bool kv_replicated = false;  // fewer KV heads than ranks: each rank holds the one its query heads read
    Slice mlp_rows;              // dense MLP: rows of gate/up, columns of down
    Slice experts;               // MoE: experts this rank owns (empty when the model has none)
};

struct PartitionPlan {
    int world = 1, rank = 0;
    std::vector<LayerShard> layers;  // [L]
    Slice vocab;                     // lm_head / embedding rows this rank scores
    // Collectives in one decode step: sums of H floats for the embedding row, after o_proj, after the FFN
    // (dense + experts in one) and after PLE's projection where present; then one gather of the per-rank (max
    // logit, id) for greedy sampling.
    int allreduces_per_step = 0;
    int64_t allreduce_bytes_per_step = 0;
    double weight_bytes = 0;     // bf16 weights this rank holds
    double bytes_per_token = 0;  // bf16 weights this rank streams per decoded token
};

// Throws markbase::Error naming the field and the world size when the model cannot be split that way
// (e.g. query heads not divisible by the world size).
PartitionPlan plan_partition(const ModelConfig& c, int world, int rank);

// The widths rank plan.rank computes with: its query heads, its KV heads per layer, its dense-MLP rows and
// its vocabulary rows; everything else (hidden size, head dims, the expert count the router scores over, PLE)
// unchanged. A backend runs this config on the rank's shard_weights and adds the collectives. World 1: c.
ModelConfig rank_config(const ModelConfig& c, const PartitionPlan& plan);

}  // namespace markbase
