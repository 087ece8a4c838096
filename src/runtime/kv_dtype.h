// The element type of the KV cache (--kv-cache-dtype). auto, the default: bf16 on the GPU, as the
// checkpoints' own dtype is in transformers, vLLM and SGLang (half fp32's bytes: twice the sequences or
// context in the same memory, half the bytes every decode step's attention reads), and fp32 on the CPU,
// whose engine is the exact reference. f32 keeps the GPU's cache exact: its logits then match transformers'
// fp32 ones to 1e-4. bf16 on the CPU rounds every key and value to bf16 as the GPU's cache does (the
// storage stays fp32): the reference the GPU's bf16 cache is tested against
// (tests/cuda/test_cuda_kv_bf16.cpp).
#pragma once

#include <string>

#include "model/error.h"

namespace markbase {

enum class KvDtype { kAuto, kBf16, kF32 };

// On the GPU: auto is bf16
inline bool gpu_kv_bf16(KvDtype t) {
    return t != KvDtype::kF32;
}
inline int gpu_kv_bytes(KvDtype t) {
    return gpu_kv_bf16(t) ? 2 : 4;
}
inline const char* gpu_kv_name(KvDtype t) {
    return gpu_kv_bf16(t) ? "bf16" : "f32";
}
// auto, bf16 and f32 (or fp32); anything else names the flag and what it expected.
inline KvDtype parse_kv_dtype(const std::string& s, const std::string& flag) {
    if (s == "auto") return KvDtype::kAuto;
    if (s == "bf16") return KvDtype::kBf16;
    if (s == "f32" || s == "fp32") return KvDtype::kF32;
    throw Error(flag + ": unknown KV cache type '" + s + "' (expected auto, bf16 or f32)");
}

}  // namespace markbase
