// What the MoE kernel labs (moe_stream_lab.cu, moe_gemm_lab.cu) share: the 26B-A4B's expert shapes, random
// weights and inputs drawn on the device, fp64 GPU references of the gate/up and down products, routings,
// and graph timing.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "lab_common.cuh"

namespace moe_lab {

constexpr int kH = 2816, kIe = 704, kE = 128, kK = 8;

__global__ void fill_bf16(uint16_t* p, int64_t n, uint64_t seed, float scale) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
         i += int64_t{gridDim.x} * blockDim.x)
        p[i] = static_cast<uint16_t>(__float_as_uint(lab::uniform_pm1(seed, i) * scale) >> 16);
}
__global__ void fill_fp8(uint8_t* p, int64_t n, uint64_t seed) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
         i += int64_t{gridDim.x} * blockDim.x)
        p[i] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(
            448.0f * lab::uniform_pm1(seed, i) * lab::uniform_pm1(seed + 1, i), __NV_SATFINITE, __NV_E4M3));
}
// scales of 0.5 to 1 units (FP8 codes to 448: weights to ~0.1; int4 (nibble - zero) to 15: unit 0.1 / 15)
__global__ void fill_scale(float* p, int64_t n, uint64_t seed, float unit = 0.1f / 448.0f) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
         i += int64_t{gridDim.x} * blockDim.x)
        p[i] = (0.75f + 0.25f * lab::uniform_pm1(seed, i)) * unit;
}
__global__ void fill_f32(float* p, int64_t n, uint64_t seed) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
         i += int64_t{gridDim.x} * blockDim.x)
        p[i] = lab::uniform_pm1(seed, i);
}

// The rows as the kernels read them: bf16 w, e4m3 q times the row's scale, or (int4) q's nibbles less the
// group's zero point (zero, or the symmetric 8) times the group's scale (a group of 128 along K)
struct DevRows {
    const uint16_t* w;
    const uint8_t* q;
    const float* scale;
    bool int4 = false;
    const uint8_t* zero = nullptr;
    __device__ double at(int64_t row, int K, int k) const {
        if (!q) return __uint_as_float(static_cast<uint32_t>(w[row * K + k]) << 16);
        if (int4) {
            const int64_t g = row * ((K + 127) / 128) + k / 128;
            const int n = (q[(row * K + k) / 2] >> (4 * (k & 1))) & 15, z = zero ? zero[g] : 8;
            return double(n - z) * scale[g];
        }
        const __half_raw h = __nv_cvt_fp8_to_halfraw(q[row * K + k], __NV_E4M3);
        return double(__half2float(__half(h))) * scale[row];
    }
};
// An input as the kernels read it: bf16 hi + lo ([rows][K] each), or 16 x one f16
__device__ double input_at(const uint16_t* hi, const uint16_t* lo, bool f16, int64_t i) {
    if (f16) return 16.0 * double(__half2float(__ushort_as_half(hi[i])));
    return double(__uint_as_float(static_cast<uint32_t>(hi[i]) << 16)) +
           double(__uint_as_float(static_cast<uint32_t>(lo[i]) << 16));
}

// h_ref[entry][j] = gelu(gate_j . x) * (up_j . x), x = token entry / K's input; expert of each entry given
__global__ void ref_gate_up(DevRows w, const uint16_t* hi, const uint16_t* lo, bool f16, const int* expert,
                            int nK, double* h) {
    const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
    if (i >= int64_t{nK} * kIe) return;
    const int entry = static_cast<int>(i / kIe), j = static_cast<int>(i % kIe), e = expert[entry];
    const int64_t xrow = int64_t{entry / kK} * kH, g = int64_t{e} * 2 * kIe + j, u = g + kIe;
    double a = 0, b = 0;
    for (int k = 0; k < kH; ++k) {
        const double x = input_at(hi, lo, f16, xrow + k);
        a += w.at(g, kH, k) * x;
        b += w.at(u, kH, k) * x;
    }
    h[i] = 0.5 * a * (1.0 + tanh(0.7978845608028654 * (a + 0.044715 * a * a * a))) * b;
}
// y_ref[entry][r] = down_r . h[entry], h as the gate/up pass wrote it
__global__ void ref_down(DevRows w, const uint16_t* hi, const uint16_t* lo, bool f16, const int* expert,
                         int nK, double* y) {
    const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
    if (i >= int64_t{nK} * kH) return;
    const int entry = static_cast<int>(i / kH), r = static_cast<int>(i % kH);
    const int64_t row = int64_t{expert[entry]} * kH + r;
    double acc = 0;
    for (int k = 0; k < kIe; ++k) acc += w.at(row, kIe, k) * input_at(hi, lo, f16, int64_t{entry} * kIe + k);
    y[i] = acc;
}

template <class T>
T* dalloc(int64_t n) {
    T* p = nullptr;
    CK(cudaMalloc(&p, sizeof(T) * static_cast<size_t>(n)));
    return p;
}
template <class T>
std::vector<T> host(const T* d, int64_t n) {
    std::vector<T> v(static_cast<size_t>(n));
    CK(cudaMemcpy(v.data(), d, sizeof(T) * v.size(), cudaMemcpyDeviceToHost));
    return v;
}

// Uniform routing: each token's K distinct experts; the entries grouped by expert (moe_bucket's layout)
struct Routing {
    std::vector<int> off, entries, expert;  // [E + 1], [n K] grouped, [n K] by entry
    int touched = 0;
};
// skew > 0: expert e drawn with weight 1 / (e + 1)^skew (distinct per token), as a random-weight model's
// router concentrates its choices (the 26B-A4B's busiest expert held ~500 of a 512-token chunk's 4,096)
Routing route(int n, uint32_t seed, double skew = 0.0) {
    std::mt19937 rng(seed);
    Routing r;
    r.expert.resize(static_cast<size_t>(n) * kK);
    std::vector<std::vector<int>> by(kE);
    std::vector<double> weight(kE);
    for (int e = 0; e < kE; ++e) weight[e] = std::pow(e + 1.0, -skew);
    for (int t = 0; t < n; ++t) {
        std::vector<int> all(kE);
        for (int e = 0; e < kE; ++e) all[e] = e;
        for (int k = 0; k < kK; ++k) {
            if (skew > 0) {  // a weighted draw among the experts not yet chosen
                double sum = 0;
                for (int i = k; i < kE; ++i) sum += weight[all[i]];
                double u = std::uniform_real_distribution<double>(0.0, sum)(rng);
                int pick = k;
                for (int i = k; i < kE; ++i) {
                    u -= weight[all[i]];
                    pick = i;
                    if (u <= 0) break;
                }
                std::swap(all[k], all[pick]);
            } else {
                std::swap(all[k], all[k + rng() % (kE - k)]);
            }
            r.expert[t * kK + k] = all[k];
            by[all[k]].push_back(t * kK + k);
        }
    }
    r.off.push_back(0);
    for (int e = 0; e < kE; ++e) {
        r.entries.insert(r.entries.end(), by[e].begin(), by[e].end());
        r.off.push_back(static_cast<int>(r.entries.size()));
        r.touched += !by[e].empty();
    }
    return r;
}

double rel_err(const std::vector<float>& got, const std::vector<double>& ref) {
    double e = 0, m = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        e = std::max(e, std::fabs(double(got[i]) - ref[i]));
        m = std::max(m, std::fabs(ref[i]));
    }
    return e / (m > 0 ? m : 1);
}
// decode the kernel's h: bf16 halves or 16 x f16
std::vector<float> h_values(const uint16_t* d_hi, const uint16_t* d_lo, bool f16, int64_t count) {
    const std::vector<uint16_t> hi = host(d_hi, count), lo = f16 ? hi : host(d_lo, count);
    std::vector<float> v(hi.size());
    for (size_t i = 0; i < v.size(); ++i) {
        uint32_t b;
        if (f16) {
            const int e = (hi[i] >> 10) & 31, m = hi[i] & 1023;
            const double x = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
            v[i] = static_cast<float>(16.0 * ((hi[i] & 0x8000) ? -x : x));
            continue;
        }
        b = static_cast<uint32_t>(hi[i]) << 16;
        float a;
        std::memcpy(&a, &b, 4);
        b = static_cast<uint32_t>(lo[i]) << 16;
        float c;
        std::memcpy(&c, &b, 4);
        v[i] = a + c;
    }
    return v;
}

// Per-launch ms of `launch`, `launches` of them in one graph, median of 5 replays.
template <class F>
float graph_ms(cudaStream_t s, F&& launch, int launches = 20) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < launches; ++i) launch();
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    const float ms = lab::time_ms(5, s, [&] { CK(cudaGraphLaunch(ge, s)); });
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return ms / launches;
}

// The 128 experts' gate/up [E][2 Ie][H] and down [E][H][Ie] rows, bf16, e4m3 with their row scales, and
// int4 (random bytes of nibbles, group scales of ~0.01, zero points for gate/up, symmetric down), drawn on
// the device (fixed seeds).
struct ExpertWeights {
    uint16_t *w_gu = nullptr, *w_dn = nullptr;
    uint8_t *q_gu = nullptr, *q_dn = nullptr;
    float *s_gu = nullptr, *s_dn = nullptr;
    uint8_t *n_gu = nullptr, *n_dn = nullptr, *z_gu = nullptr;
    float *g_gu = nullptr, *g_dn = nullptr;
};
__global__ void fill_bytes(uint8_t* p, int64_t n, uint64_t seed, int mod) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
         i += int64_t{gridDim.x} * blockDim.x)
        p[i] = static_cast<uint8_t>(static_cast<int>((lab::uniform_pm1(seed, i) + 1.0f) * 0.5f * mod) % mod);
}
ExpertWeights make_weights(cudaStream_t s) {
    const int64_t gu = int64_t{kE} * 2 * kIe * kH, dn = int64_t{kE} * kH * kIe;
    ExpertWeights w;
    w.w_gu = dalloc<uint16_t>(gu), w.w_dn = dalloc<uint16_t>(dn);
    w.q_gu = dalloc<uint8_t>(gu), w.q_dn = dalloc<uint8_t>(dn);
    w.s_gu = dalloc<float>(int64_t{kE} * 2 * kIe), w.s_dn = dalloc<float>(int64_t{kE} * kH);
    fill_bf16<<<4096, 256, 0, s>>>(w.w_gu, gu, 1, 0.05f);
    fill_bf16<<<4096, 256, 0, s>>>(w.w_dn, dn, 2, 0.05f);
    fill_fp8<<<4096, 256, 0, s>>>(w.q_gu, gu, 3);
    fill_fp8<<<4096, 256, 0, s>>>(w.q_dn, dn, 5);
    fill_scale<<<256, 256, 0, s>>>(w.s_gu, int64_t{kE} * 2 * kIe, 7);
    fill_scale<<<256, 256, 0, s>>>(w.s_dn, int64_t{kE} * kH, 8);
    const int64_t ggu = int64_t{kE} * 2 * kIe * ((kH + 127) / 128),
                  gdn = int64_t{kE} * kH * ((kIe + 127) / 128);
    w.n_gu = dalloc<uint8_t>(gu / 2), w.n_dn = dalloc<uint8_t>(dn / 2), w.z_gu = dalloc<uint8_t>(ggu);
    w.g_gu = dalloc<float>(ggu), w.g_dn = dalloc<float>(gdn);
    fill_bytes<<<4096, 256, 0, s>>>(w.n_gu, gu / 2, 11, 256);
    fill_bytes<<<4096, 256, 0, s>>>(w.n_dn, dn / 2, 12, 256);
    fill_bytes<<<256, 256, 0, s>>>(w.z_gu, ggu, 13, 16);
    fill_scale<<<256, 256, 0, s>>>(w.g_gu, ggu, 14, 0.1f / 15.0f);
    fill_scale<<<256, 256, 0, s>>>(w.g_dn, gdn, 15, 0.1f / 15.0f);
    CK(cudaGetLastError());
    return w;
}

}  // namespace moe_lab
