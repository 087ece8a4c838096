#include "runtime/kv_blocks.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "model/error.h"

namespace markbase {

KvBlockOptions KvBlockOptions::for_model(const ModelConfig& c, int64_t n_blocks, int block_size) {
    KvBlockOptions o;
    o.n_blocks = n_blocks;
    o.block_size = block_size;
    o.sliding_window = c.sliding_window;
    o.full = o.sliding = false;
    for (int i = 0; i < c.n_layers; ++i) {
        const LayerSpec& s = c.layers[i];
        if (!s.has_own_kv()) continue;
        (s.kind == AttentionKind::Sliding ? o.sliding : o.full) = true;
    }
    return o;
}

KvBlockAllocator::KvBlockAllocator(const KvBlockOptions& opt) : opt_(opt) {
    if (opt.n_blocks < 0 || opt.n_blocks > INT32_MAX)
        throw Error("KV blocks: a pool of " + std::to_string(opt.n_blocks) + " blocks is out of range");
    if (opt.block_size < 1) throw Error("KV blocks: block size must be positive");
    if (opt.sliding && opt.sliding_window < 1) throw Error("KV blocks: sliding window must be positive");
    free_.reserve(static_cast<size_t>(opt.n_blocks));
    // a stack popped from the back: block 0 is taken first
    for (int64_t b = opt.n_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

int64_t KvBlockAllocator::first_needed_block(int64_t query_pos) const {
    return std::max<int64_t>(0, query_pos - opt_.sliding_window + 1) / opt_.block_size;
}

int64_t KvBlockAllocator::blocks_for(int64_t n_pos, int64_t max_chunk) const {
    int64_t b = 0;
    if (opt_.full) b += blocks_up_to(n_pos);
    if (opt_.sliding) {
        const int64_t span = opt_.sliding_window - 1 + std::max<int64_t>(1, max_chunk);
        b += std::min(blocks_up_to(n_pos), (span + opt_.block_size - 1) / opt_.block_size + 1);
    }
    return b;
}

int64_t KvBlockAllocator::grow_cost(uint64_t seq, int64_t n_pos) const {
    static const KvBlockTables kEmpty;
    const KvBlockTables* t = tables(seq);
    if (t == nullptr) t = &kEmpty;
    if (n_pos <= t->n_pos) return 0;
    const int64_t added = blocks_up_to(n_pos) - blocks_up_to(t->n_pos);
    int64_t cost = 0;
    if (opt_.full) cost += added;
    if (opt_.sliding) {
        const int64_t released = std::clamp<int64_t>(first_needed_block(t->n_pos) - t->sliding_first, 0,
                                                     static_cast<int64_t>(t->sliding.size()));
        cost += added - released;
    }
    return cost;
}

bool KvBlockAllocator::grow(uint64_t seq, int64_t n_pos) {
    auto it = seqs_.find(seq);
    const int64_t have = it == seqs_.end() ? 0 : it->second.n_pos;
    if (n_pos < have) throw std::logic_error("KV blocks: grow() cannot shrink a sequence");
    if (n_pos == have) return true;
    if (grow_cost(seq, n_pos) > free_blocks()) return false;
    KvBlockTables& t = it == seqs_.end() ? seqs_[seq] : it->second;
    if (opt_.sliding) trim(seq);
    const int64_t from = blocks_up_to(t.n_pos), to = blocks_up_to(n_pos);
    for (int64_t b = from; b < to; ++b) {
        if (opt_.full) t.full.push_back(take());
        if (opt_.sliding) t.sliding.push_back(take());
    }
    t.n_pos = n_pos;
    return true;
}

int64_t KvBlockAllocator::max_growable(uint64_t seq, int64_t up_to) const {
    const KvBlockTables* t = tables(seq);
    int64_t lo = t ? t->n_pos : 0, hi = up_to;  // lo always fits; find the largest n <= hi that does
    if (hi <= lo) return lo;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo + 1) / 2;
        if (grow_cost(seq, mid) <= free_blocks())
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

void KvBlockAllocator::trim(uint64_t seq) {
    auto it = seqs_.find(seq);
    if (it == seqs_.end() || !opt_.sliding) return;
    KvBlockTables& t = it->second;
    const int64_t keep_from = first_needed_block(t.n_pos);
    while (t.sliding_first < keep_from && !t.sliding.empty()) {
        give(t.sliding.front());
        t.sliding.pop_front();
        ++t.sliding_first;
    }
}

void KvBlockAllocator::free(uint64_t seq) {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return;
    for (int32_t b : it->second.full) give(b);
    for (int32_t b : it->second.sliding) give(b);
    seqs_.erase(it);
}

void KvBlockAllocator::free_all() {
    while (!seqs_.empty()) free(seqs_.begin()->first);
}

const KvBlockTables* KvBlockAllocator::tables(uint64_t seq) const {
    auto it = seqs_.find(seq);
    return it == seqs_.end() ? nullptr : &it->second;
}

int32_t KvBlockAllocator::take() {
    if (free_.empty()) throw std::logic_error("KV blocks: take() from an empty pool");
    const int32_t b = free_.back();
    free_.pop_back();
    return b;
}

void KvBlockAllocator::give(int32_t b) {
    free_.push_back(b);
}

void KvBlockAllocator::check() const {
    auto fail = [](const std::string& what) { throw std::logic_error("KV blocks: " + what); };
    std::vector<char> seen(static_cast<size_t>(opt_.n_blocks), 0);
    auto mark = [&](int32_t b, const char* where) {
        if (b < 0 || b >= opt_.n_blocks) fail(std::string("block id out of range in ") + where);
        if (seen[b]) fail("block " + std::to_string(b) + " appears twice (" + where + ")");
        seen[b] = 1;
    };
    for (int32_t b : free_) mark(b, "the free list");
    for (const auto& [id, t] : seqs_) {
        const int64_t n = blocks_up_to(t.n_pos);
        if (static_cast<int64_t>(t.full.size()) != (opt_.full ? n : 0))
            fail("sequence " + std::to_string(id) + ": full table does not cover its positions");
        if (!opt_.sliding && !t.sliding.empty()) fail("a sliding table without sliding layers");
        if (opt_.sliding && t.sliding_first + static_cast<int64_t>(t.sliding.size()) != n)
            fail("sequence " + std::to_string(id) + ": sliding table does not end at its length");
        if (opt_.sliding && t.sliding_first > first_needed_block(t.n_pos))
            fail("sequence " + std::to_string(id) + ": sliding table dropped a block its next query reads");
        for (int32_t b : t.full) mark(b, "a full table");
        for (int32_t b : t.sliding) mark(b, "a sliding table");
    }
    for (int64_t b = 0; b < opt_.n_blocks; ++b)
        if (!seen[b]) fail("block " + std::to_string(b) + " leaked (neither free nor owned)");
}

}  // namespace markbase
