// What the GPU's bf16 and fp8 KV caches are held to over a long prompt (tests/cuda/test_cuda_kv_bf16.cpp,
// test_cuda_kv_fp8.cpp): a random checkpoint of a family, a prompt of 2,300 ids in chunks of 1,024 (the last
// chunk's full layers see up to 2,300 keys, past the softmax that keeps its row in registers; the sliding
// rings wrap many times), then 8 tokens one at a time fed the fp32 cache's greedy ids, each backend with the
// cache type given against the fp32 cache's.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/kv_dtype.h"

namespace markbase::testing {

struct KvLongPrompt {
    double batched = 0;                 // rel_err of the last chunk's every row of logits
    double token_by_token = 0;          // the largest rel_err of the 8 one-token steps
    uint64_t bytes = 0, f32_bytes = 0;  // the two caches' cache_bytes()
    bool moe = false;  // the family routes experts (its router turns differences into others)
};

// Needs a CUDA device (the caller's REQUIRE_CUDA); seed 31, prompt seed 17.
KvLongPrompt kv_long_prompt_against_f32(const std::string& family, KvDtype kv);

}  // namespace markbase::testing
