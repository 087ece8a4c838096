// The Gemma 4 text decoder on the CPU: the exact reference backend. fp32 activations, bf16 weights read in
// place from the mapped checkpoint, work spread over a thread pool. forward.cpp holds the model's math in one
// place, readable against ../shared/GEMMA4.md section 2; attention.cpp and moe.cpp hold the two larger
// blocks.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu/kv_cache.h"
#include "cpu/thread_pool.h"
#include "loading/checkpoint.h"

namespace markbase::cpu {

class CpuModel {
  public:
    // max_chunk: the most tokens one forward() may take (prompts are fed in chunks of this size).
    CpuModel(const Checkpoint& ck, ThreadPool& pool, int max_chunk = 256);

    const ModelConfig& config() const { return c_; }
    int max_chunk() const { return max_chunk_; }

    // Runs n (<= max_chunk) tokens at positions cache.n_past ... and appends them to the cache.
    // logits: [n][V] when all_logits, else [V] for the last token only (nullptr: none computed).
    void forward(const int* ids, int n, KvCache& cache, float* logits, bool all_logits);

    // MoE: the smallest gap between the K-th and (K+1)-th router logit (= their log-probability gap),
    // relative to that token's largest |router logit|, over every token routed since the last
    // reset_router_margin(); infinity before any. A comparison with another backend reads it to know whether
    // rounding could have flipped an expert choice.
    float router_margin() const { return router_margin_; }
    void reset_router_margin() { router_margin_ = INFINITY; }

  private:
    struct Scratch;
    void embed(const int* ids, int n);
    void per_layer_inputs(const int* ids, int n);
    void layer(int i, int n, int64_t pos0, KvCache& cache);
    void attention(int i, int n, int64_t pos0, KvCache& cache);  // attention.cpp: a_ -> attn_
    void moe(int i, int n);                                      // moe.cpp: x_ -> moe_out_
    void mlp(const LayerWeights& w, int I, const float* in, int n, float* out);

    const ModelConfig& c_;
    const Weights& w_;
    ThreadPool& pool_;
    int max_chunk_;
    float router_margin_ = INFINITY;
    std::vector<float> rope_inv_freq_sliding_, rope_inv_freq_full_;  // [d/2] each; 0 = pair not rotated

    // activations for one chunk, [n][width] row-major
    std::vector<float> x_;                 // residual stream [n][H]
    std::vector<float> a_;                 // normed input / scratch [n][H]
    std::vector<float> q_, k_, v_;         // [n][nH*d], [n][nKV*d], [n][nKV*d]
    std::vector<float> attn_;              // attention heads concatenated [n][nH*d]
    std::vector<float> o_;                 // projections back to H [n][H]
    std::vector<float> gate_, up_;         // MLP [n][I]
    std::vector<float> m_;                 // MLP / FFN output [n][H]
    std::vector<float> ple_;               // per-layer inputs [n][L][P]
    std::vector<float> ple_tmp_;           // [n][max(L*P, P)]
    std::vector<float> moe_out_, moe_in_;  // [n][H]
    std::vector<float> logits_rows_;       // [n][H] normed rows that get logits
};

}  // namespace markbase::cpu
