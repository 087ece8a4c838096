// Encoding: added tokens out of the raw text, normalizer, added tokens out of the normalized text,
// pre-tokenizer splits, then the BPE model on each piece -- the order of HF
// TokenizerImpl::encode_single_sequence.
#include "tokenizer/tokenizer.h"

#include <algorithm>

#include "model/error.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace markbase {

namespace tok {

void TokenTrie::add(std::string_view s, int id) {
    if (s.empty()) return;
    int node = 0;
    for (std::size_t i = 0; i < s.size(); ++i) {
        const auto b = static_cast<unsigned char>(s[i]);
        int next = 0;
        if (node == 0) {
            next = root_[b];
        } else {
            auto& ch = nodes_[node].children;
            auto it = std::lower_bound(ch.begin(), ch.end(), std::make_pair(b, 0));
            if (it != ch.end() && it->first == b) next = it->second;
        }
        if (next == 0) {
            next = static_cast<int>(nodes_.size());
            nodes_.emplace_back();
            if (node == 0) {
                root_[b] = next;
            } else {
                auto& ch = nodes_[node].children;
                ch.insert(std::lower_bound(ch.begin(), ch.end(), std::make_pair(b, 0)), {b, next});
            }
        }
        node = next;
    }
    if (nodes_[node].id < 0) nodes_[node].id = id;  // first one wins, as the first pattern does in HF
}

std::size_t TokenTrie::match(std::string_view text, std::size_t pos, int& id) const {
    int node = root_[static_cast<unsigned char>(text[pos])];
    std::size_t best = 0;
    for (std::size_t i = pos + 1; node != 0; ++i) {
        if (nodes_[node].id >= 0) {
            best = i - pos;
            id = nodes_[node].id;
        }
        if (i >= text.size()) break;
        const auto& ch = nodes_[node].children;
        const auto b = static_cast<unsigned char>(text[i]);
        auto it = std::lower_bound(ch.begin(), ch.end(), std::make_pair(b, 0));
        node = (it != ch.end() && it->first == b) ? it->second : 0;
    }
    return best;
}

namespace {

struct Span {
    std::size_t begin, end;
    bool is_match;
};

// HF NormalizedString::split with a Pattern: the delimiter matches (with the gaps between them) reshaped by
// the behavior, empty pieces dropped.
void split_piece(const SplitRule& rule, std::string_view s, std::vector<std::string_view>& out) {
    thread_local std::vector<Span> spans, shaped;
    spans.clear();
    const std::string& unit = rule.literal;
    std::size_t prev = 0;
    if (!unit.empty()) {
        for (std::size_t at = s.find(unit); at != std::string_view::npos; at = s.find(unit, prev)) {
            std::size_t end = at + unit.size();
            if (rule.repeated)
                while (s.compare(end, unit.size(), unit) == 0) end += unit.size();
            if (at != prev) spans.push_back({prev, at, false});
            spans.push_back({at, end, true});
            prev = end;
        }
    }
    if (prev != s.size() || spans.empty()) spans.push_back({prev, s.size(), false});

    shaped.clear();
    bool previous_match = false;
    switch (rule.behavior) {
        case SplitBehavior::Isolated:
            shaped = spans;
            break;
        case SplitBehavior::Removed:
            for (const Span& sp : spans)
                if (!sp.is_match) shaped.push_back(sp);
            break;
        case SplitBehavior::Contiguous:
            for (const Span& sp : spans) {
                if (sp.is_match == previous_match && !shaped.empty())
                    shaped.back().end = sp.end;
                else
                    shaped.push_back(sp);
                previous_match = sp.is_match;
            }
            break;
        case SplitBehavior::MergedWithPrevious:
            for (const Span& sp : spans) {
                if (sp.is_match && !previous_match && !shaped.empty())
                    shaped.back().end = sp.end;
                else
                    shaped.push_back(sp);
                previous_match = sp.is_match;
            }
            break;
        case SplitBehavior::MergedWithNext:
            for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
                if (it->is_match && !previous_match && !shaped.empty())
                    shaped.back().begin = it->begin;
                else
                    shaped.push_back(*it);
                previous_match = it->is_match;
            }
            std::reverse(shaped.begin(), shaped.end());
            break;
    }
    for (const Span& sp : shaped)
        if (sp.end > sp.begin) out.push_back(s.substr(sp.begin, sp.end - sp.begin));
}

void replace_all(std::string& s, const std::string& pattern, const std::string& content) {
    if (pattern.empty()) return;
    std::size_t at = s.find(pattern);
    if (at == std::string::npos) return;
    std::string out;
    out.reserve(s.size() + s.size() / 2);
    std::size_t prev = 0;
    for (; at != std::string::npos; at = s.find(pattern, prev)) {
        out.append(s, prev, at - prev);
        out += content;
        prev = at + pattern.size();
    }
    out.append(s, prev);
    s.swap(out);
}

}  // namespace
}  // namespace tok

std::string Tokenizer::Impl::normalize(std::string_view s) const {
    std::string out(s);
    for (const auto& step : normalizer) {
        if (step.kind == tok::NormalizerStep::Replace)
            tok::replace_all(out, step.pattern, step.content);
        else if (!out.empty())
            out.insert(0, step.content);
    }
    return out;
}

std::string_view Tokenizer::Impl::piece(int id) const {
    if (id < 0 || id >= id_space) return {};
    if (added_index[id] >= 0) return added[added_index[id]].piece;
    return bpe.vocab().has_id(id) ? bpe.vocab().text(id) : std::string_view{};
}

int Tokenizer::Impl::byte_value(std::string_view p) const {
    // HF ByteFallback: a 6-byte token "<0x" .. ">" whose middle two characters parse with
    // u8::from_str_radix(16) (which also takes "+F").
    if (p.size() != 6 || p.substr(0, 3) != "<0x" || p[5] != '>') return -1;
    auto hex = [](char c) {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
    };
    if (p[3] == '+') return hex(p[4]);
    const int hi = hex(p[3]), lo = hex(p[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

bool Tokenizer::Impl::is_byte_piece(std::string_view p) const {
    return byte_fallback_decoder && byte_value(p) >= 0;
}

namespace {

// One stretch of text between raw-text added tokens.
void encode_gap(const Tokenizer::Impl& m, std::string_view gap, std::vector<int>& out) {
    std::string normalized;
    std::string_view text = gap;
    if (!m.normalizer.empty()) {
        normalized = m.normalize(gap);
        text = normalized;
    }
    auto encode_pieces = [&](std::string_view s) {
        if (s.empty()) return;
        if (m.pre_tokenizer.empty()) {
            m.bpe.encode_word(s, out);
            return;
        }
        thread_local std::vector<std::string_view> pieces, next;
        pieces.assign(1, s);
        for (const auto& rule : m.pre_tokenizer) {
            next.clear();
            for (std::string_view p : pieces) tok::split_piece(rule, p, next);
            pieces.swap(next);
        }
        for (std::string_view p : pieces) m.bpe.encode_word(p, out);
    };
    if (m.normalized_trie.empty()) {
        encode_pieces(text);
        return;
    }
    std::size_t start = 0;
    for (std::size_t i = 0; i < text.size();) {
        int id = -1;
        const std::size_t len = m.normalized_trie.match(text, i, id);
        if (len == 0) {
            ++i;
            continue;
        }
        encode_pieces(text.substr(start, i - start));
        out.push_back(id);
        i += len;
        start = i;
    }
    encode_pieces(text.substr(start));
}

}  // namespace

void Tokenizer::encode_append(std::string_view text, std::vector<int>& out) const {
    const std::size_t bad = tok::find_invalid_utf8(text);
    if (bad != std::string_view::npos)
        throw Error("the text to tokenize is not valid UTF-8 (bad byte 0x" +
                    std::string(1, "0123456789ABCDEF"[static_cast<unsigned char>(text[bad]) >> 4]) +
                    std::string(1, "0123456789ABCDEF"[static_cast<unsigned char>(text[bad]) & 15]) +
                    " at offset " + std::to_string(bad) + ")");
    const Impl& m = *impl_;
    if (m.raw_trie.empty()) {
        encode_gap(m, text, out);
        return;
    }
    std::size_t start = 0;
    for (std::size_t i = 0; i < text.size();) {
        int id = -1;
        const std::size_t len = m.raw_trie.match(text, i, id);
        if (len == 0) {
            ++i;
            continue;
        }
        if (i > start) encode_gap(m, text.substr(start, i - start), out);
        out.push_back(id);
        i += len;
        start = i;
    }
    if (start < text.size()) encode_gap(m, text.substr(start), out);
}

std::vector<int> Tokenizer::encode(std::string_view text) const {
    std::vector<int> ids;
    ids.reserve(text.size() / 3 + 4);
    encode_append(text, ids);
    return ids;
}

int Tokenizer::vocab_size() const {
    return impl_->id_space;
}

const std::string& Tokenizer::origin() const {
    return impl_->origin;
}

std::string_view Tokenizer::token_text(int id) const {
    return impl_->piece(id);
}

std::optional<int> Tokenizer::token_id(std::string_view piece) const {
    for (const auto& a : impl_->added)
        if (a.content == piece) return a.id;
    const int id = impl_->bpe.vocab().find(piece);
    if (id < 0) return std::nullopt;
    return id;
}

bool Tokenizer::is_added(int id) const {
    return id >= 0 && id < impl_->id_space && impl_->added_index[id] >= 0;
}

bool Tokenizer::is_special(int id) const {
    return is_added(id) && impl_->added[impl_->added_index[id]].special;
}

bool Tokenizer::is_byte_token(int id) const {
    return impl_->is_byte_piece(impl_->piece(id));
}

int Tokenizer::bos_id() const {
    return token_id("<bos>").value_or(-1);
}

Tokenizer::Stats Tokenizer::stats() const {
    return {impl_->bpe.vocab().size(), impl_->bpe.merge_count(), impl_->added.size()};
}

}  // namespace markbase
