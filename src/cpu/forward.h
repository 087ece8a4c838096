// The Gemma 4 text decoder on the CPU: the exact reference backend. fp32 activations, bf16 weights read in
// place (the streamed ones copied out of the mapped checkpoint at load: resident_weights.h), work spread over
// a thread pool. forward.cpp holds the model's math in one place, readable against ../shared/GEMMA4.md
// section 2; attention.cpp and moe.cpp hold the two larger blocks.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu/kv_cache.h"
#include "cpu/matmul.h"
#include "cpu/resident_weights.h"
#include "cpu/thread_pool.h"
#include "loading/checkpoint.h"
#include "runtime/tuning.h"

namespace markbase::cpu {

// Where the rows of one pass come from and go to: n consecutive positions of one sequence (a prompt chunk,
// from cache.n_past on), or one token per row of n different sequences, each at its own cache's n_past (a
// batched decode step). The matmuls take every row at once; attention and the cache writes go row by row.
class RowCaches {
  public:
    explicit RowCaches(KvCache& cache) : one_(&cache), pos0_(cache.n_past) {}
    explicit RowCaches(KvCache* const* caches) : many_(caches) {}
    KvCache& cache(int t) const { return many_ ? *many_[t] : *one_; }
    // n_past is advanced only after the pass, so during it this is the row's own position
    int64_t pos(int t) const { return many_ ? many_[t]->n_past : pos0_ + t; }

  private:
    KvCache* one_ = nullptr;
    KvCache* const* many_ = nullptr;
    int64_t pos0_ = 0;
};

// The prompt products a backend's tuning selects: gemm_inputs=bf16 (the default) the bf16 ones where they
// are the faster ones on this CPU (matmul.h bf16_products_faster), halves the exact ones.
inline PromptProducts prompt_products(const Tuning& t) {
    return t.gemm_inputs == Tuning::GemmInputs::kBf16 && bf16_products_faster() ? PromptProducts::kBf16
                                                                                : PromptProducts::kExact;
}

class CpuModel {
  public:
    // max_chunk: the most tokens one forward() may take (prompts are fed in chunks of this size).
    // products: what the prompt products take of x (matmul.h; the exact fp32 products by default).
    CpuModel(const Checkpoint& ck, ThreadPool& pool, int max_chunk = 256,
             PromptProducts products = PromptProducts::kExact);

    const ModelConfig& config() const { return c_; }
    int max_chunk() const { return max_chunk_; }

    // Runs n (<= max_chunk) tokens at positions cache.n_past ... and appends them to the cache.
    // logits: [n][V] when all_logits, else [V] for the last token only (nullptr: none computed).
    void forward(const int* ids, int n, KvCache& cache, float* logits, bool all_logits);

    // One decode token for each of n (<= max_chunk) sequences: ids[t] is appended to caches[t] (n distinct
    // caches) at its n_past. Every weight is read once for all n rows. logits: [n_logits][V] for rows
    // [0, n_logits) (nullptr: none). Each row's results are bit-identical to forward(&ids[t], 1, *caches[t])
    // alone: every product is matmul_bf16_rowwise, and everything else is per row.
    void forward_decode(const int* ids, int n, KvCache* const* caches, float* logits, int n_logits);

    // MoE: the smallest gap between the K-th and (K+1)-th router logit (= their log-probability gap),
    // relative to that token's largest |router logit|, over every token routed since the last
    // reset_router_margin(); infinity before any. A comparison with another backend reads it to know whether
    // rounding could have flipped an expert choice.
    float router_margin() const { return router_margin_; }
    void reset_router_margin() { router_margin_ = INFINITY; }

  private:
    void check_room(const KvCache& cache, int n) const;
    void run_layers(const int* ids, int n, const RowCaches& rows);  // embeddings and every layer
    void final_logits(int first_row, int rows, float* logits);      // 2.7 on x_'s rows from first_row
    // y = x w^T over n rows; in a batched decode pass (rowwise_) each row's bits are those of the row alone
    void matmul(const float* x, int n, int64_t in, const bf16* w, int64_t out, float* y);
    void embed(const int* ids, int n);
    void per_layer_inputs(const int* ids, int n);
    void layer(int i, int n, const RowCaches& rows);
    void attention(int i, int n, const RowCaches& rows);  // attention.cpp: a_ -> o_
    void moe(int i, int n);                               // moe.cpp: x_ -> moe_out_
    void mlp(const LayerWeights& w, int I, const float* in, int n, float* out);

    const ModelConfig& c_;
    ResidentWeights resident_;  // the streamed weights copied into memory (before w_, which points into it)
    const Weights& w_;
    ThreadPool& pool_;
    int max_chunk_;
    float router_margin_ = INFINITY;
    PromptProducts products_;
    bool rowwise_ = false;  // set by forward_decode for its pass, cleared by forward
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
