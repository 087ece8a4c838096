// Decoding, as HF TokenizerImpl::decode: ids -> pieces (added tokens first), special ones dropped on request,
// then the decoder chain (Replace per piece, ByteFallback per run of <0xXX> pieces, Fuse), joined.
#include <algorithm>

#include "model/error.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace markbase {

namespace {

void replace_in(std::string& s, const std::string& pattern, const std::string& content) {
    if (pattern.empty()) return;
    std::size_t at = s.find(pattern);
    while (at != std::string::npos) {
        s.replace(at, pattern.size(), content);
        at = s.find(pattern, at + content.size());
    }
}

void check_id(const Tokenizer::Impl& m, int id) {
    if (id < 0 || id >= m.id_space)
        throw Error("token id " + std::to_string(id) + " is outside the vocabulary (0.." +
                    std::to_string(m.id_space - 1) + ")");
}

std::string decode_impl(const Tokenizer::Impl& m, std::span<const int> ids, bool skip_special) {
    std::vector<std::string> toks;
    toks.reserve(ids.size());
    for (int id : ids) {
        check_id(m, id);
        const int ai = m.added_index[id];
        if (skip_special && ai >= 0 && m.added[ai].special) continue;
        if (ai < 0 && !m.bpe.vocab().has_id(id)) continue;  // a hole in the id space: HF drops it
        toks.emplace_back(m.piece(id));
    }
    std::string out;
    if (!m.has_decoder) {
        for (std::size_t i = 0; i < toks.size(); ++i) {
            if (i) out += ' ';
            out += toks[i];
        }
        return out;
    }
    for (const auto& step : m.decoder) {
        switch (step.kind) {
            case tok::DecoderStep::Replace:
                for (auto& t : toks) replace_in(t, step.pattern, step.content);
                break;
            case tok::DecoderStep::ByteFallback: {
                std::vector<std::string> next;
                std::string bytes;
                auto flush_bytes = [&]() {
                    if (bytes.empty()) return;
                    // HF: the whole run becomes one string if it is valid UTF-8, else one U+FFFD per byte.
                    if (tok::find_invalid_utf8(bytes) == std::string::npos) {
                        next.push_back(bytes);
                    } else {
                        for (std::size_t k = 0; k < bytes.size(); ++k) next.emplace_back("\xEF\xBF\xBD");
                    }
                    bytes.clear();
                };
                for (auto& t : toks) {
                    const int b = m.byte_value(t);
                    if (b >= 0) {
                        bytes.push_back(static_cast<char>(b));
                    } else {
                        flush_bytes();
                        next.push_back(std::move(t));
                    }
                }
                flush_bytes();
                toks.swap(next);
                break;
            }
            case tok::DecoderStep::Fuse: {
                std::string joined;
                for (const auto& t : toks) joined += t;
                toks.assign(1, std::move(joined));
                break;
            }
        }
    }
    for (const auto& t : toks) out += t;
    return out;
}

// True when the decoder chain will read this id as a byte (Replace steps before ByteFallback applied first).
bool stream_holds(const Tokenizer::Impl& m, int id) {
    if (!m.byte_fallback_decoder) return false;
    std::string p(m.piece(id));
    for (const auto& step : m.decoder) {
        if (step.kind == tok::DecoderStep::ByteFallback) return m.byte_value(p) >= 0;
        if (step.kind == tok::DecoderStep::Replace) replace_in(p, step.pattern, step.content);
    }
    return false;
}

}  // namespace

std::string Tokenizer::decode(std::span<const int> ids, bool skip_special) const {
    return decode_impl(*impl_, ids, skip_special);
}

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

std::string StreamDecoder::push(int id) {
    const Tokenizer::Impl& m = *tokenizer_.impl_;
    check_id(m, id);
    const int ai = m.added_index[id];
    // Dropped ids never break a byte run: HF filters them out before the decoder sees the pieces.
    if (skip_special_ && ai >= 0 && m.added[ai].special) return {};
    if (ai < 0 && !m.bpe.vocab().has_id(id)) return {};
    if (!m.has_decoder) {
        std::string out = started_ ? " " : "";
        started_ = true;
        return out += m.piece(id);
    }
    held_.push_back(id);
    if (stream_holds(m, id)) return {};
    return flush();
}

std::string StreamDecoder::flush() {
    if (held_.empty()) return {};
    std::string out = decode_impl(*tokenizer_.impl_, held_, skip_special_);
    held_.clear();
    return out;
}

}  // namespace markbase
