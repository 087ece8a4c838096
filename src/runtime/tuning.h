// The engine's tuning: the few settings that measurements say differ by model or machine, the two that let
// tests force the fallbacks of product paths, and one timing experiment. Plain data with the product's
// defaults (the measured winners, docs/performance.md), built once by the CLI from `--tuning` (else
// $MARKBASE_TUNING) and handed down in BackendOptions. Everything else the backends once switched on is
// settled: the winner is the only code path (docs/cuda-backend.md has the measurements).
//
// The string form is a comma-separated list of key=value, e.g. "gemv=rows,attn_cluster=0"; parse_tuning
// names the key, the value and what it expected when a part is wrong.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace markbase {

struct Tuning {
    // Auto: the per-model default below; Off / On: forced (an A/B).
    enum class Choice : uint8_t { kAuto, kOff, kOn };

    // device_sampling=0|1: after the prompt, sampling selects the k best logits on the GPU and only those
    // cross the bus (one GPU and tensor parallel alike); 0 copies the whole row to the host sampler. The ids
    // are the same either way (tests/cuda/test_cuda_sampling.cpp).
    bool device_sampling = true;

    // gemv=auto|rows|async_geglu: the decode GeGLU (gate + up) GEMVs. rows = the warp-per-row kernel
    // (gemv_rows.cu), every other decode product runs it too; async_geglu = the GeGLU launches through the
    // cp.async ring. auto: async_geglu for the MoE model on one GPU (26B-A4B -3.5% per token, its dense
    // GeGLU runs beside the experts), rows for the dense models (+0.8..+3.6% with the ring) and sharded.
    enum class Gemv : uint8_t { kAuto, kRows, kAsyncGeglu };
    Gemv gemv = Gemv::kAuto;

    // attn_cluster=auto|0|1: below 256 keys the decode step replays a second graph whose attention pieces of
    // a head are one thread-block cluster, merged through distributed shared memory. auto: on for the dense
    // models on one GPU where clusters can be scheduled (E2B -2.3%, E4B -2.1%, 31B -1.0%), off for the
    // 26B-A4B (+1.6%). 1 where clusters cannot run is an error.
    Choice attn_cluster = Choice::kAuto;

    // tp_allreduce=p2p|nccl: with tensor parallelism, the decode step's sums. p2p (NVLink peer sums) is used
    // where every pair of GPUs has peer access, else NCCL.
    enum class AllReduce : uint8_t { kP2p, kNccl };
    AllReduce tp_allreduce = AllReduce::kP2p;

    // The staged weight loader (CUDA): load_threads=N reader threads (0: min(16, hardware threads), 24 GB/s
    // warm on the 16-core H200 host), load_chunk_mib=N (64), load_direct=0|1 (O_DIRECT reads).
    int load_threads = 0;
    int load_chunk_mib = 64;
    bool load_direct = false;

    // Tests, to reach the fallbacks of product paths with small models: attn_gemm_rows=N (>= 16) score rows
    // the prefill attention's scratch holds (0: every head of a chunk), so that heads and query rows run in
    // batches as on long contexts.
    int64_t attn_gemm_rows = 0;

    // cpu_pin=0|1: the CPU backend's pool threads bound one per CPU (cpu/thread_pool.h). Off by default: on
    // the shared 2-core VM, unbound, the pool's worker ran on its caller's CPU in 2000 of 2000 calls while
    // other work held the other CPU (bench/results/cpu-gemv-lab.txt), and bound the small matrices streamed
    // 2.4..3.8x faster; not yet measured on the 16-core host.
    bool cpu_pin = false;

    // batch_attn_keys=N (>= 16): keys per attention piece in a batched decode step (bench -np, serve). Pieces
    // of 32 keys instead of the prefill's 256 took the warp kernel's E2B at 8 sequences from 7.79 to 5.04 ms
    // per step, the 26B-A4B's from 14.02 to 11.42; with the tensor-core pieces 64 beat 32 at the serving
    // step's shape on every variant (E2B 96 sequences 7.24 -> 7.15 ms, E4B 11.23 -> 10.84, 26B-A4B 27.01 ->
    // 26.29, 31B 64 sequences 42.57 -> 40.74; docs/performance.md). A layer whose pieces would give it fewer
    // than 4 warps per SM takes pieces of at most 32 keys (cuda/prefill.cu).
    int batch_attn_keys = 64;
    // batch_attn_heads=R (0, 1, 2, 4 or 8): at most R query heads of a KV group per warp in a batched step's
    // attention pieces (cuda/kernels/attention_warp.cu); 0 = automatic: the most that still give the step 16
    // warps per SM. More heads read each K/V row once for more queries; fewer give more warps where a step
    // has few pieces (E2B: one KV head for 8 query heads).
    int batch_attn_heads = 0;
    // batch_attn=mma|warp: a batched step's attention pieces over a bf16 cache on the tensor cores where they
    // fit (cuda/kernels/attention_mma.cu: all of a KV group's query heads per warp, rounds of 16 keys through
    // mma.sync; at most 8 query heads per KV head, head dims 64..512), the CUDA-core warp kernel elsewhere
    // (attention_warp.cu: fp32 caches); warp = the warp kernel everywhere, which the tests compare against.
    // On the H200 the tensor cores took the serving step from 8.80 to 7.24 ms (E2B, 96 sequences), 12.26 to
    // 11.23 (E4B), 27.82 to 27.01 (26B-A4B) and 45.99 to 42.57 (31B, 64), both with 32-key pieces
    // (docs/performance.md).
    enum class BatchAttn : uint8_t { kMma, kWarp };
    BatchAttn batch_attn = BatchAttn::kMma;
    // decode_attn=auto|pieces|mma: the one-sequence decode graph's full-attention layers over a bf16 or fp8
    // cache (--kv-cache-dtype bf16|fp8; auto keeps one sequence on fp32). pieces: each query head's range in
    // up to ~2 waves of per-head pieces merged by the last (cuda/kernels/attention.cu), a KV group's rows
    // read once per query head on the CUDA cores; mma: the batched step's tensor-core pieces
    // (attention_mma.cu: a KV group's query heads together, fixed pieces of batch_attn_keys keys over the
    // whole context, then the wide merge) at every position past the short-range graph; auto, the default:
    // mma in a third graph for the long range (CudaModel::step_range: past max(4096, context / 8) keys),
    // pieces below. Measured on an H100 (docs/performance.md): E2B over a bf16 cache after 32,768 tokens
    // 4.50 ms on pieces, 2.79 on mma; after 4,096 mma 2.56 against the fp32 pieces' 2.56; after 1,024 mma
    // 2.58 against pieces' 2.47.
    enum class DecodeAttn : uint8_t { kAuto, kPieces, kMma };
    DecodeAttn decode_attn = DecodeAttn::kAuto;

    // stream_gemm=N (0..64): the projections of at most N tokens (batched decode steps, short prompt chunks)
    // run stream_gemm (cuda/kernels/stream_gemm.cu: each weight read once, on the tensor cores) where it pays
    // (stream_gemm_pays: over both halves up to 48 MB per matrix at 8 tokens; over the one bf16 operand the
    // single matrices up to 8 MB, tile_gemm taking the rest), instead of cuBLAS; 0 = none. 16 on the H200
    // (docs/performance.md: E2B at 8 sequences 5.03 -> 4.01 ms per step, the 26B-A4B 12.22 -> 10.95, the
    // 26B-Standard 5.41 -> 4.61; at 32 and 64 tokens it lost).
    int stream_gemm = 16;
    // tile_gemm=N (0..128): with gemm_inputs=bf16, the projections of up to N tokens (batched steps, short
    // prompt chunks) that stream_gemm does not take (it keeps single matrices up to 8 MB up to stream_gemm
    // tokens) run tile_gemm (cuda/kernels/tile_gemm.cu: tiles of 128 weight rows x every token through a
    // cp.async ring, q/k/v and gate/up in one launch each) where tile_gemm_pays says it beats cuBLAS: up to
    // 16 tokens nearly everywhere, past that launches of several matrices (docs/performance.md); 0 = never.
    int tile_gemm = 128;
    // batch_experts=N (0..1024): the MoE's experts in a batched step of at most N sequences run moe_stream
    // (cuda/kernels/moe_stream.cu: grouped on the device, each touched expert's rows streamed once, no host
    // in the loop, so the step is one graph); 0 = what prefill chunks take for every count (moe_gemm since
    // it replaced the compact cuBLAS pass; such steps run eagerly, not captured). 96 on the H200, measured
    // against the compact pass (bench/results/cuda-batched-moe-stream.json, 26B-A4B after 128 tokens): 8
    // sequences -10.8%, 16 -9.5%, 32 -4.9%, 64 -1.2%, 128 +8.4% (its MMAs over 4 token tiles issue-bound); a
    // server's ~98-row steps measured even. Against moe_gemm the crossover is not yet measured.
    // FP8 experts (half the bytes) take moe_stream up to at least 128 (cuda/batch.cu kFp8BatchExperts).
    int batch_experts = 96;
    // moe_gemm=0|1: a prefill chunk's experts (and a batched step's past batch_experts) run moe_gemm
    // (cuda/kernels/moe_gemm.cu: grouped on the device, tensor-core tiles of 128 weight rows x 32 of an
    // expert's entries, FP8 rows where the model has them); 0 = the grouped GEMV kernels that widths it does
    // not tile take (the tests' reference at real widths). On the H200 it replaced the compact cuBLAS pass
    // (planned on the host after a sync per layer): 26B-A4B prefill of 512 14.5k -> 16.2k tok/s with bf16
    // experts, 14.6k -> 18.9k with FP8; `serve` c100 with FP8 weights 3,621 -> 3,981 tok/s.
    bool moe_gemm = true;
    // gemm_inputs=bf16|halves: what the products of prompt chunks and batched steps (cuBLAS, stream_gemm,
    // tile_gemm) take of their fp32 inputs. bf16, the default: the input rounded to bf16 once, as
    // transformers in bf16, vLLM, SGLang and llama.cpp's GPU path compute; halves: both bf16 halves (hi + lo,
    // within ~1e-6 of the fp32 decode path, twice the tensor-core work), the exact products the CUDA tests
    // hold to the CPU. On the H200 (docs/performance.md) bf16 took prefill of 512 from 35.7k to 52.5k tok/s
    // (E2B), 4.28k to 7.20k (31B), 19.0k to 21.8k (26B-A4B, FP8 experts) and the serving step from 6.82
    // to 5.33 ms (E2B, 96 sequences), 36.2 to 31.6 (31B, 64); the bundled model's held-out perplexity 44.5637
    // -> 44.5660. The one-sequence decode's GEMVs keep fp32 inputs either way; stream_gemm and tile_gemm take
    // what this says. The CPU backend's prompt products (cpu/matmul.h PromptProducts) follow the same key:
    // bf16 rounds x once and multiplies by vdpbf16ps where the CPU's bf16 dot product outruns its fp32 FMA
    // (Zen 4 and 5; not Sapphire Rapids, where it runs at half the FMA's flops: exact fp32 there and
    // elsewhere), halves keeps the exact fp32 products the goldens hold.
    enum class GemmInputs : uint8_t { kBf16, kHalves };
    GemmInputs gemm_inputs = GemmInputs::kBf16;

    // skip=name+name: a timing experiment, never for output. Those decode launches (the profile's names: qkv,
    // route_topk, ffn_combine, ...) are left out of every step, so the graph step with and without a kernel
    // gives its true cost inside the graph. Every output is wrong; the model says so on stderr.
    std::vector<std::string> skip;
};

// Parses "key=value[,key=value...]" onto the defaults; "" is the defaults. `source` names where the string
// came from in errors ("--tuning", "MARKBASE_TUNING").
Tuning parse_tuning(std::string_view spec, std::string_view source = "--tuning");

// The settings that differ from the defaults, in parse_tuning's form ("" when none): for bench receipts.
std::string tuning_string(const Tuning& t);

}  // namespace markbase
