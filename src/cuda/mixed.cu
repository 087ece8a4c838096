// Mixed steps (issue 30's item 6, what the server's chunked prefill runs): one pass over the weights for the
// decode tokens of some sequences and the prompt chunks of others. Every row goes through the batched step's
// products, norms, MoE and cache write as it is (each row carries its own position and slot: a chunk's rows
// are consecutive positions of one slot); only attention tells them apart. The leading one-id rows take the
// batched pieces (attention_warp / attention_mma, one query per sequence); each later item takes the prompt
// path's attention_gemm over its own slot, which reads the slot's keys once per tile of queries rather than
// once per row. Then lm_head over the rows whose logits are wanted, gathered to the front.
//
// Without it a serving step read the weights once per prompt chunk and once more for its decode rows
// (cuda_slots.cpp's fallback, still what a tensor-parallel backend runs).
#include <algorithm>
#include <string>
#include <vector>

#include "cuda/model.h"

namespace markbase::cuda {

std::vector<CudaProfileEntry> CudaModel::profile_mixed(const SlotItem* items, int count) {
    if (sharded()) throw Error("the per-kernel profile runs on one GPU: use --tensor-parallel-size 1");
    Profiler pf;  // (its destructor frees the events if the step throws)
    mixed_run(items, count, nullptr, &pf);
    return pf.collect();
}

std::vector<int> CudaModel::mixed_batch(const SlotItem* items, int count, float* logits) {
    return mixed_run(items, count, logits, nullptr);
}

std::vector<int> CudaModel::mixed_run(const SlotItem* items, int count, float* logits, Profiler* pf) {
    if (slots_ < 2 || !d_bpos_)
        throw Error("internal: a mixed step needs a model built with 2 or more slots");
    if (count < 1) throw Error("mixed step: no items");
    std::vector<int> ids, pos, slot, wanted;
    std::vector<char> seen(static_cast<size_t>(slots_), 0);
    MixedPlan plan;
    plan.on = true;
    bool leading = true;  // still in the run of one-id items the step starts with
    for (int t = 0; t < count; ++t) {
        const SlotItem& it = items[t];
        if (it.slot < 0 || it.slot >= slots_)
            throw Error("mixed step: sequence slot " + std::to_string(it.slot) + " is outside [0, " +
                        std::to_string(slots_) + ")");
        if (seen[static_cast<size_t>(it.slot)])
            throw Error("mixed step: sequence slot " + std::to_string(it.slot) +
                        " appears twice in one step");
        seen[static_cast<size_t>(it.slot)] = 1;
        if (it.n < 1 || !it.ids)
            throw Error("mixed step: item " + std::to_string(t) + " (slot " + std::to_string(it.slot) +
                        ") has no ids");
        const int64_t p = slot_pos_[static_cast<size_t>(it.slot)];
        if (p + it.n > ctx_)
            throw Error("context full: sequence slot " + std::to_string(it.slot) + " holds " +
                        std::to_string(p) + " + " + std::to_string(it.n) +
                        " new tokens, more than the context size " + std::to_string(ctx_));
        const int row0 = static_cast<int>(ids.size());
        if (int64_t{row0} + it.n > chunk_)
            throw Error("mixed step: more than " + std::to_string(chunk_) + " rows (the batch size -b)");
        for (int j = 0; j < it.n; ++j) {
            ids.push_back(it.ids[j]);
            pos.push_back(static_cast<int>(p + j));
            slot.push_back(it.slot);
        }
        if (it.logits) wanted.push_back(row0 + it.n - 1);
        leading = leading && it.n == 1;
        if (leading) {
            ++plan.decode_rows;
            plan.decode_range = std::max(plan.decode_range, p + 1);
        } else {
            plan.chunks.push_back({row0, it.n, it.slot, p});
        }
    }
    const int n = static_cast<int>(ids.size());
    const int k = static_cast<int>(wanted.size());
    batch_rows_ = nullptr;  // until this step has run
    batch_n_ = 0;
    stage_batch(ids.data(), pos, slot);
    mixed_ = std::move(plan);
    prefill_pf_ = pf;
    try {
        record_mixed(n, wanted);
    } catch (...) {
        mixed_ = {};
        prefill_pf_ = nullptr;
        throw;
    }
    mixed_ = {};
    prefill_pf_ = nullptr;
    std::vector<int> next(static_cast<size_t>(k));
    if (k > 0) {
        CUDA_CHECK(cudaMemcpyAsync(next.data(), d_bnext_, k * sizeof(int), cudaMemcpyDeviceToHost, stream_));
        if (logits)
            CUDA_CHECK(cudaMemcpyAsync(logits, act_.all_logits,
                                       static_cast<size_t>(k) * c_.vocab_size * sizeof(float),
                                       cudaMemcpyDeviceToHost, stream_));
    }
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (int t = 0; t < count; ++t) slot_pos_[static_cast<size_t>(items[t].slot)] += items[t].n;
    batch_rows_ = act_.all_logits;
    batch_n_ = k;
    return next;
}

// The mixed step's launches (eager: its shape changes every step): the batched step's layers over all n
// rows, then the wanted rows' x moved to the front (row wanted[j] -> j; wanted ascends and wanted[j] >= j,
// so no move overwrites a row still to be read) and lm_head over those k rows only.
void CudaModel::record_mixed(int n, const std::vector<int>& wanted) {
    const int H = c_.hidden, L = c_.n_layers;
    const BatchScope scope(batch_);
    Profiler* pf = prefill_pf_;  // profile_mixed: events around each phase
    embed_chunk(pf, n);
    for (int i = 0; i < L; ++i) prefill_layer(i, n, 0);  // (positions: mixed_ and the per-row arrays)
    const int k = static_cast<int>(wanted.size());
    if (k == 0) return;
    ensure_all_logits();
    for (int j = 0; j < k; ++j)
        if (wanted[static_cast<size_t>(j)] != j)
            CUDA_CHECK(cudaMemcpyAsync(act_.x + int64_t{j} * H,
                                       act_.x + int64_t{wanted[static_cast<size_t>(j)]} * H,
                                       H * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
    record_batch_logits(pf, k);  // (the last update's split rows stand only where k == n)
}

// Layer i's attention in a mixed step: each chunk through attention_gemm over its slot's cache, then the
// leading one-id rows through the batched pieces (a, as prefill_attention laid them out for them; their
// merge writes o_proj's input rows), then the chunks' output rows split into o_proj's input as the merge
// writes the others (hi at its rows, lo at the same rows of the n-row lo half). In that order because
// attention_gemm's bf16 queries (a bf16 or fp8 cache) are staged in act_.hi, which the merge and the
// splits write.
void CudaModel::mixed_attention(int i, AttnArgs& a, int n) {
    const int qw = a.nH * a.d;
    for (const MixedChunk& ch : mixed_.chunks) {
        AttnArgs b = a;
        b.tok_pos = nullptr;
        b.tok_slot = nullptr;
        b.block_table = nullptr;
        bind_cache(i, b, false, ch.slot);
        b.q = act_.q + int64_t{ch.row0} * qw;
        b.out = act_.attn + int64_t{ch.row0} * qw;
        b.out_hi = b.out_lo = nullptr;
        attention_gemm(b, ch.n, ch.pos0, attn_gemm_, stream_);
    }
    if (mixed_.decode_rows > 0) attention(a, mixed_.decode_rows, stream_);
    for (const MixedChunk& ch : mixed_.chunks)
        split_rows(act_.attn + int64_t{ch.row0} * qw, qw, qw, ch.n, false, nullptr, c_.rms_eps,
                   act_.hi + int64_t{ch.row0} * qw, lo_at(n, qw) + int64_t{ch.row0} * qw, stream_);
}

}  // namespace markbase::cuda
