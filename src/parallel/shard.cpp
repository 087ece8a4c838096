#include "parallel/shard.h"

#include <cstring>

#include "model/error.h"
#include "model/tensor_plan.h"

namespace markbase {

namespace {

bool has(const std::string& s, const char* part) {
    return s.find(part) != std::string::npos;
}

}  // namespace

ShardSplit shard_split(const std::string& name, const ModelConfig& c, const PartitionPlan& plan,
                       Slice* range) {
    *range = {};
    if (name == "embed_tokens.weight") {
        *range = plan.vocab;
        return ShardSplit::Rows;
    }
    if (name.rfind("layers.", 0) != 0) return ShardSplit::Whole;
    const int i = std::stoi(name.substr(7, name.find('.', 7) - 7));
    const LayerShard& l = plan.layers.at(static_cast<size_t>(i));
    const int64_t d = c.layers.at(static_cast<size_t>(i)).head_dim;
    if (has(name, "self_attn.q_proj.") || has(name, "self_attn.o_proj.")) {
        *range = {l.q_heads.begin * d, l.q_heads.end * d};
        return has(name, "q_proj") ? ShardSplit::Rows : ShardSplit::Columns;
    }
    if (has(name, "self_attn.k_proj.") || has(name, "self_attn.v_proj.")) {
        *range = {l.kv_heads.begin * d, l.kv_heads.end * d};
        return ShardSplit::Rows;
    }
    if (has(name, ".mlp.gate_proj.") || has(name, ".mlp.up_proj.") || has(name, ".mlp.down_proj.")) {
        *range = l.mlp_rows;
        return has(name, "down_proj") ? ShardSplit::Columns : ShardSplit::Rows;
    }
    if (has(name, ".experts.")) {
        *range = l.experts;
        return ShardSplit::Experts;
    }
    return ShardSplit::Whole;
}

ShardTensor shard_tensor(const Checkpoint& ck, const PlannedTensor& p, const PartitionPlan& plan) {
    const ModelConfig& c = ck.config;
    // The shards are cut from the files; the bf16 values of FP8 weights are made at load and are in none.
    if (ck.format != WeightFormat::kBf16 || !ck.owned.dequantized.empty())
        throw Error(
            ck.dir.string() +
            ": FP8 weights (published, or --quantize fp8) cannot be split over GPUs yet: the shards are "
            "read from the checkpoint's bf16 files; use --device cpu");
    const TensorInfo& t = ck.files.get(c.weight_prefix + p.name);
    const bf16* src = reinterpret_cast<const bf16*>(t.data);
    ShardTensor s;
    s.name = p.name;
    s.split = shard_split(p.name, c, plan, &s.range);
    s.shape = p.shape;
    const int64_t n = t.numel();
    switch (s.split) {
        case ShardSplit::Whole:
            s.data.assign(src, src + n);
            break;
        case ShardSplit::Rows:
        case ShardSplit::Experts: {  // a contiguous run of dim 0
            const int64_t inner = n / p.shape[0];
            if (s.range.end > p.shape[0])
                throw Error("internal: " + p.name + ": shard " + std::to_string(s.range.begin) + ".." +
                            std::to_string(s.range.end) + " exceeds " + std::to_string(p.shape[0]));
            s.shape[0] = s.range.size();
            s.data.assign(src + s.range.begin * inner, src + s.range.end * inner);
            break;
        }
        case ShardSplit::Columns: {  // [rows][cols] -> [rows][range]
            if (p.shape.size() != 2 || s.range.end > p.shape[1])
                throw Error("internal: " + p.name + ": cannot take columns " + std::to_string(s.range.begin) +
                            ".." + std::to_string(s.range.end));
            const int64_t rows = p.shape[0], cols = p.shape[1], w = s.range.size();
            s.shape[1] = w;
            s.data.resize(static_cast<size_t>(rows * w));
            for (int64_t r = 0; r < rows; ++r)
                std::memcpy(s.data.data() + r * w, src + r * cols + s.range.begin,
                            static_cast<size_t>(w) * sizeof(bf16));
            break;
        }
    }
    return s;
}

std::vector<ShardTensor> shard_weights(const Checkpoint& ck, const PartitionPlan& plan) {
    std::vector<ShardTensor> out;
    for (const PlannedTensor& p : plan_tensors(ck.config, nullptr)) out.push_back(shard_tensor(ck, p, plan));
    return out;
}

}  // namespace markbase
