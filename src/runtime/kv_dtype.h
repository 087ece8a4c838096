// The element type of the GPU's KV cache (--kv-cache-dtype). bf16 is the default, as the checkpoints' own
// dtype is in transformers, vLLM and SGLang: it halves the cache's bytes (twice the sequences or context in
// the same memory) and the bytes every decode step's attention reads. f32 keeps the cache exact: the
// products then match transformers' fp32 logits to 1e-4 (tests/cuda/test_cuda_golden.cpp measures both).
// The CPU backend's cache is always fp32.
#pragma once

#include <string>

#include "model/error.h"

namespace markbase {

enum class KvDtype { kBf16, kF32 };

inline int kv_dtype_bytes(KvDtype t) {
    return t == KvDtype::kF32 ? 4 : 2;
}
inline const char* kv_dtype_name(KvDtype t) {
    return t == KvDtype::kF32 ? "f32" : "bf16";
}
// "bf16" (or "auto") and "f32" (or "fp32"); anything else names the flag and what it expected.
inline KvDtype parse_kv_dtype(const std::string& s, const std::string& flag) {
    if (s == "bf16" || s == "auto") return KvDtype::kBf16;
    if (s == "f32" || s == "fp32") return KvDtype::kF32;
    throw Error(flag + ": unknown KV cache type '" + s + "' (expected bf16 or f32)");
}

}  // namespace markbase
