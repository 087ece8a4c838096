// Paged KV bookkeeping: which fixed-size blocks of a shared pool hold which positions of which sequence.
// No K/V data lives here; a paged cache (CUDA) sizes one block to hold `block_size` positions of every
// layer of one kind, and reads a sequence's block table to find a position.
//
// Two tables per sequence, one per attention kind that owns a cache:
//   full     block i holds positions [i*B, (i+1)*B); it only grows.
//   sliding  the same numbering, but only the blocks a query can still read are kept: a query at position p
//            reads p - W + 1 .. p (W counts the query itself), so once the next query is at n every block
//            wholly below n - W + 1 goes back to the pool. Between steps a table holds at most
//            ceil(W / B) + 1 blocks; while a chunk of c positions is being written it holds the window of
//            the chunk's first query plus the chunk, at most ceil((W - 1 + c) / B) + 1.
// KV-shared layers own no blocks: they read their source layer's table.
//
// Both kinds draw from one pool of N interchangeable block ids (a paged cache gives a block the larger of the
// two kinds' per-block sizes, or keeps one arena per kind indexed by the same id). Running out is reported
// (grow() returns false and changes nothing), never undefined: the scheduler then preempts.
#pragma once

#include <cstdint>
#include <deque>
#include <unordered_map>
#include <vector>

#include "model/config.h"

namespace markbase {

struct KvBlockOptions {
    int64_t n_blocks = 0;      // the pool
    int block_size = 16;       // positions per block (B)
    int sliding_window = 512;  // W, for the sliding table
    bool full = true;          // the model has full-attention layers that own a cache
    bool sliding = true;       // ... and sliding ones

    // The kinds `c` has (its own-KV layers only) and its window; n_blocks and block_size as given.
    static KvBlockOptions for_model(const ModelConfig& c, int64_t n_blocks, int block_size = 16);
};

// One sequence's tables. sliding_first is the block number (position / B) of sliding.front().
struct KvBlockTables {
    int64_t n_pos = 0;            // positions the tables cover: [0, n_pos)
    std::vector<int32_t> full;    // block ids, block number i at [i]
    std::deque<int32_t> sliding;  // block ids of block numbers sliding_first ...
    int64_t sliding_first = 0;
};

class KvBlockAllocator {
  public:
    explicit KvBlockAllocator(const KvBlockOptions& opt);

    const KvBlockOptions& options() const { return opt_; }
    int64_t total() const { return opt_.n_blocks; }
    int64_t used() const { return opt_.n_blocks - free_blocks(); }
    int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }

    // The most blocks a sequence holds at once while it reaches `n_pos` positions in chunks of at most
    // `max_chunk` (admission asks for this much; a pool smaller than one context's worth cannot serve).
    int64_t blocks_for(int64_t n_pos, int64_t max_chunk) const;
    // Blocks grow(seq, n_pos) would take from the pool, net of the sliding blocks it returns first (may be
    // negative). A sequence not seen yet starts empty.
    int64_t grow_cost(uint64_t seq, int64_t n_pos) const;
    // Extends seq's tables to cover [0, n_pos) (n_pos >= its current length), first returning the sliding
    // blocks that the query at its current length no longer reads. false, and nothing changed, when the
    // pool lacks the blocks.
    bool grow(uint64_t seq, int64_t n_pos);
    // The most positions seq could reach with the blocks free now (its current length when none).
    int64_t max_growable(uint64_t seq, int64_t up_to) const;
    // Returns the sliding blocks the next query (at the sequence's length) no longer reads.
    void trim(uint64_t seq);
    void free(uint64_t seq);  // every block of seq back to the pool; unknown seq: nothing
    void free_all();
    const KvBlockTables* tables(uint64_t seq) const;  // nullptr when seq holds nothing
    int64_t sequences() const { return static_cast<int64_t>(seqs_.size()); }

    // Throws std::logic_error when the bookkeeping is inconsistent: a block both free and owned, owned
    // twice, neither (leaked), or a table longer than its bounds. For tests.
    void check() const;

  private:
    int64_t blocks_up_to(int64_t n_pos) const { return (n_pos + opt_.block_size - 1) / opt_.block_size; }
    int64_t first_needed_block(int64_t query_pos) const;
    int32_t take();
    void give(int32_t b);

    KvBlockOptions opt_;
    std::vector<int32_t> free_;  // a stack of free block ids
    std::unordered_map<uint64_t, KvBlockTables> seqs_;
};

}  // namespace markbase
