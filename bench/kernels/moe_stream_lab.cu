// Kernel lab for a batched step's experts (moe_stream.cu): the 26B-A4B's 128 experts (H 2816, Ie 704, top 8)
// for n tokens of uniform random routing, bf16 rows (inputs as bf16 halves), FP8 rows (e4m3 with a scale
// per row) and int4 rows (group scales; zero points for gate/up, symmetric down; the down rows end in half a
// group), the quantised rows' inputs one f16 of x / 16, each pass at every shape the product builds
// (MoeStreamShape: row tiles of 16 per block x chunks a warp loads per round); v1 is the product's rule
// (moe_stream_shape).
// Correctness gate: every output against an fp64 GPU reference of the same inputs and weights (the down pass
// from the gate/up pass's own h), as max |error| over max |reference|; a shape over 1e-4 (bf16) or 2e-3
// (quantised rows: f16 inputs) fails the run. Timing: 20 launches captured in a CUDA graph (the experts'
// rows, 0.25-1 GB a pass, are far past the 60 MB L2), per-launch time, median of 5 replays; GB/s = the
// touched experts' weight bytes / time.
//   markbase_moe_stream_lab [--quick]
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
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
    const ExpertWeights wt = make_weights(s);
    uint16_t *w_gu = wt.w_gu, *w_dn = wt.w_dn;
    uint8_t *q_gu = wt.q_gu, *q_dn = wt.q_dn;
    float *s_gu = wt.s_gu, *s_dn = wt.s_dn;

    const std::vector<int> counts = quick ? std::vector<int>{8, 96} : std::vector<int>{8, 32, 64, 96, 128};
    const int nmax = 128;
    float* x = dalloc<float>(int64_t{nmax} * kH);
    fill_f32<<<1024, 256, 0, s>>>(x, int64_t{nmax} * kH, 9);
    uint16_t *x_hi = dalloc<uint16_t>(int64_t{nmax} * kH), *x_lo = dalloc<uint16_t>(int64_t{nmax} * kH);
    uint16_t *h_hi = dalloc<uint16_t>(int64_t{nmax} * kK * kIe),
             *h_lo = dalloc<uint16_t>(int64_t{nmax} * kK * kIe);
    float* y = dalloc<float>(int64_t{nmax} * kK * kH);
    double* ref = dalloc<double>(int64_t{nmax} * kK * kH);
    int *d_off = dalloc<int>(kE + 1), *d_ent = dalloc<int>(nmax * kK), *d_exp = dalloc<int>(nmax * kK);

    // the shapes the product builds (moe_stream.cu): (2, 2), FP8's gate/up (2, 3) and down (4, 1); the
    // lab's first run also measured down (2, 3) and (1, 3) for both formats, (2, 3) gate/up for bf16 and
    // (4, 1) down for bf16 (which spills at 4 token tiles): each lost everywhere (moe-stream-lab.txt)
    const MoeStreamShape gu_shapes[2][2] = {{{2, 2}, {2, 2}}, {{2, 2}, {2, 3}}};
    const MoeStreamShape dn_shapes[2][2] = {{{2, 2}, {2, 2}}, {{2, 2}, {4, 1}}};
    int failures = 0;
    std::printf("%-6s %4s %-8s %-10s %9s %9s %10s\n", "rows", "n", "pass", "shape", "us", "GB/s", "max err");
    for (const int fmt : {0, 1, 2}) {  // bf16, FP8, int4
        const bool fp8 = fmt == 1, int4 = fmt == 2, quant = fmt > 0;
        const char* fname = int4 ? "int4" : fp8 ? "fp8" : "bf16";
        const double wbytes = int4 ? 0.5 : fp8 ? 1.0 : 2.0, bound = quant ? 2e-3 : 1e-4;
        ExpertRows rgu, rdn;
        if (fp8) {
            rgu.fp8.q = q_gu, rgu.fp8.scale = s_gu;
            rdn.fp8.q = q_dn, rdn.fp8.scale = s_dn;
        } else if (int4) {
            rgu.int4 = {wt.n_gu, wt.g_gu, wt.z_gu};
            rdn.int4 = {wt.n_dn, wt.g_dn, nullptr};
        } else {
            rgu.w = reinterpret_cast<const markbase::bf16*>(w_gu);
            rdn.w = reinterpret_cast<const markbase::bf16*>(w_dn);
        }
        const DevRows dgu = int4  ? DevRows{nullptr, wt.n_gu, wt.g_gu, true, wt.z_gu}
                            : fp8 ? DevRows{nullptr, q_gu, s_gu}
                                  : DevRows{w_gu, nullptr, s_gu};
        const DevRows ddn = int4  ? DevRows{nullptr, wt.n_dn, wt.g_dn, true, nullptr}
                            : fp8 ? DevRows{nullptr, q_dn, s_dn}
                                  : DevRows{w_dn, nullptr, s_dn};
        for (const int n : counts) {
            const int nK = n * kK;
            const Routing r = route(n, 100 + n);
            CK(cudaMemcpy(d_off, r.off.data(), sizeof(int) * r.off.size(), cudaMemcpyHostToDevice));
            CK(cudaMemcpy(d_ent, r.entries.data(), sizeof(int) * r.entries.size(), cudaMemcpyHostToDevice));
            CK(cudaMemcpy(d_exp, r.expert.data(), sizeof(int) * r.expert.size(), cudaMemcpyHostToDevice));
            if (quant)
                f16_rows(x, kH, kH, n, false, nullptr, 0.0f, x_hi, s);
            else
                split_rows(x, kH, kH, n, false, nullptr, 0.0f, reinterpret_cast<markbase::bf16*>(x_hi),
                           reinterpret_cast<markbase::bf16*>(x_lo), s);
            const double gu_gb = r.touched * 2.0 * kIe * kH * wbytes / 1e9,
                         dn_gb = r.touched * double(kH) * kIe * wbytes / 1e9;
            // gate/up: the reference once, then each shape (the last one run leaves h for the down pass)
            ref_gate_up<<<(nK * kIe + 255) / 256, 256, 0, s>>>(dgu, x_hi, x_lo, quant, d_exp, nK, ref);
            const std::vector<double> href = host(ref, int64_t{nK} * kIe);
            for (int v = 0; v <= (fp8 ? 2 : 1); ++v) {
                const MoeStreamShape sh = v == 0 ? MoeStreamShape{} : gu_shapes[fp8][v - 1];
                auto run = [&] {
                    moe_stream_gate_up(x_hi, x_lo, kH, kK, rgu, kIe, d_off, d_ent, kE, n, h_hi, h_lo, quant,
                                       s, sh);
                };
                run();
                CK(cudaStreamSynchronize(s));
                const double err = rel_err(h_values(h_hi, h_lo, quant, int64_t{nK} * kIe), href);
                const float ms = graph_ms(s, run);
                const MoeStreamShape used = v == 0 ? moe_stream_shape(false, fp8, n, kK, kE, kIe) : sh;
                std::printf("%-6s %4d %-8s %s(%d,%d) %9.2f %9.0f %10.2e%s\n", fname, n, "gate/up",
                            v == 0 ? "v1 " : "v2 ", used.mt, used.g, ms * 1e3, gu_gb / (ms * 1e-3), err,
                            err > bound ? "  FAIL" : "");
                failures += err > bound;
            }
            ref_down<<<(nK * kH + 255) / 256, 256, 0, s>>>(ddn, h_hi, h_lo, quant, d_exp, nK, ref);
            const std::vector<double> yref = host(ref, int64_t{nK} * kH);
            for (int v = 0; v <= (fp8 ? 2 : 1); ++v) {
                const MoeStreamShape sh = v == 0 ? MoeStreamShape{} : dn_shapes[fp8][v - 1];
                auto run = [&] {
                    moe_stream_down(h_hi, h_lo, kIe, rdn, kH, kK, d_off, d_ent, kE, n, y, s, sh);
                };
                run();
                CK(cudaStreamSynchronize(s));
                const double err = rel_err(host(y, int64_t{nK} * kH), yref);
                const float ms = graph_ms(s, run);
                const MoeStreamShape used = v == 0 ? moe_stream_shape(true, fp8, n, kK, kE, kH) : sh;
                std::printf("%-6s %4d %-8s %s(%d,%d) %9.2f %9.0f %10.2e%s\n", fname, n, "down",
                            v == 0 ? "v1 " : "v2 ", used.mt, used.g, ms * 1e3, dn_gb / (ms * 1e-3), err,
                            err > bound ? "  FAIL" : "");
                failures += err > bound;
            }
        }
    }
    std::printf("%s: %d shape(s) over the bound\n", failures ? "FAIL" : "ok", failures);
    return failures ? 1 : 0;
}
