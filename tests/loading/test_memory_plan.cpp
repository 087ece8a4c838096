// Memory honesty (loading/memory_plan.h): the KV-cache arithmetic against hand-computed numbers, and the
// fit check's verdict, message and largest-fitting context against fake free-memory figures.
#include <gtest/gtest.h>

#include <string>

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
    // sliding ring: min(4096, 512 + 256) = 768 positions x 1 head x 256 x fp32, K and V;
    // full: 4096 x 2 heads x 512 x fp32, K and V; the shared layer holds nothing.
    EXPECT_EQ(cuda_kv_cache_bytes(c, 4096, 256), 2ull * 768 * 256 * 4 + 2ull * 4096 * 2 * 512 * 4);
    // short context: the ring is the whole context
    EXPECT_EQ(cuda_kv_cache_bytes(c, 100, 256), 2ull * 100 * 256 * 4 + 2ull * 100 * 2 * 512 * 4);
    // the context is clamped to max_positions as the backend clamps it
    EXPECT_EQ(cuda_kv_cache_bytes(c, 1 << 30, 256), cuda_kv_cache_bytes(c, 131072, 256));
}

TEST(MemoryPlan, WorkspaceGrowsWithChunkAndIncludesTheReserve) {
    const ModelConfig c = variant("e2b");
    const uint64_t w1 = cuda_workspace_bytes(c, 4096, 1), w512 = cuda_workspace_bytes(c, 4096, 512);
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
        expect += 2ull * static_cast<uint64_t>(cap) * s.n_kv_heads * s.head_dim * 4;
    }
    EXPECT_EQ(cuda_kv_cache_bytes(c, ctx, 512), expect);
}

TEST(MemoryPlan, FitsWhenThereIsRoom) {
    const ModelConfig c = variant("26b-a4b");
    const uint64_t weights = 50'500'000'000ull;
    const FitCheck f = check_cuda_fit(c, weights, 4096, 512, 140'000'000'000ull, "NVIDIA H200");
    EXPECT_TRUE(f.fits) << f.message;
    EXPECT_EQ(f.max_ctx, 4096);
}

TEST(MemoryPlan, SaysWhatDoesNotFitAndTheLargestContextThatDoes) {
    const ModelConfig c = variant("26b-a4b");
    const uint64_t weights = 50'500'000'000ull, free_b = 55'000'000'000ull;  // KV at full ctx is ~12 GB
    const int64_t ctx = c.max_positions;
    const CudaMemoryPlan p = plan_cuda_memory(c, weights, ctx, 512);
    ASSERT_GT(p.total(), free_b) << "pick a context that does not fit";
    const FitCheck f = check_cuda_fit(c, weights, ctx, 512, free_b, "NVIDIA H200");
    EXPECT_FALSE(f.fits);
    EXPECT_NE(f.message.find("model 50.5 GB + KV cache for " + std::to_string(ctx) + " tokens"),
              std::string::npos)
        << f.message;
    EXPECT_NE(f.message.find(" > 55.0 GB free on NVIDIA H200"), std::string::npos) << f.message;
    EXPECT_NE(f.message.find("lower --ctx-size to at most " + std::to_string(f.max_ctx)), std::string::npos)
        << f.message;
    ASSERT_GT(f.max_ctx, 0);
    EXPECT_LE(plan_cuda_memory(c, weights, f.max_ctx, 512).total(), free_b);
    EXPECT_GT(plan_cuda_memory(c, weights, f.max_ctx + 1, 512).total(), free_b);
    EXPECT_TRUE(check_cuda_fit(c, weights, f.max_ctx, 512, free_b, "x").fits);
}

TEST(MemoryPlan, WeightsAloneTooBig) {
    const ModelConfig c = variant("e2b");
    const FitCheck f = check_cuda_fit(c, 10'000'000'000ull, 4096, 256, 8'000'000'000ull, "small GPU");
    EXPECT_FALSE(f.fits);
    EXPECT_EQ(f.max_ctx, 0);
    EXPECT_NE(f.message.find("alone do not fit"), std::string::npos) << f.message;
    EXPECT_EQ(f.message.find("--ctx-size"), std::string::npos) << f.message;
}

TEST(MemoryPlan, FormatGb) {
    EXPECT_EQ(format_gb(50'500'000'000ull), "50.5 GB");
    EXPECT_EQ(format_gb(0), "0.0 GB");
}
