// Memory honesty (loading/memory_plan.h): the buffer list and the KV-cache arithmetic against hand-computed
// numbers (one sequence and several slots), and the fit check's verdict, message and largest-fitting context
// against fake free-memory figures.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "loading/config_json.h"
#include "loading/memory_plan.h"
#include "model/variants.h"

using namespace markbase;

namespace {

// Two layers with their own cache (one sliding, one full) and a KV-shared third, window 512.
ModelConfig hand_config() {
    ModelConfig c;
    c.hidden = 64;
    c.n_heads = 2;
    c.n_layers = 3;
    c.vocab_size = 1000;
    c.sliding_window = 512;
    c.max_positions = 131072;
    LayerSpec sl;
    sl.kind = AttentionKind::Sliding;
    sl.head_dim = 256;
    sl.n_kv_heads = 1;
    sl.mlp_width = 128;
    LayerSpec full = sl;
    full.kind = AttentionKind::Full;
    full.head_dim = 512;
    full.n_kv_heads = 2;
    LayerSpec shared = sl;
    shared.kv_source = 0;
    c.layers = {sl, full, shared};
    return c;
}

ModelConfig variant(const char* v) {
    return parse_config_text(variant_config(v).dump(), v);
}

}  // namespace

TEST(MemoryPlan, KvCacheBytesByHand) {
    const ModelConfig c = hand_config();
    // sliding ring: min(4096, 512 + 256) = 768 positions x 1 head x 256 x bf16 (the default), K and V;
    // full: 4096 x 2 heads x 512 x bf16, K and V; the shared layer holds nothing.
    EXPECT_EQ(cuda_kv_cache_bytes(c, 4096, 256, 1), 2ull * 768 * 256 * 2 + 2ull * 4096 * 2 * 512 * 2);
    // an fp32 cache (--kv-cache-dtype f32): twice that
    EXPECT_EQ(cuda_kv_cache_bytes(c, 4096, 256, 1, 4), 2ull * 768 * 256 * 4 + 2ull * 4096 * 2 * 512 * 4);
    // an fp8 cache (--kv-cache-dtype fp8): half the bf16 cache
    EXPECT_EQ(cuda_kv_cache_bytes(c, 4096, 256, 1, 1), 2ull * 768 * 256 + 2ull * 4096 * 2 * 512);
    // short context: the ring is the whole context
    EXPECT_EQ(cuda_kv_cache_bytes(c, 100, 256, 1), 2ull * 100 * 256 * 2 + 2ull * 100 * 2 * 512 * 2);
    // the context is clamped to max_positions as the backend clamps it
    EXPECT_EQ(cuda_kv_cache_bytes(c, 1 << 30, 256, 1), cuda_kv_cache_bytes(c, 131072, 256, 1));
}

// Prefill widens an fp8 layer's rows to bf16 for its attention GEMMs: room for the largest layer's K and V
// of one slot (here the full layer's 4096 x 2 x 512), with one sequence as with several; a bf16 cache
// gathers only a paged layer's rows (several slots), in its own type.
TEST(MemoryPlan, AnFp8CacheHasRoomToWidenOneSlotsLargestLayer) {
    const ModelConfig c = hand_config();
    CudaBufferSpec spec;
    spec.ctx = 4096;
    spec.chunk = 256;
    spec.kv_elem_bytes = 1;
    EXPECT_EQ(cuda_buffers(c, spec)[CudaBuf::kKvGather], 2 * (4096 * 2 * 512) * 2);
    spec.slots = 3;
    EXPECT_EQ(cuda_buffers(c, spec)[CudaBuf::kKvGather], 2 * (4096 * 2 * 512) * 2);
    spec.kv_elem_bytes = 2;
    EXPECT_EQ(cuda_buffers(c, spec)[CudaBuf::kKvGather], 2 * 4096 * (2 * 512) * 2);
    spec.slots = 1;
    EXPECT_EQ(cuda_buffers(c, spec)[CudaBuf::kKvGather], 0);
}

TEST(MemoryPlan, WorkspaceGrowsWithChunkAndIncludesTheReserve) {
    const ModelConfig c = variant("e2b");
    const uint64_t w1 = cuda_workspace_bytes(c, 4096, 1, 1), w512 = cuda_workspace_bytes(c, 4096, 512, 1);
    EXPECT_GE(w1, kCudaRuntimeReserve);
    EXPECT_GT(w512, w1);
    EXPECT_LT(w512, kCudaRuntimeReserve + (uint64_t{2} << 30));  // activations, not gigabytes of them
}

TEST(MemoryPlan, TwentySixBAtFullContextMatchesTheCudaLayout) {
    const ModelConfig c = variant("26b-a4b");
    uint64_t expect = 0;
    const int64_t ctx = c.max_positions;
    for (const LayerSpec& s : c.layers) {
        if (!s.has_own_kv()) continue;
        const int64_t cap =
            s.kind == AttentionKind::Sliding ? std::min<int64_t>(ctx, c.sliding_window + 512) : ctx;
        expect += 2ull * static_cast<uint64_t>(cap) * s.n_kv_heads * s.head_dim * 2;
    }
    EXPECT_EQ(cuda_kv_cache_bytes(c, ctx, 512, 1), expect);
}

TEST(MemoryPlan, FitsWhenThereIsRoom) {
    const ModelConfig c = variant("26b-a4b");
    const uint64_t weights = 50'500'000'000ull;
    const FitCheck f = check_cuda_fit(c, weights, 4096, 512, 1, 140'000'000'000ull, "NVIDIA H200");
    EXPECT_TRUE(f.fits) << f.message;
    EXPECT_EQ(f.max_ctx, 4096);
}

TEST(MemoryPlan, SaysWhatDoesNotFitAndTheLargestContextThatDoes) {
    const ModelConfig c = variant("26b-a4b");
    const uint64_t weights = 50'500'000'000ull, free_b = 55'000'000'000ull;  // KV at full ctx is ~12 GB
    const int64_t ctx = c.max_positions;
    const CudaMemoryPlan p = plan_cuda_memory(c, weights, ctx, 512, 1);
    ASSERT_GT(p.total(), free_b) << "pick a context that does not fit";
    const FitCheck f = check_cuda_fit(c, weights, ctx, 512, 1, free_b, "NVIDIA H200");
    EXPECT_FALSE(f.fits);
    EXPECT_NE(f.message.find("model 50.5 GB + KV cache for " + std::to_string(ctx) + " tokens"),
              std::string::npos)
        << f.message;
    EXPECT_NE(f.message.find(" > 55.0 GB free on NVIDIA H200"), std::string::npos) << f.message;
    EXPECT_NE(f.message.find("lower --ctx-size to at most " + std::to_string(f.max_ctx)), std::string::npos)
        << f.message;
    ASSERT_GT(f.max_ctx, 0);
    EXPECT_LE(plan_cuda_memory(c, weights, f.max_ctx, 512, 1).total(), free_b);
    EXPECT_GT(plan_cuda_memory(c, weights, f.max_ctx + 1, 512, 1).total(), free_b);
    EXPECT_TRUE(check_cuda_fit(c, weights, f.max_ctx, 512, 1, free_b, "x").fits);
}

TEST(MemoryPlan, WeightsAloneTooBig) {
    const ModelConfig c = variant("e2b");
    const FitCheck f = check_cuda_fit(c, 10'000'000'000ull, 4096, 256, 1, 8'000'000'000ull, "small GPU");
    EXPECT_FALSE(f.fits);
    EXPECT_EQ(f.max_ctx, 0);
    EXPECT_NE(f.message.find("alone do not fit"), std::string::npos) << f.message;
    EXPECT_EQ(f.message.find("--ctx-size"), std::string::npos) << f.message;
    // with slots the weights are still what does not fit, not the sequences
    const FitCheck g = check_cuda_fit(c, 10'000'000'000ull, 4096, 256, 64, 8'000'000'000ull, "small GPU");
    EXPECT_NE(g.message.find("alone do not fit"), std::string::npos) << g.message;
}

TEST(MemoryPlan, BufferTableNamesEveryBuffer) {
    // a buffer added to CudaBuf without its row in kCudaBufInfo would be summed as 0 bytes
    for (size_t i = 0; i < kCudaBufInfo.size(); ++i) {
        ASSERT_NE(kCudaBufInfo[i].name, nullptr) << "buffer " << i;
        EXPECT_TRUE(kCudaBufInfo[i].elem_bytes == 1 || kCudaBufInfo[i].elem_bytes == 2 ||
                    kCudaBufInfo[i].elem_bytes == 4 || kCudaBufInfo[i].elem_bytes == 8)
            << kCudaBufInfo[i].name;
        for (size_t j = 0; j < i; ++j) EXPECT_STRNE(kCudaBufInfo[i].name, kCudaBufInfo[j].name);
    }
    // the rows follow the enum (buffers.cu refuses a buffer taken with another element size)
    EXPECT_STREQ(CudaBuffers::name(CudaBuf::kState), "state");
    EXPECT_STREQ(CudaBuffers::name(CudaBuf::kScorePtrs), "score_ptrs");
    EXPECT_STREQ(CudaBuffers::name(CudaBuf::kExpertSlots), "expert_slots");
    EXPECT_STREQ(CudaBuffers::name(CudaBuf::kAllLogits), "all_logits");
    CudaBuffers b;
    for (CudaBuf k : {CudaBuf::kArgmax, CudaBuf::kSelSlices, CudaBuf::kSelTop, CudaBuf::kScorePtrs}) {
        b.count[static_cast<size_t>(k)] = 1;
        EXPECT_EQ(b.bytes(k), 8u) << CudaBuffers::name(k);  // u64 and pointers
    }
    b.count[static_cast<size_t>(CudaBuf::kHi)] = b.count[static_cast<size_t>(CudaBuf::kMh)] = 1;
    EXPECT_EQ(b.bytes(CudaBuf::kHi) + b.bytes(CudaBuf::kMh), 4u);  // bf16
}

TEST(MemoryPlan, WorkspaceBuffersByHand) {
    const ModelConfig c = hand_config();  // q = 2 x 512, kv = 2 x 512, mlp 128, H 64, V 1000, dense
    CudaBufferSpec spec;
    spec.ctx = 4096;
    spec.chunk = 256;
    const CudaBuffers b = cuda_buffers(c, spec);
    const uint64_t n = 256, f = 4;
    const uint64_t state =
        4 * 4 + n * 4 + 4096 * 4 + 8 + n * 64 * f + 4 + 64 * f + 2 * 4;  // .. attn_counters
    const uint64_t act = n * 1024 * f * 4 /* q, k, v, attn */ + n * 64 * f * 2 /* o, m */ +
                         n * 128 * f * 2 /* g, u */ + 1000 * f /* logits */;
    const uint64_t topk = 64 * 8 + 64 * 8 + 2 * 4 + 2 * 1024 * 4;  // slices of one 4096 slice, top, info, pen
    const uint64_t gemm = 2 * n * 1024 * 2 /* bf16 hi, lo */ + 2 * 128 * 1024 * f /* stacked y2 */;
    // pieces: max(n x 2 heads x 4, decode's 2 heads x min(4096 / 16, 512 / 2)) = 2048, of the 512-wide head
    const uint64_t attn = 2048 * 512 * f + 2 * 2048 * f + n * 2 * 2048 * f /* scores */ + 6 * 2 * 8;
    const uint64_t rope = (256 / 2 + 512 / 2) * f;
    EXPECT_EQ(b.max_pieces, 2048);
    EXPECT_EQ(b.eager_bytes(), state + act + topk + gemm + attn + rope);
    EXPECT_EQ(b.eager_bytes(), 15'187'756u);
    EXPECT_EQ(b.bytes(CudaBuf::kAllLogits), n * 1000 * f);  // lazy with one sequence: not in eager_bytes
    EXPECT_EQ(cuda_workspace_bytes(c, 4096, 256, 1), b.eager_bytes() + kCudaRuntimeReserve);
    EXPECT_EQ(b.kv_bytes(), cuda_kv_cache_bytes(c, 4096, 256, 1));
}

TEST(MemoryPlan, KvCacheScalesWithSlots) {
    const ModelConfig c = hand_config();
    const uint64_t one = 2ull * 768 * 256 * 2 + 2ull * 4096 * 2 * 512 * 2;
    EXPECT_EQ(cuda_kv_cache_bytes(c, 4096, 256, 1), one);
    EXPECT_EQ(cuda_kv_cache_bytes(c, 4096, 256, 2), 2 * one);
    EXPECT_EQ(cuda_kv_cache_bytes(c, 4096, 256, 64), 64 * one);
    // 26B-A4B at ctx 4096, chunk 512: 0.4 GB for one sequence, 25.5 GB for 64 (fp32: twice)
    const ModelConfig big = variant("26b-a4b");
    EXPECT_EQ(cuda_kv_cache_bytes(big, 4096, 512, 1), 398'458'880ull);
    EXPECT_EQ(cuda_kv_cache_bytes(big, 4096, 512, 64), 64 * 398'458'880ull);
    EXPECT_EQ(cuda_kv_cache_bytes(big, 4096, 512, 64, 4), 2 * 64 * 398'458'880ull);
}

TEST(MemoryPlan, SlotsAddBatchArraysAndAllRowsLogits) {
    // batched decode's positions, slots and next ids [chunk] ints, the [chunk][V] logits it always needs,
    // the paged cache's block tables (4096 / 16 ints per slot), prefill's gather of one slot's full-layer
    // K and V (4096 rows of 2 x 512, bf16) and, for each row of a step (min(chunk, slots)) beyond the one
    // sequence's, the device top-k's candidates, counts, penalty window and slices' winners (64 keys, 2 ints,
    // 2 x 1024 ints, 64 keys a slice of 4,096 ids)
    const ModelConfig c = hand_config();
    const uint64_t w1 = cuda_workspace_bytes(c, 4096, 256, 1);
    const uint64_t gather = 2ull * 4096 * 1024 * 2;
    const uint64_t select = 64 * 8 + 2 * 4 + 2 * 1024 * 4 + 64 * 8;  // V 1000: one slice
    EXPECT_EQ(cuda_workspace_bytes(c, 4096, 256, 2),
              w1 + 3 * 256 * 4 + 256ull * 1000 * 4 + 2 * 256 * 4 + gather + select);
    EXPECT_EQ(cuda_workspace_bytes(c, 4096, 256, 64),
              cuda_workspace_bytes(c, 4096, 256, 2) + 62 * 256 * 4 + 62 * select);
    const ModelConfig big = variant("26b-a4b");
    EXPECT_EQ(cuda_workspace_bytes(big, 4096, 512, 64) - cuda_workspace_bytes(big, 4096, 512, 1),
              3 * 512 * 4 + 512ull * 262144 * 4 + 64 * 256 * 4 + gather + 63 * (select + 63 * 64 * 8));
}

TEST(MemoryPlan, PagedPoolBytesAndTheLargestPoolThatFits) {
    const ModelConfig c = hand_config();
    // two slots: the sliding layer's rings (768 positions each) and a pool of 100 blocks of 16 positions of
    // the full layer (2 x 512), K and V, bf16
    const uint64_t rings = 2ull * 2 * 768 * 256 * 2, block = 2ull * 16 * 1024 * 2;
    EXPECT_EQ(cuda_kv_cache_bytes(c, 4096, 256, 2, 2, 100), rings + 100 * block);
    EXPECT_EQ(cuda_kv_cache_bytes(c, 4096, 256, 2), rings + 2 * 256 * block);  // every slot's whole context
    CudaBufferSpec spec;
    spec.ctx = 4096;
    spec.chunk = 256;
    spec.slots = 2;
    spec.kv_blocks = 100;
    const CudaBuffers b = cuda_buffers(c, spec);
    EXPECT_EQ(b.kv_block_bytes(), block);
    EXPECT_EQ(b.kv_blocks, 100);
    EXPECT_EQ(b.kv_table_stride, 256);
    EXPECT_EQ(b.kv_paged, (std::vector<char>{0, 1, 0}));
    spec.slots = 1;  // one sequence: not paged
    EXPECT_EQ(cuda_buffers(c, spec).kv_blocks, 0);
    EXPECT_EQ(cuda_buffers(c, spec)[CudaBuf::kKvTable], 0);
    EXPECT_EQ(fit_kv_blocks(c, 0, 4096, 256, 1, 2, 1ull << 40), 0);

    // the largest pool within a budget: its plan fits, one block more does not
    const uint64_t weights = 1'000'000'000ull, budget = 2'000'000'000ull;
    const int64_t n = fit_kv_blocks(c, weights, 4096, 256, 8, 2, budget);
    ASSERT_GT(n, 256);
    EXPECT_LE(plan_cuda_memory(c, weights, 4096, 256, 8, 2, n).total(), budget);
    EXPECT_GT(plan_cuda_memory(c, weights, 4096, 256, 8, 2, n + 1).total(), budget);
    // not even one context of 4096 positions (256 blocks): 0
    const uint64_t short_budget = plan_cuda_memory(c, weights, 4096, 256, 8, 2, 256).total() - 1;
    EXPECT_EQ(fit_kv_blocks(c, weights, 4096, 256, 8, 2, short_budget), 0);
}

TEST(MemoryPlan, ShardedRankDoublesTheMoePartials) {
    const ModelConfig c = variant("26b-a4b");
    CudaBufferSpec one;
    one.ctx = 4096;
    one.chunk = 512;
    CudaBufferSpec rank = one;
    rank.sharded = true;
    const CudaBuffers a = cuda_buffers(c, one), b = cuda_buffers(c, rank);
    EXPECT_EQ(b[CudaBuf::kM], 2 * a[CudaBuf::kM]);
    EXPECT_GT(a[CudaBuf::kXr], 0);
    EXPECT_EQ(b[CudaBuf::kXr], 0);  // a rank keeps its updates behind the sums: no prenormed router input
}

TEST(MemoryPlan, FitsAtOneSlotButNotAtSixtyFour) {
    // an fp32 cache; the bf16 one (half) fits the 64 sequences
    const ModelConfig c = variant("26b-a4b");
    const uint64_t weights = 50'500'000'000ull, free_b = 80'000'000'000ull;
    const FitCheck f1 = check_cuda_fit(c, weights, 4096, 512, 1, free_b, "NVIDIA H200", 4);
    EXPECT_TRUE(f1.fits) << f1.message;
    const FitCheck h = check_cuda_fit(c, weights, 4096, 512, 64, free_b, "NVIDIA H200", 2);
    EXPECT_TRUE(h.fits) << h.message;
    const FitCheck f = check_cuda_fit(c, weights, 4096, 512, 64, free_b, "NVIDIA H200", 4);
    EXPECT_FALSE(f.fits) << f.message;
    EXPECT_NE(f.message.find("KV cache for 64 sequences of 4096 positions 51.0 GB"), std::string::npos)
        << f.message;
    EXPECT_NE(f.message.find("--parallel"), std::string::npos) << f.message;
    // the largest context for 64 sequences, not for one
    ASSERT_GT(f.max_ctx, 0);
    EXPECT_LT(f.max_ctx, 4096);
    EXPECT_LE(plan_cuda_memory(c, weights, f.max_ctx, 512, 64, 4).total(), free_b);
    EXPECT_GT(plan_cuda_memory(c, weights, f.max_ctx + 1, 512, 64, 4).total(), free_b);
    EXPECT_NE(f.message.find("lower --ctx-size to at most " + std::to_string(f.max_ctx)), std::string::npos)
        << f.message;
}

TEST(MemoryPlan, FormatGb) {
    EXPECT_EQ(format_gb(50'500'000'000ull), "50.5 GB");
    EXPECT_EQ(format_gb(0), "0.0 GB");
}
