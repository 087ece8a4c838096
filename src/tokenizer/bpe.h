// The BPE model of an HF tokenizer.json, with the exact semantics of HF `tokenizers` (models/bpe): a word is
// split into characters, each looked up in the vocabulary (else byte-fallback <0xXX> tokens, else <unk>),
// then merges are applied lowest rank first, leftmost first on ties, until none applies.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace markbase::tok {

uint64_t hash_bytes(std::string_view s);

// Token string <-> id for the model vocabulary. Token texts live in one arena; the hash table holds ids only,
// so the object stays valid when moved.
class Vocab {
  public:
    struct Entry {
        std::string_view text;
        int64_t id;
    };
    // Throws markbase::Error (naming `origin`) on a duplicate token, a duplicate id or an id out of range.
    void build(const std::vector<Entry>& entries, const std::string& origin);

    int find(std::string_view token) const { return find(token, hash_bytes(token)); }
    int find(std::string_view token, uint64_t hash) const;  // hash = hash_bytes(token)
    void prefetch(uint64_t hash) const { __builtin_prefetch(&slots_[hash & mask_]); }
    bool has_id(int id) const { return id >= 0 && id < id_space() && present_[id]; }
    std::string_view text(int id) const {
        return {arena_.data() + offsets_[id], offsets_[id + 1] - offsets_[id]};
    }
    int id_space() const { return static_cast<int>(present_.size()); }  // max id + 1
    std::size_t size() const { return count_; }

  private:
    std::vector<char> arena_;
    std::vector<uint32_t> offsets_;  // by id, id_space + 1 entries
    std::vector<uint8_t> present_;   // by id: ids may have holes
    // Open addressing. A slot carries the token's place in the arena so that a probe touches one cache line
    // of the table and one of the arena (the merges build does 1.5 M lookups at load).
    struct Slot {
        uint32_t tag;     // high half of the hash
        int32_t id;       // -1 = empty
        uint32_t offset;  // into arena_
        uint32_t length;
    };
    std::vector<Slot> slots_;
    std::size_t mask_ = 0;
    std::size_t count_ = 0;
};

struct BpeOptions {
    std::string unk_token;  // empty: none
    bool fuse_unk = false;
    bool byte_fallback = false;
    bool ignore_merges = false;
};

class BpeModel {
  public:
    // `merges` are (left, right) token strings in rank order. Throws markbase::Error if a merge names a token
    // that is not in the vocabulary or whose concatenation is not.
    void build(const std::vector<Vocab::Entry>& vocab,
               const std::vector<std::pair<std::string_view, std::string_view>>& merges,
               const BpeOptions& options, const std::string& origin);

    // Appends the ids of one pre-tokenized, normalized word (valid UTF-8, non-empty).
    void encode_word(std::string_view word, std::vector<int>& out) const;

    const Vocab& vocab() const { return vocab_; }
    std::size_t merge_count() const { return merge_count_; }

  private:
    struct MergeSlot {
        uint64_t key;  // (left << 32) | right; kEmpty when unused
        uint32_t rank;
        int32_t new_id;
    };
    static constexpr uint64_t kEmpty = ~uint64_t{0};
    const MergeSlot* find_merge(int left, int right) const;
    void insert_merge(int left, int right, uint32_t rank, int new_id);

    // A word's symbols in encode_word: a linked list in one array (indices, -1 at the ends).
    struct Symbol {
        int id;
        int prev;
        int next;
    };
    // encode_word's merge loop, forced inline into it (defined in bpe.cpp): the per-word hot path.
    [[gnu::always_inline]] inline void merge_symbols(Symbol* syms, std::size_t count) const;

    Vocab vocab_;
    BpeOptions options_;
    int unk_id_ = -1;
    std::array<int, 256> byte_ids_{};   // <0xXX> token ids, -1 when absent
    std::array<int, 128> ascii_ids_{};  // single ASCII character tokens, -1 when absent
    std::vector<MergeSlot> merges_;
    std::size_t merge_mask_ = 0;
    std::size_t merge_count_ = 0;
};

}  // namespace markbase::tok
