// The element type of the KV cache (--kv-cache-dtype). bf16 is the checkpoints' own dtype, and the cache's
// in transformers, vLLM and SGLang: half fp32's bytes (twice the sequences or context in the same memory,
// half the bytes a batched step's attention reads: the 26B-A4B's 64 sequences after 896 tokens 27.2 -> 24.7
// ms per step on the H200). auto, the default: bf16 where sequences decode together on the GPU (serve,
// bench -np), fp32 for one sequence, whose decode kernel still reads fp32 faster than bf16 (with bf16 E2B
// +3% per token after 128 tokens, +6% after 8192, the 26B-A4B +13% after 8192; the 31B -2% after 128:
// docs/performance.md), and fp32 on the CPU, whose engine is the exact reference. f32 keeps the GPU's cache
// exact: its logits match transformers' fp32 ones to 1e-4.
//
// fp8 (e4m3, vLLM's --kv-cache-dtype fp8): a quarter of fp32's bytes, with no scale. Gemma 4's keys and
// values are RMS-normalised per head before the cache (GEMMA4.md: k_norm with its weight, the weightless
// v_norm), so their magnitudes sit near 1, inside e4m3's normal range (2^-6 .. 448); each is rounded to
// nearest even and saturated at +-448 as written, which is what vLLM does with its default scale of 1.0.
//
// The CPU rounds every key and value as the GPU's cache holds them where bf16 or fp8 is asked for (the
// storage stays fp32): the reference the GPU's caches are tested against (tests/cuda/test_cuda_kv_bf16.cpp,
// test_cuda_kv_fp8.cpp).
#pragma once

#include <string>

#include "model/error.h"

namespace markbase {

enum class KvDtype { kAuto, kBf16, kF32, kFp8 };

// On the GPU, for a model with `slots` sequence caches: auto is bf16 with more than one, fp32 for one.
inline KvDtype gpu_kv_dtype(KvDtype t, int slots) {
    if (t == KvDtype::kAuto) return slots > 1 ? KvDtype::kBf16 : KvDtype::kF32;
    return t;
}
inline int gpu_kv_bytes(KvDtype t, int slots) {
    switch (gpu_kv_dtype(t, slots)) {
        case KvDtype::kFp8:
            return 1;
        case KvDtype::kBf16:
            return 2;
        default:
            return 4;
    }
}
inline const char* gpu_kv_name(KvDtype t, int slots) {
    switch (gpu_kv_dtype(t, slots)) {
        case KvDtype::kFp8:
            return "fp8";
        case KvDtype::kBf16:
            return "bf16";
        default:
            return "f32";
    }
}
// On the CPU: values rounded only when asked for (auto is fp32, the exact reference)
inline KvDtype cpu_kv_dtype(KvDtype t) {
    return t == KvDtype::kAuto ? KvDtype::kF32 : t;
}
// auto, bf16, f32 (or fp32) and fp8 (or fp8_e4m3); anything else names the flag and what it expected.
inline KvDtype parse_kv_dtype(const std::string& s, const std::string& flag) {
    if (s == "auto") return KvDtype::kAuto;
    if (s == "bf16") return KvDtype::kBf16;
    if (s == "f32" || s == "fp32") return KvDtype::kF32;
    if (s == "fp8" || s == "fp8_e4m3") return KvDtype::kFp8;
    throw Error(flag + ": unknown KV cache type '" + s + "' (expected auto, bf16, f32 or fp8)");
}

}  // namespace markbase
