// Kernel lab for a prompt chunk's experts (moe_gemm.cu): the 26B-A4B's 128 experts (H 2816, Ie 704, top 8)
// over chunks of 128 to 2,048 tokens (2,048: four 512-token prompts in one pass), uniform routing and a
// skewed one (expert e drawn with weight 1 / (e + 1)^0.8, as a random-weight router concentrates its
// choices), bf16 rows (inputs as bf16 halves) and FP8 rows (e4m3 with a scale per row, inputs one f16 of
// x / 16). v1 is the product (moe_gemm_experts: both passes, the inputs' conversion included).
// Correctness gate (chunks up to 512 tokens; the larger ones run the same tiles, more of them): every output
// of both passes against an fp64 GPU reference of the same inputs and weights (the down pass from the gate/up
// pass's own h), as max |error| over max |reference|; over 1e-4 (bf16) or 2e-3 (FP8) fails the run. Timing:
// 10 calls captured in a CUDA graph, per-call time, median of 5 replays; GB/s = the touched experts' weight
// bytes / time; TFLOP/s = the entries' multiply-adds x 2 / time (bf16 counts both halves' products).
//   markbase_moe_gemm_lab [--quick]
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "cuda/kernels/kernels.h"
#include "lab_common.cuh"
#include "moe_lab_common.cuh"

using namespace markbase::cuda;
using namespace moe_lab;

int main(int argc, char** argv) {
    const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    moe_gemm_prepare();
    const ExpertWeights wt = make_weights(s);
    uint16_t *w_gu = wt.w_gu, *w_dn = wt.w_dn;
    uint8_t *q_gu = wt.q_gu, *q_dn = wt.q_dn;
    float *s_gu = wt.s_gu, *s_dn = wt.s_dn;

    const std::vector<int> counts =
        quick ? std::vector<int>{512} : std::vector<int>{128, 256, 512, 1024, 2048};
    const int nmax = 2048, nK_max = nmax * kK;
    float* x = dalloc<float>(int64_t{nmax} * kH);
    fill_f32<<<1024, 256, 0, s>>>(x, int64_t{nmax} * kH, 9);
    uint16_t* x_rows = dalloc<uint16_t>(2 * int64_t{nmax} * kH);
    uint16_t* h = dalloc<uint16_t>(2 * int64_t{nK_max} * kIe);
    uint16_t* h_entry = dalloc<uint16_t>(2 * int64_t{nK_max} * kIe);  // h in entry order, for ref_down
    float* y = dalloc<float>(int64_t{nK_max} * kH);
    double* ref = dalloc<double>(int64_t{nK_max} * kH);
    int *d_off = dalloc<int>(kE + 1), *d_ent = dalloc<int>(nK_max), *d_exp = dalloc<int>(nK_max);
    std::vector<int> held(kE);
    for (int e = 0; e < kE; ++e) held[e] = e;
    int* d_gexp = dalloc<int>(kE);
    CK(cudaMemcpy(d_gexp, held.data(), sizeof(int) * kE, cudaMemcpyHostToDevice));

    int failures = 0;
    std::printf("%-5s %5s %-8s %8s %6s %9s %8s %8s %10s %10s\n", "rows", "n", "routing", "busiest", "touch",
                "us", "GB/s", "TFLOP/s", "err gu", "err down");
    for (const bool fp8 : {false, true}) {
        const double wbytes = fp8 ? 1.0 : 2.0, bound = fp8 ? 2e-3 : 1e-4;
        ExpertRows rgu, rdn;
        rgu.w = reinterpret_cast<const markbase::bf16*>(w_gu);
        rdn.w = reinterpret_cast<const markbase::bf16*>(w_dn);
        if (fp8) rgu.fp8.q = q_gu, rgu.fp8.scale = s_gu, rdn.fp8.q = q_dn, rdn.fp8.scale = s_dn;
        const DevRows dgu{fp8 ? nullptr : w_gu, fp8 ? q_gu : nullptr, s_gu},
            ddn{fp8 ? nullptr : w_dn, fp8 ? q_dn : nullptr, s_dn};
        for (const int n : counts)
            for (const double skew : {0.0, 0.8}) {
                const int nK = n * kK;
                const Routing r = route(n, 100 + n, skew);
                int busiest = 0;
                for (int e = 0; e < kE; ++e) busiest = std::max(busiest, r.off[e + 1] - r.off[e]);
                CK(cudaMemcpy(d_off, r.off.data(), sizeof(int) * r.off.size(), cudaMemcpyHostToDevice));
                CK(cudaMemcpy(d_ent, r.entries.data(), sizeof(int) * r.entries.size(),
                              cudaMemcpyHostToDevice));
                CK(cudaMemcpy(d_exp, r.expert.data(), sizeof(int) * r.expert.size(), cudaMemcpyHostToDevice));
                auto run = [&] {
                    moe_gemm_experts(x, kH, kK, n, rgu, rdn, kIe, d_gexp, d_off, d_ent, kE,
                                     reinterpret_cast<markbase::bf16*>(x_rows),
                                     reinterpret_cast<markbase::bf16*>(h), y, s);
                };
                run();
                CK(cudaStreamSynchronize(s));
                double err_gu = -1, err_dn = -1;  // (not checked past 512 tokens)
                if (n <= 512) {
                    // h back in entry order (the kernel writes it in group order), both halves
                    const int64_t nh = int64_t{nK} * kIe;
                    const std::vector<uint16_t> hg = host(h, fp8 ? nh : 2 * nh);
                    std::vector<uint16_t> he(hg.size());
                    for (int j = 0; j < nK; ++j)
                        for (int half = 0; half < (fp8 ? 1 : 2); ++half)
                            std::memcpy(&he[half * nh + int64_t{r.entries[j]} * kIe],
                                        &hg[half * nh + int64_t{j} * kIe], kIe * sizeof(uint16_t));
                    CK(cudaMemcpy(h_entry, he.data(), he.size() * sizeof(uint16_t), cudaMemcpyHostToDevice));
                    const uint16_t* xl = x_rows + int64_t{n} * kH;
                    ref_gate_up<<<(nK * kIe + 255) / 256, 256, 0, s>>>(dgu, x_rows, xl, fp8, d_exp, nK, ref);
                    err_gu = rel_err(h_values(h_entry, h_entry + nh, fp8, nh), host(ref, nh));
                    ref_down<<<(nK * kH + 255) / 256, 256, 0, s>>>(ddn, h_entry, h_entry + nh, fp8, d_exp, nK,
                                                                   ref);
                    err_dn = rel_err(host(y, int64_t{nK} * kH), host(ref, int64_t{nK} * kH));
                }
                const float ms = graph_ms(s, run, 10);
                const double gb = r.touched * 3.0 * kIe * kH * wbytes / 1e9;
                const double tflop = nK * 3.0 * kIe * kH * 2.0 * (fp8 ? 1 : 2) / 1e12;
                const bool bad = err_gu > bound || err_dn > bound;
                char errs[32] = "   unchecked";
                if (err_gu >= 0) std::snprintf(errs, sizeof errs, "%10.2e %10.2e", err_gu, err_dn);
                std::printf("%-5s %5d %-8s %8d %6d %9.1f %8.0f %8.1f %s%s\n", fp8 ? "fp8" : "bf16", n,
                            skew > 0 ? "skewed" : "uniform", busiest, r.touched, ms * 1e3, gb / (ms * 1e-3),
                            tflop / (ms * 1e-3), errs, bad ? "  FAIL" : "");
                failures += bad;
            }
    }
    std::printf("%s: %d case(s) over the bound\n", failures ? "FAIL" : "ok", failures);
    return failures ? 1 : 0;
}
