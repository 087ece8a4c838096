#include "support/kv_long_prompt.h"

#include <algorithm>
#include <vector>

#include "loading/checkpoint.h"
#include "loading/random_checkpoint.h"
#include "model/error.h"
#include "runtime/backend.h"
#include "support/exact_options.h"
#include "support/logits_compare.h"
#include "support/tiny_models.h"
#ifdef MARKBASE_HAS_CUDA
#include "cuda/backend.h"
#endif

namespace markbase::testing {

KvLongPrompt kv_long_prompt_against_f32(const std::string& family, KvDtype kv) {
    KvLongPrompt r;
#ifdef MARKBASE_HAS_CUDA
    TempDir dir("cuda-kv-long-" + family);
    nlohmann::json cfg = tiny_config(family);
    cfg["max_position_embeddings"] = 4096;
    write_random_checkpoint(dir.path(), cfg, 31);
    auto ck = load_checkpoint(dir.path());
    const int64_t V = ck->config.vocab_size;
    r.moe = ck->config.moe;
    constexpr int kPrompt = 2300, kChunk = 1024, kSteps = 8;
    const std::vector<int> ids = random_ids(kPrompt, 256, 17);
    BackendOptions o = testing::exact_options();
    o.ctx_size = kPrompt + kSteps + 1;
    o.chunk = kChunk;
    o.kv_dtype = KvDtype::kF32;
    auto f32 = make_cuda_backend(*ck, o);
    o.kv_dtype = kv;
    auto other = make_cuda_backend(*ck, o);
    r.bytes = other->cache_bytes();
    r.f32_bytes = f32->cache_bytes();

    std::vector<float> lf(static_cast<size_t>(kPrompt) * V), lo(lf.size());
    f32->eval(ids.data(), kPrompt, lf.data(), true);
    other->eval(ids.data(), kPrompt, lo.data(), true);
    const std::vector<float> tail_f(lf.end() - kChunk * V, lf.end()), tail_o(lo.end() - kChunk * V, lo.end());
    r.batched = rel_err(tail_f, tail_o);
    std::vector<float> df(V), dother(V);
    int next = static_cast<int>(std::max_element(lf.end() - V, lf.end()) - (lf.end() - V));
    for (int k = 0; k < kSteps; ++k) {
        f32->eval(&next, 1, df.data(), false);
        other->eval(&next, 1, dother.data(), false);
        r.token_by_token = std::max(r.token_by_token, rel_err(df, dother));
        next = static_cast<int>(std::max_element(df.begin(), df.end()) - df.begin());
    }
#else
    (void)family;
    (void)kv;
    throw Error("kv_long_prompt_against_f32 needs the CUDA backend");
#endif
    return r;
}

}  // namespace markbase::testing
