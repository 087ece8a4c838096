// Batched decode (docs/batched-decode.md): several sequences, each with its own cache slot and position,
// decode one token each in one pass. Everything but attention and the cache write is the prefill's work over
// the batch's rows (GEMMs: the weights are read once per step, not once per sequence); qkv_post and attention
// take per-token positions and slots (their Batched instantiations). A step is one graph launch: the graph
// of n sequences whose furthest position lies below a range class (batch_range), captured on first use,
// reads the ids, positions and slots from device memory (E2B 8 sequences -5.4%, 32 -5.1%, the 31B's 16
// -2.9%). The MoE's experts run on the device (moe_stream.cu) up to Tuning::batch_experts sequences (26B-A4B
// 8 sequences 10.41 -> 9.28 ms per step, 64 19.85 -> 19.62, 128 23.77 -> 25.77, against the compact cuBLAS
// pass then in use); beyond, the step runs eagerly with its experts through moe_gemm, as a prompt chunk's.
// One sequence alone takes its slot's decode graph, the one-sequence step.
#include <algorithm>
#include <utility>

#include "cuda/model.h"

namespace markbase::cuda {

namespace {

void check_slot(int slot, int slots) {
    if (slot < 0 || slot >= slots)
        throw Error("sequence slot " + std::to_string(slot) + " is outside [0, " + std::to_string(slots) +
                    ")");
}

}  // namespace

void CudaModel::reset_slot(int slot) {
    check_slot(slot, slots_);
    slot_pos_[static_cast<size_t>(slot)] = 0;
}

void CudaModel::set_slot_blocks(int slot, const int* blocks, int64_t n) {
    check_slot(slot, slots_);
    if (kv_.pool_blocks == 0) throw Error("internal: block tables for a model without a paged KV cache");
    if (n < 0 || n > kv_.table_stride)
        throw Error("KV block table of slot " + std::to_string(slot) + ": " + std::to_string(n) +
                    " blocks, at most " + std::to_string(kv_.table_stride) + " (the context)");
    for (int64_t i = 0; i < n; ++i)
        if (blocks[i] < 0 || blocks[i] >= kv_.pool_blocks)
            throw Error("KV block table of slot " + std::to_string(slot) + ": block " + std::to_string(i) +
                        " is " + std::to_string(blocks[i]) + ", outside the pool of " +
                        std::to_string(kv_.pool_blocks));
    std::copy(blocks, blocks + n, kv_.host_table.begin() + slot * kv_.table_stride);
    kv_.table_dirty = true;
}

// Pageable host memory: the copy returns once the rows are staged, so the host may change them again.
void CudaModel::upload_block_tables() {
    if (!kv_.table_dirty) return;
    CUDA_CHECK(cudaMemcpyAsync(kv_.table, kv_.host_table.data(), kv_.host_table.size() * sizeof(int),
                               cudaMemcpyHostToDevice, stream_));
    kv_.table_dirty = false;
}

void CudaModel::prefill_slot(int slot, const int* ids, int n) {
    check_slot(slot, slots_);
    upload_block_tables();
    const int64_t saved = n_past;
    cur_slot_ = slot;
    n_past = slot_pos_[static_cast<size_t>(slot)];
    try {
        prefill(ids, n, nullptr, false);
    } catch (...) {
        n_past = saved;
        cur_slot_ = 0;
        throw;
    }
    slot_pos_[static_cast<size_t>(slot)] = n_past;
    n_past = saved;
    cur_slot_ = 0;
}

std::vector<int> CudaModel::decode_batch(const int* slot_ids, const int* ids, int n, float* logits) {
    return batch_step(slot_ids, ids, n, logits, nullptr);
}

// A step's sequences checked (n of them, each slot once, room in each cache): their positions and slots,
// and the furthest position.
int64_t CudaModel::check_batch(const int* slot_ids, int n, std::vector<int>* pos,
                               std::vector<int>* slot) const {
    if (slots_ < 2 || !d_bpos_)
        throw Error("internal: decode_batch needs a model built with 2 or more slots");
    if (n < 1 || n > std::min(chunk_, slots_))
        throw Error("decode_batch: " + std::to_string(n) + " sequences; at most " +
                    std::to_string(std::min(chunk_, slots_)) + " (the slots, and the batch size -b)");
    pos->assign(static_cast<size_t>(n), 0);
    slot->assign(static_cast<size_t>(n), 0);
    std::vector<char> seen(static_cast<size_t>(slots_), 0);
    int64_t max_pos = 0;
    for (int t = 0; t < n; ++t) {
        const int s = slot_ids[t];
        check_slot(s, slots_);
        if (seen[static_cast<size_t>(s)])
            throw Error("decode_batch: sequence slot " + std::to_string(s) + " appears twice in one step");
        seen[static_cast<size_t>(s)] = 1;
        const int64_t p = slot_pos_[static_cast<size_t>(s)];
        if (p >= ctx_)
            throw Error("context full: sequence slot " + std::to_string(s) + " holds " + std::to_string(p) +
                        " tokens (raise --ctx-size)");
        (*pos)[static_cast<size_t>(t)] = static_cast<int>(p);
        (*slot)[static_cast<size_t>(t)] = s;
        max_pos = std::max(max_pos, p);
    }
    return max_pos;
}

// The step's ids, positions and slots into device memory (the step's graph reads them there), once the
// previous step no longer reads the pinned ids.
void CudaModel::stage_batch(const int* ids, const std::vector<int>& pos, const std::vector<int>& slot) {
    const int n = static_cast<int>(pos.size());
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    upload_block_tables();
    std::copy(ids, ids + n, st_.h_ids);
    CUDA_CHECK(cudaMemcpyAsync(st_.d_ids, st_.h_ids, n * sizeof(int), cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaMemcpyAsync(d_bpos_, pos.data(), n * sizeof(int), cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaMemcpyAsync(d_bslot_, slot.data(), n * sizeof(int), cudaMemcpyHostToDevice, stream_));
}

// decode_batch's step; with a profiler (profile_batch), run eagerly with events around each phase.
std::vector<int> CudaModel::batch_step(const int* slot_ids, const int* ids, int n, float* logits,
                                       Profiler* pf) {
    std::vector<int> pos, slot;
    const int64_t max_pos = check_batch(slot_ids, n, &pos, &slot);
    batch_rows_ = nullptr;  // until this step has run
    batch_n_ = 0;
    if (n == 1 && !pf) {
        upload_block_tables();
        const int next = decode_slot(slot[0], ids[0], logits);
        batch_rows_ = act_.logits;
        batch_n_ = 1;
        return {next};
    }
    const int64_t V = c_.vocab_size;
    stage_batch(ids, pos, slot);
    if (pf || !batch_on_device(n)) {
        prefill_pf_ = pf;
        try {
            record_batch(n, max_pos + 1);
        } catch (...) {
            prefill_pf_ = nullptr;
            throw;
        }
        prefill_pf_ = nullptr;
    } else {
        CUDA_CHECK(cudaGraphLaunch(batch_graph(n, batch_range(max_pos)), stream_));
    }
    std::vector<int> next(static_cast<size_t>(n));
    CUDA_CHECK(cudaMemcpyAsync(next.data(), d_bnext_, n * sizeof(int), cudaMemcpyDeviceToHost, stream_));
    if (logits)
        CUDA_CHECK(cudaMemcpyAsync(logits, act_.all_logits, static_cast<size_t>(n) * V * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (int t = 0; t < n; ++t) ++slot_pos_[static_cast<size_t>(slot[static_cast<size_t>(t)])];
    batch_rows_ = act_.all_logits;
    batch_n_ = n;
    return next;
}

// One sequence's token through its slot's decode graph; its greedy next id (and logits row when given).
int CudaModel::decode_slot(int slot, int id, float* logits) {
    const int64_t saved = n_past;
    cur_slot_ = slot;
    n_past = slot_pos_[static_cast<size_t>(slot)];
    try {
        launch_step(id);
        if (logits) logits_to_host(logits, act_.logits, 1);
        CUDA_CHECK(cudaMemcpyAsync(st_.h_state, st_.d_state, sizeof(int), cudaMemcpyDeviceToHost, stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
    } catch (...) {
        n_past = saved;
        cur_slot_ = 0;
        throw;
    }
    n_past = saved;
    cur_slot_ = 0;
    ++slot_pos_[static_cast<size_t>(slot)];
    return st_.h_state[0];
}

// The range class of a step whose furthest position is max_pos: a power of two of at least 256 keys, at most
// the context. The attention pieces are laid out for the class, so one graph serves every step in it (the
// pieces past a sequence's own range hold no keys and drop out of the merge).
int64_t CudaModel::batch_range(int64_t max_pos) const {
    int64_t r = 256;
    while (r < max_pos + 1) r *= 2;
    return std::min(r, ctx_);  // max_pos < ctx_, so still above it
}

namespace {
// FP8 experts stream through moe_stream up to at least this many sequences: 26B-A4B after 768 tokens, 128
// sequences 27.29 ms per step against the compact cuBLAS pass's 29.21 (over the bf16 copy; bench/results/
// cuda-batched-fp8-experts.json), where bf16 rows lose at 128.
constexpr int kFp8BatchExperts = 128;
}  // namespace

// Whether the model's batched steps can read FP8 experts (batch_experts' rule: an FP8 model, widths
// moe_stream's FP8 rows take).
bool CudaModel::fp8_experts() const {
    return c_.moe && dw_->quant_format == WeightFormat::kFp8 && !w_.quant.empty() &&
           moe_stream_fits_fp8(c_.hidden, c_.expert_width);
}

// Whether the step of n sequences runs with no host in its loop: every dense model's, the MoE's up to
// plan_.batch_experts_max sequences (FP8 experts: kFp8BatchExperts, unless moe_stream is off) on one GPU
// where moe_stream takes its widths (its experts on the device, not the host-planned pass).
bool CudaModel::batch_on_device(int n) const {
    const int most = plan_.batch_experts_max > 0 && fp8_experts()
                         ? std::max(plan_.batch_experts_max, kFp8BatchExperts)
                         : plan_.batch_experts_max;
    return !c_.moe || (n <= most && !sharded() && moe_stream_fits(c_.hidden, c_.expert_width));
}

// Whether the model's batched steps can read int4 experts (an int4 model at widths moe_stream takes; a last
// group of K % 128 != 0 is short).
bool CudaModel::int4_experts() const {
    return c_.moe && dw_->quant_format == WeightFormat::kInt4 && !w_.quant.empty() &&
           moe_stream_fits(c_.hidden, c_.expert_width);
}

// The bytes an expert weight costs the step of n sequences: its FP8 or int4 rows, else the bf16 copy's.
double CudaModel::batch_expert_weight_bytes(int n) const {
    if (!batch_on_device(n)) return 2.0;
    return fp8_experts() ? 1.0 : int4_experts() ? 0.5 : 2.0;
}

cudaGraphExec_t CudaModel::batch_graph(int n, int64_t range) {
    if (!batch_on_device(n)) throw Error("internal: this batched step waits on the host and is not captured");
    const auto key = std::make_pair(n, range);
    const auto it = batch_graphs_.find(key);
    if (it != batch_graphs_.end()) return it->second;
    ensure_all_logits();
    return batch_graphs_.emplace(key, instantiate_graph(capture_batch(n, range))).first->second;
}

// The batched step of n sequences in range class `range` as a graph (batch_graph's capture, the timeline's;
// the caller owns it).
cudaGraph_t CudaModel::capture_batch(int n, int64_t range) {
    cudaGraph_t g = nullptr;
    // relaxed: cuBLAS may set up its workspace on its first call inside the capture
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
    try {
        record_batch(n, range);
    } catch (...) {
        cudaStreamEndCapture(stream_, &g);
        if (g) cudaGraphDestroy(g);
        throw;
    }
    CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
    return g;
}

// The batched step's launches (captured, or run eagerly: the MoE, the profile): n tokens (st_.d_ids) at
// positions d_bpos_ of slots d_bslot_, every position below `range`; the greedy next ids into d_bnext_, every
// row's logits in act_.all_logits.
void CudaModel::record_batch(int n, int64_t range) {
    const BatchScope scope(batch_);
    Profiler* pf = prefill_pf_;  // profile_batch: events around each phase
    embed_chunk(pf, n);
    // prefill_layer sizes the attention pieces from pos0 + n: here the range
    for (int i = 0; i < c_.n_layers; ++i) prefill_layer(i, n, range - n);
    record_batch_logits(pf, n);
}

// x's first `rows` rows through the final norm and lm_head: their logits in act_.all_logits, their greedy
// ids in d_bnext_ (the batched step's rows; the mixed step's wanted rows, moved to the front).
void CudaModel::record_batch_logits(Profiler* pf, int rows) {
    const int H = c_.hidden;
    const int64_t V = c_.vocab_size;
    run(pf, "lm_head", -1, 2.0 * V * H, [&] {
        split_x({true, true, w_.final_norm}, rows);
        gemm(w_.embed, static_cast<int>(V), H, rows, act_.all_logits, V);
        if (c_.final_softcap > 0.0f)
            softcap_inplace(act_.all_logits, int64_t{rows} * V, c_.final_softcap, stream_);
        argmax_rows(act_.all_logits, rows, V, d_bnext_, stream_);
    });
}

}  // namespace markbase::cuda
