// One rank's weights under the partition plan (issue 7), checked on the CPU: world size 1 is the checkpoint
// itself; at world sizes 2 and 4 the shards of all ranks put back together compute what the whole tensors
// compute (q rows and vocabulary rows concatenate, o_proj and the dense MLP's partial sums add up, experts
// tile), every query head's KV head is on its rank, and the bytes the shards hold are the plan's
// weight_bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "loading/checkpoint.h"
#include "loading/random_checkpoint.h"
#include "model/bf16.h"
#include "model/tensor_plan.h"
#include "parallel/partition.h"
#include "parallel/shard.h"
#include "support/tiny_models.h"

namespace markbase {
namespace {

std::vector<float> random_vec(int64_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = u(rng);
    return v;
}

// y[rows] = W[rows][cols] x[cols], in double
std::vector<double> matvec(const bf16* w, int64_t rows, int64_t cols, const float* x) {
    std::vector<double> y(static_cast<size_t>(rows), 0.0);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t k = 0; k < cols; ++k) y[r] += static_cast<double>(bf16_to_float(w[r * cols + k])) * x[k];
    return y;
}

void expect_close(const std::vector<double>& want, const std::vector<double>& got, const std::string& what) {
    ASSERT_EQ(want.size(), got.size()) << what;
    double mx = 0, diff = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        mx = std::max(mx, std::fabs(want[i]));
        diff = std::max(diff, std::fabs(want[i] - got[i]));
    }
    EXPECT_LE(diff, 1e-9 * std::max(mx, 1.0)) << what;
}

double gelu(double x) {
    return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

class Shard : public ::testing::TestWithParam<std::string> {};

TEST_P(Shard, RanksTogetherComputeTheWholeModel) {
    testing::TempDir dir("shard");
    write_random_checkpoint(dir.path(), testing::tiny_config(GetParam()), 21);
    const auto ck = load_checkpoint(dir.path());
    const ModelConfig& c = ck->config;
    auto full = [&](const std::string& name) {
        return reinterpret_cast<const bf16*>(ck->files.get(c.weight_prefix + name).data);
    };

    // world 1: the checkpoint, tensor for tensor
    {
        const auto one = shard_weights(*ck, plan_partition(c, 1, 0));
        const auto plan = plan_tensors(c, nullptr);
        ASSERT_EQ(one.size(), plan.size());
        for (const ShardTensor& t : one) {
            const TensorInfo& info = ck->files.get(c.weight_prefix + t.name);
            EXPECT_EQ(t.shape, info.shape) << t.name;
            ASSERT_EQ(t.data.size() * sizeof(bf16), info.nbytes) << t.name;
            EXPECT_EQ(0, std::memcmp(t.data.data(), info.data, info.nbytes)) << t.name;
        }
    }

    for (int world : {2, 4}) {
        const std::string tag = GetParam() + " world " + std::to_string(world);
        std::vector<PartitionPlan> plans;
        std::vector<std::map<std::string, ShardTensor>> shards;
        for (int r = 0; r < world; ++r) {
            plans.push_back(plan_partition(c, world, r));
            std::map<std::string, ShardTensor> m;
            double bytes = 0;
            for (ShardTensor& t : shard_weights(*ck, plans.back())) {
                bytes += 2.0 * static_cast<double>(t.data.size());
                m[t.name] = std::move(t);
            }
            EXPECT_DOUBLE_EQ(bytes, plans.back().weight_bytes) << tag << " rank " << r;
            shards.push_back(std::move(m));
        }
        const int H = c.hidden;
        for (int i = 0; i < c.n_layers; ++i) {
            const LayerSpec& s = c.layers[i];
            const std::string p = "layers." + std::to_string(i) + ".";
            const int d = s.head_dim, nq = c.n_heads * d, group = c.n_heads / s.n_kv_heads;
            const std::vector<float> x = random_vec(H, 100 + i), a = random_vec(nq, 200 + i);

            // q: the ranks' rows, in rank order, are q_proj's rows
            std::vector<double> q_cat;
            for (int r = 0; r < world; ++r) {
                const ShardTensor& q = shards[r].at(p + "self_attn.q_proj.weight");
                const auto part = matvec(q.data.data(), q.shape[0], H, x.data());
                q_cat.insert(q_cat.end(), part.begin(), part.end());
            }
            expect_close(matvec(full(p + "self_attn.q_proj.weight"), nq, H, x.data()), q_cat,
                         tag + " q " + p);

            // o_proj: each rank's columns times its heads' part of the attention output, summed over ranks
            std::vector<double> o_sum(H, 0.0);
            for (int r = 0; r < world; ++r) {
                const ShardTensor& o = shards[r].at(p + "self_attn.o_proj.weight");
                ASSERT_EQ(o.shape[0], H);
                const auto part = matvec(o.data.data(), H, o.shape[1], a.data() + o.range.begin);
                for (int j = 0; j < H; ++j) o_sum[j] += part[j];
            }
            expect_close(matvec(full(p + "self_attn.o_proj.weight"), H, nq, a.data()), o_sum,
                         tag + " o " + p);

            // KV: every query head of a rank reads a KV head that rank projects, with the full rows of it
            if (s.has_own_kv()) {
                for (int r = 0; r < world; ++r) {
                    const LayerShard& l = plans[r].layers[i];
                    for (int64_t h = l.q_heads.begin; h < l.q_heads.end; ++h) {
                        const int64_t g = h / group;
                        EXPECT_TRUE(g >= l.kv_heads.begin && g < l.kv_heads.end) << tag << " " << p << h;
                    }
                    const ShardTensor& k = shards[r].at(p + "self_attn.k_proj.weight");
                    EXPECT_EQ(
                        0, std::memcmp(k.data.data(), full(p + "self_attn.k_proj.weight") + k.range.begin * H,
                                       k.data.size() * sizeof(bf16)))
                        << tag << " k " << p;
                }
            }

            // dense MLP: sum over ranks of down_r (gelu(gate_r x) * up_r x) is the whole MLP
            const int I = s.mlp_width;
            std::vector<double> m_sum(H, 0.0);
            for (int r = 0; r < world; ++r) {
                const ShardTensor& g = shards[r].at(p + "mlp.gate_proj.weight");
                const ShardTensor& u = shards[r].at(p + "mlp.up_proj.weight");
                const ShardTensor& dn = shards[r].at(p + "mlp.down_proj.weight");
                const auto gv = matvec(g.data.data(), g.shape[0], H, x.data());
                const auto uv = matvec(u.data.data(), u.shape[0], H, x.data());
                std::vector<float> h(gv.size());
                for (size_t j = 0; j < h.size(); ++j) h[j] = static_cast<float>(gelu(gv[j]) * uv[j]);
                const auto part = matvec(dn.data.data(), H, dn.shape[1], h.data());
                for (int j = 0; j < H; ++j) m_sum[j] += part[j];
            }
            {
                const auto gv = matvec(full(p + "mlp.gate_proj.weight"), I, H, x.data());
                const auto uv = matvec(full(p + "mlp.up_proj.weight"), I, H, x.data());
                std::vector<float> h(gv.size());
                for (size_t j = 0; j < h.size(); ++j) h[j] = static_cast<float>(gelu(gv[j]) * uv[j]);
                expect_close(matvec(full(p + "mlp.down_proj.weight"), H, I, h.data()), m_sum,
                             tag + " mlp " + p);
            }

            // experts: the ranks' experts tile [0, E) and hold their bytes unchanged
            if (c.moe) {
                for (const char* name : {"experts.gate_up_proj", "experts.down_proj"}) {
                    int64_t next = 0;
                    const TensorInfo& info = ck->files.get(c.weight_prefix + p + name);
                    const int64_t per = info.numel() / c.n_experts;
                    for (int r = 0; r < world; ++r) {
                        const ShardTensor& e = shards[r].at(p + name);
                        EXPECT_EQ(e.range.begin, next) << tag << " " << p << name;
                        next = e.range.end;
                        EXPECT_EQ(0, std::memcmp(e.data.data(), full(p + name) + e.range.begin * per,
                                                 e.data.size() * sizeof(bf16)))
                            << tag << " " << p << name;
                    }
                    EXPECT_EQ(next, c.n_experts) << tag << " " << p << name;
                }
            }
        }
        // the tied embedding / lm_head: vocabulary rows concatenate to the whole table
        std::vector<bf16> cat;
        for (int r = 0; r < world; ++r) {
            const ShardTensor& e = shards[r].at("embed_tokens.weight");
            cat.insert(cat.end(), e.data.begin(), e.data.end());
        }
        ASSERT_EQ(cat.size() * sizeof(bf16), ck->files.get(c.weight_prefix + "embed_tokens.weight").nbytes);
        EXPECT_EQ(0, std::memcmp(cat.data(), full("embed_tokens.weight"), cat.size() * sizeof(bf16))) << tag;
    }
}

INSTANTIATE_TEST_SUITE_P(Families, Shard, ::testing::Values("e2b", "e4b", "26b-a4b", "31b"),
                         [](const auto& p) { return testing::test_name(p.param); });

}  // namespace
}  // namespace markbase
