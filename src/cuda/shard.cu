// One tensor-parallel rank's weights on the current device (issue 7). From a checkpoint: shard_tensor cuts
// the rank's rows, columns and experts of each tensor on the host and it is copied up, one tensor at a time.
// Synthetic: each tensor's block is drawn in place with fill_random_bf16_block, so a rank holds exactly the
// values that synthetic_weights gives the whole model there; world 1 and world N then compute the same model,
// which is what the tensor-parallel tests and benchmarks compare.
#include "cuda/model.h"
#include "model/tensor_plan.h"
#include "parallel/partition.h"
#include "parallel/shard.h"

namespace markbase::cuda {

namespace {

uint64_t numel(const std::vector<int64_t>& shape) {
    uint64_t n = 1;
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    return n;
}

void read_layer_scalars(DeviceWeights& dw) {
    for (LayerWeights& l : dw.w.layers) {
        bf16 raw = 0;
        CUDA_CHECK(cudaMemcpy(&raw, l.layer_scalar_raw, sizeof raw, cudaMemcpyDeviceToHost));
        l.layer_scalar = bf16_to_float(raw);
    }
}

}  // namespace

std::unique_ptr<DeviceWeights> upload_shard(const Checkpoint& ck, const PartitionPlan& plan) {
    auto dw = std::make_unique<DeviceWeights>();
    dw->config = rank_config(ck.config, plan);
    // the slots come from the whole model's plan (same names and order as shard_weights), the shapes from
    // the shards
    // tensor by tensor: the host holds one shard at a time (a whole rank's shards of the 31B are ~31 GB)
    const std::vector<PlannedTensor> planned = plan_tensors(ck.config, &dw->w);
    for (size_t i = 0; i < planned.size(); ++i) {
        const ShardTensor t = shard_tensor(ck, planned[i], plan);
        const uint64_t bytes = t.data.size() * sizeof(bf16);
        bf16* d = device_alloc(bytes, t.name + " (rank " + std::to_string(plan.rank) + ")");
        dw->tensors.push_back({t.name, t.shape, d, bytes});
        CUDA_CHECK(cudaMemcpy(d, t.data.data(), bytes, cudaMemcpyHostToDevice));
        *planned[i].slot = d;
        dw->bytes += bytes;
    }
    for (size_t i = 0; i < dw->w.layers.size(); ++i)
        dw->w.layers[i].layer_scalar = ck.weights.layers[i].layer_scalar;
    return dw;
}

std::unique_ptr<DeviceWeights> synthetic_shard(const ModelConfig& c, const PartitionPlan& plan,
                                               uint64_t seed) {
    auto dw = std::make_unique<DeviceWeights>();
    dw->config = rank_config(c, plan);
    const std::vector<PlannedTensor> planned = plan_tensors(c, &dw->w);
    for (size_t i = 0; i < planned.size(); ++i) {
        const PlannedTensor& p = planned[i];
        Slice range;
        const ShardSplit split = shard_split(p.name, c, plan, &range);
        const int64_t n = static_cast<int64_t>(numel(p.shape));
        std::vector<int64_t> shape = p.shape;
        int64_t rows = 1, cols = n, ld = n, k0 = 0;  // the block of the whole tensor's draws
        if (split == ShardSplit::Rows || split == ShardSplit::Experts) {
            const int64_t inner = n / p.shape[0];
            shape[0] = range.size();
            cols = ld = range.size() * inner;
            k0 = range.begin * inner;
        } else if (split == ShardSplit::Columns) {
            if (p.shape.size() != 2) throw Error("internal: " + p.name + ": columns of a non-matrix");
            rows = p.shape[0];
            ld = p.shape[1];
            cols = range.size();
            k0 = range.begin;
            shape[1] = cols;
        }
        const uint64_t bytes = 2 * static_cast<uint64_t>(rows * cols);
        bf16* d = device_alloc(bytes, p.name + " (rank " + std::to_string(plan.rank) + ")");
        dw->tensors.push_back({p.name, shape, d, bytes});
        float lo = 0, hi = 0;
        random_init_bounds(p, lo, hi);
        // the seed synthetic_weights gives tensor i of the whole model
        fill_random_bf16_block(d, rows, cols, ld, k0, seed * 1000003ull + i, lo, hi, nullptr);
        *p.slot = d;
        dw->bytes += bytes;
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    read_layer_scalars(*dw);
    return dw;
}

}  // namespace markbase::cuda
