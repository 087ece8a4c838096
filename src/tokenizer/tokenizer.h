// Gemma's tokenizer, read from an HF tokenizer.json and reproducing HF `tokenizers` exactly
// (encode(text, add_special_tokens=False) and decode(ids, skip_special_tokens=...)).
//
// Supported, and checked at load (anything else is rejected with markbase::Error rather than tokenised
// wrongly):
//   model          BPE with optional byte_fallback, unk_token, fuse_unk, ignore_merges (no dropout, no
//                  continuing_subword_prefix / end_of_word_suffix)
//   normalizer     null, Replace (string pattern), Prepend, or a Sequence of these
//   pre_tokenizer  null, Split (string pattern, or a regex that is a literal or one character repeated with
//   '+',
//                  e.g. Gemma 4's "\n+"), or a Sequence of these; invert must be false
//   decoder        null, Replace (string pattern), ByteFallback, Fuse, or a Sequence of these
//   added_tokens   matched leftmost-longest in the raw text (normalized=false) or in the normalized text
//                  (normalized=true, decoded as their normalized form as HF 0.23 does); lstrip / rstrip /
//                  single_word must be false (as in every Gemma file)
//   post_processor, truncation, padding: ignored (BOS is the caller's: the chat template writes "<bos>"; for
//   a raw
//                  prompt prepend bos_id()).
// A Tokenizer is immutable after load; encode/decode are const and safe to call from several threads at once.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace markbase {

class Tokenizer {
  public:
    // `path` is a tokenizer.json or a folder that holds one. Throws markbase::Error naming the file on
    // anything unreadable, malformed or unsupported.
    static Tokenizer load(const std::filesystem::path& path);
    // Same, from the file's text already in memory; `origin` names it in error messages.
    static Tokenizer from_json(std::string_view json, const std::string& origin = "tokenizer.json");

    // Text -> ids, no BOS. Special and added token strings inside the text ("<bos>", "<|turn>") become their
    // ids, as HF does. Throws markbase::Error if `text` is not valid UTF-8 (naming the byte offset).
    std::vector<int> encode(std::string_view text) const;
    void encode_append(std::string_view text, std::vector<int>& out) const;

    // Ids -> text, exactly HF's decode. With skip_special, added tokens marked special are dropped
    // (non-special added tokens such as Gemma 4's <|channel> stay). Throws markbase::Error for an id outside
    // 0..vocab_size()-1.
    std::string decode(std::span<const int> ids, bool skip_special = false) const;

    int vocab_size() const;                     // id space: highest id + 1 (262144 for Gemma 4)
    std::string_view token_text(int id) const;  // raw piece: "▁Hello", "<0x0A>", "<turn|>"; "" if none
    std::optional<int> token_id(
        std::string_view piece) const;  // added tokens first, then the model vocabulary
    bool is_special(int id) const;      // an added token with "special": true
    bool is_added(int id) const;        // any entry of added_tokens
    bool is_byte_token(int id) const;   // <0xXX>, which the decoder turns back into a byte
    int bos_id() const;                 // id of "<bos>", or -1
    const std::string& origin() const;  // the file it was read from (as error messages name it)

    struct Stats {
        std::size_t vocab = 0, merges = 0, added = 0;
    };
    Stats stats() const;

    struct Impl;

  private:
    explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
    std::shared_ptr<const Impl> impl_;  // immutable after load: copies are cheap and usable from many threads
    friend class StreamDecoder;
};

// Incremental detokenisation for streaming output. push() returns the text that is final once `id` is known;
// the concatenation of every push() and flush() equals tokenizer.decode(all ids) exactly, so a character is
// never split. Text made of byte-fallback tokens (<0xE2><0x9C><0x85>) is held until the run of byte tokens
// ends (next ordinary token, or flush), because HF turns a whole run with any invalid byte into one U+FFFD
// per byte.
class StreamDecoder {
  public:
    explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false);
    std::string push(int id);
    std::string flush();  // emits what is held; the decoder can be reused afterwards

  private:
    Tokenizer tokenizer_;
    bool skip_special_;
    bool started_ = false;  // for a tokenizer without decoder, whose tokens are joined with spaces
    std::vector<int> held_;
};

}  // namespace markbase
