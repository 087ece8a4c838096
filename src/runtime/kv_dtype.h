// The element type of the KV cache (--kv-cache-dtype). bf16 is the checkpoints' own dtype, and the cache's
// in transformers, vLLM and SGLang: half fp32's bytes (twice the sequences or context in the same memory,
// half the bytes a batched step's attention reads: the 26B-A4B's 64 sequences after 896 tokens 27.2 -> 24.7
// ms per step on the H200). auto, the default: bf16 where sequences decode together on the GPU (serve,
// bench -np), fp32 for one sequence, whose decode kernel still reads fp32 faster than bf16 (with bf16 E2B
// +3% per token after 128 tokens, +6% after 8192, the 26B-A4B +13% after 8192; the 31B -2% after 128:
// docs/performance.md), and fp32 on the CPU, whose engine is the exact reference. f32 keeps the GPU's cache
// exact: its logits match transformers' fp32 ones to 1e-4. bf16 on the CPU rounds every key and value to bf16
// as the GPU's cache does (the storage stays fp32): the reference the GPU's bf16 cache is tested against
// (tests/cuda/test_cuda_kv_bf16.cpp).
#pragma once

#include <string>

#include "model/error.h"

namespace markbase {

enum class KvDtype { kAuto, kBf16, kF32 };

// On the GPU, for a model with `slots` sequence caches: auto is bf16 with more than one
inline bool gpu_kv_bf16(KvDtype t, int slots) {
    return t == KvDtype::kBf16 || (t == KvDtype::kAuto && slots > 1);
}
inline int gpu_kv_bytes(KvDtype t, int slots) {
    return gpu_kv_bf16(t, slots) ? 2 : 4;
}
inline const char* gpu_kv_name(KvDtype t, int slots) {
    return gpu_kv_bf16(t, slots) ? "bf16" : "f32";
}
// On the CPU: values rounded to bf16 only when asked for (auto is fp32, the exact reference)
inline bool cpu_kv_bf16(KvDtype t) {
    return t == KvDtype::kBf16;
}
// auto, bf16 and f32 (or fp32); anything else names the flag and what it expected.
inline KvDtype parse_kv_dtype(const std::string& s, const std::string& flag) {
    if (s == "auto") return KvDtype::kAuto;
    if (s == "bf16") return KvDtype::kBf16;
    if (s == "f32" || s == "fp32") return KvDtype::kF32;
    throw Error(flag + ": unknown KV cache type '" + s + "' (expected auto, bf16 or f32)");
}

}  // namespace markbase
