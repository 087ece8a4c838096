// One rank's weights under a PartitionPlan (issue 7): exactly what a sharded loader puts on that rank's GPU.
// Query heads take their rows of q_proj and their columns of o_proj; KV heads their rows of k/v_proj (a KV
// head shared by several ranks' query heads is copied to each); the dense MLP its rows of gate/up and columns
// of down; the MoE its experts; the tied embedding its vocabulary rows; norms, router and per-layer-input
// tensors are whole on every rank. World size 1 returns the checkpoint's tensors unchanged.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loading/checkpoint.h"
#include "model/bf16.h"
#include "model/tensor_plan.h"
#include "parallel/partition.h"

namespace markbase {

enum class ShardSplit { Whole, Rows, Columns, Experts };

struct ShardTensor {
    std::string name;  // without the weight prefix, as in the tensor plan
    ShardSplit split = ShardSplit::Whole;
    Slice range;                 // rows, columns or experts of the full tensor this rank holds
    std::vector<int64_t> shape;  // of the shard
    std::vector<bf16> data;      // row-major, shape's order
};

// How `name` (a tensor-plan name) is split on plan.rank, and which range of it that rank holds.
ShardSplit shard_split(const std::string& name, const ModelConfig& c, const PartitionPlan& plan,
                       Slice* range);

// The rank's shard of one tensor of the plan (a loader that uploads tensor by tensor holds one at a time).
ShardTensor shard_tensor(const Checkpoint& ck, const PlannedTensor& p, const PartitionPlan& plan);
// The rank's shards of every tensor of the plan, in tensor-plan order.
std::vector<ShardTensor> shard_weights(const Checkpoint& ck, const PartitionPlan& plan);

}  // namespace markbase
