// Internal state of markbase::Tokenizer, shared by the loader/encoder (tokenizer.cpp) and the decoder
// (decoder.cpp). Plain data, built once by the loader and immutable afterwards.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/tokenizer.h"

namespace markbase::tok {

struct AddedToken {
    std::string content;
    std::string
        piece;  // what decode prints: content, or normalize(content) for normalized tokens (as HF 0.23)
    int id = -1;
    bool special = false;
    bool normalized = false;
};

// Byte trie of added-token strings for leftmost-longest matching (HF uses Aho-Corasick with LeftmostLongest;
// trying every start position in order and keeping the longest match there gives the same matches).
class TokenTrie {
  public:
    void add(std::string_view s, int id);
    bool empty() const { return nodes_.size() <= 1; }
    // Longest token starting at text[pos]: returns its byte length (0 if none) and sets id.
    std::size_t match(std::string_view text, std::size_t pos, int& id) const;

  private:
    struct Node {
        int id = -1;
        std::vector<std::pair<unsigned char, int>> children;  // sorted by byte
    };
    std::vector<Node> nodes_{Node{}};
    std::array<int, 256> root_{};  // child of the root per first byte, 0 = none (node 0 is the root itself)
};

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct SplitRule {
    std::string literal;    // the delimiter, or the repeated unit when `repeated`
    bool repeated = false;  // regex "X+": runs of X
    SplitBehavior behavior = SplitBehavior::Isolated;
};

struct NormalizerStep {
    enum Kind { Replace, Prepend } kind = Replace;
    std::string pattern, content;
};

struct DecoderStep {
    enum Kind { Replace, ByteFallback, Fuse } kind = Fuse;
    std::string pattern, content;
};

}  // namespace markbase::tok

namespace markbase {

struct Tokenizer::Impl {
    std::string origin;
    tok::BpeModel bpe;
    std::vector<tok::AddedToken> added;  // in file order
    std::vector<int> added_index;        // by id: index into `added`, -1 if not an added token
    tok::TokenTrie raw_trie;             // normalized=false added tokens, matched on the input text
    tok::TokenTrie normalized_trie;      // normalized=true ones, matched after the normalizer
    std::vector<tok::NormalizerStep> normalizer;
    std::vector<tok::SplitRule> pre_tokenizer;
    bool has_decoder = false;  // no decoder: HF joins the tokens with " "
    std::vector<tok::DecoderStep> decoder;
    bool byte_fallback_decoder = false;
    int id_space = 0;

    std::string normalize(std::string_view s) const;
    std::string_view piece(int id) const;  // added content first, then the vocabulary; "" if neither
    bool is_byte_piece(std::string_view p) const;
    int byte_value(
        std::string_view p) const;  // -1 unless p is "<0xHH>" as HF's ByteFallback decoder reads it
};

}  // namespace markbase
