// The sharding arithmetic of issue 7: every head, MLP row, expert and vocabulary row is owned by exactly one
// rank (KV heads: every query head's KV head is held by its rank), world size 1 is the whole model, the bytes
// add up, and impossible splits are refused with the field named.
#include <gtest/gtest.h>

#include "loading/checkpoint.h"
#include "loading/config_json.h"
#include "model/error.h"
#include "model/variants.h"
#include "parallel/partition.h"

namespace markbase {
namespace {

ModelConfig variant(const char* v) {
    return parse_config_text(variant_config(v).dump(), v);
}

// Slices of all ranks tile [0, n) in order, without gaps or overlaps.
void expect_tiles(const std::vector<Slice>& parts, int64_t n, const std::string& what) {
    int64_t at = 0;
    for (const Slice& s : parts) {
        EXPECT_EQ(s.begin, at) << what;
        EXPECT_GE(s.size(), 0) << what;
        at = s.end;
    }
    EXPECT_EQ(at, n) << what;
}

TEST(Partition, EvenSlicesTile) {
    for (int64_t n : {0, 1, 7, 128, 262144})
        for (int parts : {1, 2, 3, 8}) {
            std::vector<Slice> s;
            for (int i = 0; i < parts; ++i) s.push_back(even_slice(n, parts, i));
            expect_tiles(s, n, "n=" + std::to_string(n));
            for (const Slice& x : s) EXPECT_LE(x.size() - n / parts, 1);
        }
}

TEST(Partition, WorldOneIsTheWholeModel) {
    for (const char* v : {"e2b", "e4b", "26b-a4b", "31b"}) {
        const ModelConfig c = variant(v);
        const PartitionPlan p = plan_partition(c, 1, 0);
        const ModelCounts n = count_params(c);
        EXPECT_NEAR(p.bytes_per_token, n.bytes_per_token, 1e-6 * n.bytes_per_token) << v;
        EXPECT_NEAR(p.weight_bytes, 2 * n.total_params, 1e-6 * n.total_params) << v;
        EXPECT_EQ(p.allreduces_per_step, 0);
        for (int i = 0; i < c.n_layers; ++i) {
            EXPECT_EQ(p.layers[i].q_heads, (Slice{0, c.n_heads}));
            EXPECT_EQ(p.layers[i].kv_heads, (Slice{0, c.layers[i].n_kv_heads}));
        }
    }
}

TEST(Partition, EveryRowHasOneOwnerAndEveryQueryItsKv) {
    for (const char* v : {"e2b", "e4b", "26b-a4b", "31b"}) {
        const ModelConfig c = variant(v);
        for (int world : {2, 4, 8}) {
            std::vector<PartitionPlan> plans;
            for (int r = 0; r < world; ++r) plans.push_back(plan_partition(c, world, r));
            double sum_stream = 0;
            std::vector<Slice> vocab;
            for (const auto& p : plans) {
                vocab.push_back(p.vocab);
                sum_stream += p.bytes_per_token;
                EXPECT_GT(p.allreduces_per_step, c.n_layers);
            }
            expect_tiles(vocab, c.vocab_size, std::string(v) + " vocab");
            // together the ranks stream at least the model's bytes; what is replicated (norms, router, PLE
            // projections, KV heads when there are fewer than ranks) grows with the world: E2B at 8 ranks
            // ~17%
            const double whole = count_params(c).bytes_per_token;
            EXPECT_GE(sum_stream, whole * 0.999) << v << " world " << world;
            EXPECT_LE(sum_stream, whole * (1.0 + 0.025 * world)) << v << " world " << world;
            for (int i = 0; i < c.n_layers; ++i) {
                std::vector<Slice> q, mlp, ex;
                for (const auto& p : plans) {
                    const LayerShard& l = p.layers[i];
                    q.push_back(l.q_heads);
                    mlp.push_back(l.mlp_rows);
                    ex.push_back(l.experts);
                    const int group = c.n_heads / c.layers[i].n_kv_heads;
                    EXPECT_LE(l.kv_heads.begin, l.q_heads.begin / group) << v << " layer " << i;
                    EXPECT_GE(l.kv_heads.end, (l.q_heads.end - 1) / group + 1) << v << " layer " << i;
                }
                expect_tiles(q, c.n_heads, std::string(v) + " q heads");
                expect_tiles(mlp, c.layers[i].mlp_width, std::string(v) + " mlp rows");
                expect_tiles(ex, c.moe ? c.n_experts : 0, std::string(v) + " experts");
            }
        }
    }
}

TEST(Partition, ThirtyOneBOnTwoGpusHalvesTheStream) {
    // issue 7's target (31B decode >= 1.8x faster on 2 GPUs) needs each rank to stream about half the bytes
    const ModelConfig c = variant("31b");
    const double whole = count_params(c).bytes_per_token;
    for (int r = 0; r < 2; ++r) EXPECT_LT(plan_partition(c, 2, r).bytes_per_token, 0.51 * whole);
}

// The widths a rank computes with: its heads, KV heads, MLP rows (multiples of 8, so its down_proj rows stay
// 16-byte vectors) and vocabulary rows; the rest of the model is unchanged.
TEST(Partition, RankConfigHasTheRanksWidths) {
    for (const char* v : {"e2b", "e4b", "26b-a4b", "31b"}) {
        const ModelConfig c = variant(v);
        const ModelConfig one = rank_config(c, plan_partition(c, 1, 0));
        EXPECT_EQ(one.n_heads, c.n_heads);
        EXPECT_EQ(one.vocab_size, c.vocab_size);
        for (int world : {2, 4}) {
            int64_t vocab = 0;
            for (int r = 0; r < world; ++r) {
                const PartitionPlan p = plan_partition(c, world, r);
                const ModelConfig rc = rank_config(c, p);
                EXPECT_EQ(rc.n_heads, c.n_heads / world) << v;
                EXPECT_EQ(rc.hidden, c.hidden);
                EXPECT_EQ(rc.n_experts, c.n_experts) << "the router still scores every expert";
                EXPECT_EQ(rc.ple_dim, c.ple_dim);
                vocab += rc.vocab_size;
                for (int i = 0; i < c.n_layers; ++i) {
                    const LayerSpec &a = rc.layers[i], &b = c.layers[i];
                    EXPECT_EQ(a.head_dim, b.head_dim);
                    EXPECT_EQ(a.kv_source, b.kv_source);
                    EXPECT_EQ(a.n_kv_heads, p.layers[i].kv_heads.size()) << v << " layer " << i;
                    EXPECT_EQ(a.mlp_width, p.layers[i].mlp_rows.size()) << v << " layer " << i;
                    EXPECT_EQ(a.mlp_width % 8, 0) << v << " layer " << i << " world " << world;
                    EXPECT_EQ(rc.n_heads % a.n_kv_heads, 0) << "GQA groups stay whole";
                }
            }
            EXPECT_EQ(vocab, c.vocab_size) << v;
        }
    }
    const ModelConfig c = variant("31b");
    PartitionPlan p = plan_partition(c, 2, 0);
    p.layers.pop_back();
    EXPECT_THROW(rank_config(c, p), Error) << "a plan for another model";
}

TEST(Partition, ImpossibleSplitsNameTheField) {
    const ModelConfig c = variant("31b");
    try {
        plan_partition(c, 3, 0);
        FAIL() << "31B split over 3 ranks should be refused";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("num_attention_heads (32)"), std::string::npos) << e.what();
    }
    EXPECT_THROW(plan_partition(c, 2, 2), Error);
    EXPECT_THROW(plan_partition(c, 0, 0), Error);
}

}  // namespace
}  // namespace markbase
