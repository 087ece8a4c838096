#include "tokenizer/bpe.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>

#include "model/error.h"
#include "tokenizer/utf8.h"

namespace markbase::tok {

namespace {

// Ids index flat arrays; a corrupt file must not make us allocate gigabytes.
constexpr int64_t kMaxId = (int64_t{1} << 24) - 1;

uint64_t mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

std::size_t table_capacity(std::size_t n) {
    std::size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;  // load factor <= 0.5 keeps linear probes short
    return cap;
}

std::string quoted(std::string_view s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '\n')
            out += "\\n";
        else if (c == '\t')
            out += "\\t";
        else if (c == '"')
            out += "\\\"";
        else
            out += c;
    }
    return out + "\"";
}

}  // namespace

uint64_t hash_bytes(std::string_view s) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ s.size();
    const char* p = s.data();
    std::size_t n = s.size();
    while (n >= 8) {
        uint64_t w;
        std::memcpy(&w, p, 8);
        h = mix(h ^ w);
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    return mix(h ^ w ^ (uint64_t{n} << 59));
}

void Vocab::build(const std::vector<Entry>& entries, const std::string& origin) {
    int64_t max_id = -1;
    std::size_t total = 0;
    for (const Entry& e : entries) {
        if (e.id < 0 || e.id > kMaxId)
            throw Error(origin + ": model.vocab gives token " + quoted(e.text) + " the id " +
                        std::to_string(e.id) + ", outside 0.." + std::to_string(kMaxId));
        max_id = std::max(max_id, e.id);
        total += e.text.size();
    }
    if (total >= 0xFFFFFFFFull) throw Error(origin + ": model.vocab is too large");
    const std::size_t n_ids = static_cast<std::size_t>(max_id + 1);
    present_.assign(n_ids, 0);
    std::vector<uint32_t> lengths(n_ids, 0);
    for (const Entry& e : entries) {
        if (present_[e.id])
            throw Error(origin + ": model.vocab gives the id " + std::to_string(e.id) + " to two tokens");
        present_[e.id] = 1;
        lengths[e.id] = static_cast<uint32_t>(e.text.size());
    }
    offsets_.assign(n_ids + 1, 0);
    for (std::size_t i = 0; i < n_ids; ++i) offsets_[i + 1] = offsets_[i] + lengths[i];
    arena_.assign(total, '\0');
    for (const Entry& e : entries) std::memcpy(arena_.data() + offsets_[e.id], e.text.data(), e.text.size());

    count_ = entries.size();
    const std::size_t cap = table_capacity(count_);
    mask_ = cap - 1;
    slots_.assign(cap, Slot{0, -1, 0, 0});
    for (const Entry& e : entries) {
        const uint64_t h = hash_bytes(e.text);
        std::size_t i = h & mask_;
        while (slots_[i].id >= 0) {
            if (slots_[i].tag == static_cast<uint32_t>(h >> 32) && text(slots_[i].id) == e.text)
                throw Error(origin + ": model.vocab lists the token " + quoted(e.text) + " twice");
            i = (i + 1) & mask_;
        }
        slots_[i] = {static_cast<uint32_t>(h >> 32), static_cast<int32_t>(e.id), offsets_[e.id],
                     static_cast<uint32_t>(e.text.size())};
    }
}

int Vocab::find(std::string_view token, uint64_t h) const {
    if (slots_.empty()) return -1;
    const auto tag = static_cast<uint32_t>(h >> 32);
    for (std::size_t i = h & mask_;; i = (i + 1) & mask_) {
        const Slot& s = slots_[i];
        if (s.id < 0) return -1;
        if (s.tag == tag && s.length == token.size()) {
            // Tokens are a few bytes long: a plain loop beats the libc call here.
            const char* a = arena_.data() + s.offset;
            std::size_t k = 0;
            while (k < token.size() && a[k] == token[k]) ++k;
            if (k == token.size()) return s.id;
        }
    }
}

void BpeModel::insert_merge(int left, int right, uint32_t rank, int new_id) {
    const uint64_t key =
        (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
    for (std::size_t i = mix(key) & merge_mask_;; i = (i + 1) & merge_mask_) {
        MergeSlot& s = merges_[i];
        if (s.key == kEmpty) {
            s = {key, rank, new_id};
            ++merge_count_;
            return;
        }
        if (s.key == key) {  // HF builds a HashMap from the list: a repeated pair keeps its last rank
            s.rank = rank;
            s.new_id = new_id;
            return;
        }
    }
}

const BpeModel::MergeSlot* BpeModel::find_merge(int left, int right) const {
    const uint64_t key =
        (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
    for (std::size_t i = mix(key) & merge_mask_;; i = (i + 1) & merge_mask_) {
        const MergeSlot& s = merges_[i];
        if (s.key == key) return &s;
        if (s.key == kEmpty) return nullptr;
    }
}

namespace {

using MergeList = std::vector<std::pair<std::string_view, std::string_view>>;

// A merge as (left, right, result) ids; an id is -1 where that token is not in the vocabulary.
struct ResolvedMerge {
    int a, b, c;
};

// Resolves merges[begin, end) into `resolved`; returns the first rank that does not resolve, or npos. The
// lookups miss the cache almost every time, so this hashes a few merges ahead and prefetches their slots to
// overlap the misses.
std::size_t resolve_range(const Vocab& vocab, const MergeList& merges, std::vector<ResolvedMerge>& resolved,
                          std::size_t begin, std::size_t end) {
    constexpr std::size_t kAhead = 16;
    struct Hashes {
        uint64_t l, r, joined;
    };
    std::array<Hashes, kAhead> ahead{};
    std::string joined;
    auto prepare = [&](std::size_t k) {
        const auto& [l, r] = merges[k];
        joined.assign(l);
        joined.append(r);
        Hashes h{hash_bytes(l), hash_bytes(r), hash_bytes(joined)};
        vocab.prefetch(h.l);
        vocab.prefetch(h.r);
        vocab.prefetch(h.joined);
        ahead[k % kAhead] = h;
    };
    for (std::size_t k = begin; k < std::min(begin + kAhead, end); ++k) prepare(k);
    for (std::size_t rank = begin; rank < end; ++rank) {
        const Hashes h = ahead[rank % kAhead];
        if (rank + kAhead < end) prepare(rank + kAhead);
        const auto& [l, r] = merges[rank];
        joined.assign(l);
        joined.append(r);
        resolved[rank] = {vocab.find(l, h.l), vocab.find(r, h.r), vocab.find(joined, h.joined)};
        if (resolved[rank].a < 0 || resolved[rank].b < 0 || resolved[rank].c < 0) return rank;
    }
    return std::string::npos;
}

// Every merge resolved to ids, the ranks split over a few threads (read-only on the vocabulary). Throws
// naming the lowest rank that does not resolve.
std::vector<ResolvedMerge> resolve_merges(const Vocab& vocab, const MergeList& merges,
                                          const std::string& origin) {
    std::vector<ResolvedMerge> resolved(merges.size());
    const std::size_t n_threads =
        merges.size() < 100000 ? 1 : std::clamp<std::size_t>(std::thread::hardware_concurrency(), 1, 8);
    std::vector<std::size_t> bad(n_threads, std::string::npos);
    {
        std::vector<std::thread> workers;
        const std::size_t chunk = (merges.size() + n_threads - 1) / n_threads;
        for (std::size_t t = 1; t < n_threads; ++t)
            workers.emplace_back([&, t] {
                bad[t] = resolve_range(vocab, merges, resolved, std::min(t * chunk, merges.size()),
                                       std::min((t + 1) * chunk, merges.size()));
            });
        bad[0] = resolve_range(vocab, merges, resolved, 0, std::min(chunk, merges.size()));
        for (auto& w : workers) w.join();
    }
    for (std::size_t rank : bad) {
        if (rank == std::string::npos) continue;
        const auto& [l, r] = merges[rank];
        const std::string joined = std::string(l) + std::string(r);
        const ResolvedMerge& x = resolved[rank];
        const char* missing = x.a < 0 ? "its left token" : x.b < 0 ? "its right token" : "its result";
        const std::string_view which = x.a < 0 ? l : x.b < 0 ? r : std::string_view(joined);
        throw Error(origin + ": model.merges[" + std::to_string(rank) + "] (" + quoted(l) + " + " +
                    quoted(r) + "): " + missing + " " + quoted(which) + " is not in model.vocab");
    }
    return resolved;
}

}  // namespace

void BpeModel::build(const std::vector<Vocab::Entry>& vocab,
                     const std::vector<std::pair<std::string_view, std::string_view>>& merges,
                     const BpeOptions& options, const std::string& origin) {
    vocab_.build(vocab, origin);
    options_ = options;
    unk_id_ = -1;
    if (!options.unk_token.empty()) {
        unk_id_ = vocab_.find(options.unk_token);
        if (unk_id_ < 0)
            throw Error(origin + ": model.unk_token " + quoted(options.unk_token) + " is not in model.vocab");
    }
    for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", b);
        byte_ids_[b] = vocab_.find(name);
    }
    for (int c = 0; c < 128; ++c) ascii_ids_[c] = vocab_.find(std::string(1, static_cast<char>(c)));

    const std::vector<ResolvedMerge> resolved = resolve_merges(vocab_, merges, origin);
    merge_count_ = 0;
    const std::size_t cap = table_capacity(merges.size());
    merge_mask_ = cap - 1;
    merges_.assign(cap, MergeSlot{kEmpty, 0, 0});
    for (std::size_t rank = 0; rank < resolved.size(); ++rank) {
        if (rank + 16 < resolved.size()) {
            const ResolvedMerge& f = resolved[rank + 16];
            const uint64_t key =
                (static_cast<uint64_t>(static_cast<uint32_t>(f.a)) << 32) | static_cast<uint32_t>(f.b);
            __builtin_prefetch(&merges_[mix(key) & merge_mask_], 1);
        }
        insert_merge(resolved[rank].a, resolved[rank].b, static_cast<uint32_t>(rank), resolved[rank].c);
    }
}

// Applies merges to count >= 2 symbols until none applies. A min-heap of (rank << 32 | pos): HF's Merge
// ordering, lowest rank first and leftmost on ties, packed in one integer so that heap moves compare 8 bytes.
// An entry is stale when the pair at pos no longer has that rank; ranks identify pairs, so this is HF's "same
// new_id" check. The symbols come as a plain array: the list no longer grows here, and the compiler keeps the
// pointer in a register instead of reloading it from the vector.
void BpeModel::merge_symbols(Symbol* syms, std::size_t count) const {
    // thread_local scratch, as in encode_word.
    thread_local std::vector<uint64_t> heap;
    thread_local std::vector<uint8_t> alive;
    heap.clear();
    auto push = [&](uint32_t rank, int pos) {
        heap.push_back((static_cast<uint64_t>(rank) << 32) | static_cast<uint32_t>(pos));
        std::push_heap(heap.begin(), heap.end(), std::greater<>());
    };
    alive.assign(count, 1);
    for (std::size_t i = 0; i + 1 < count; ++i)
        if (const MergeSlot* m = find_merge(syms[i].id, syms[i + 1].id))
            heap.push_back((static_cast<uint64_t>(m->rank) << 32) | i);
    std::make_heap(heap.begin(), heap.end(), std::greater<>());
    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end(), std::greater<>());
        const uint64_t top = heap.back();
        heap.pop_back();
        const int pos = static_cast<int>(top & 0xFFFFFFFFu);
        const auto rank = static_cast<uint32_t>(top >> 32);
        Symbol& cur = syms[pos];
        if (!alive[pos] || cur.next < 0) continue;
        const MergeSlot* m = find_merge(cur.id, syms[cur.next].id);
        if (!m || m->rank != rank) continue;
        const int right = cur.next;
        cur.id = m->new_id;
        cur.next = syms[right].next;
        alive[right] = 0;
        if (cur.next >= 0) syms[cur.next].prev = pos;
        if (cur.prev >= 0)
            if (const MergeSlot* p = find_merge(syms[cur.prev].id, cur.id)) push(p->rank, cur.prev);
        if (cur.next >= 0)
            if (const MergeSlot* n = find_merge(cur.id, syms[cur.next].id)) push(n->rank, pos);
    }
}

void BpeModel::encode_word(std::string_view word, std::vector<int>& out) const {
    if (word.empty()) return;
    if (options_.ignore_merges) {
        const int whole = vocab_.find(word);
        if (whole >= 0) {
            out.push_back(whole);
            return;
        }
    }
    // thread_local scratch: encode is const and may run on several threads; this avoids an allocation per
    // word. (The character loop stays here, adding through a lambda on the thread_local itself: moved into a
    // helper that takes the vector by reference, it measured ~1.5% more instructions per word.)
    thread_local std::vector<Symbol> syms;
    syms.clear();
    auto add = [&](int id) {
        const int i = static_cast<int>(syms.size());
        syms.push_back({id, i - 1, -1});
        if (i > 0) syms[i - 1].next = i;
    };
    // Characters to initial symbols, as HF BPE::merge_word. Quirk kept on purpose: a byte-fallback character
    // does not flush a pending <unk>, so the <unk> lands after it.
    bool pending_unk = false;
    for (std::size_t i = 0; i < word.size();) {
        const auto lead = static_cast<unsigned char>(word[i]);
        const std::size_t len = std::min(utf8_len(lead), word.size() - i);
        const int id = lead < 0x80 ? ascii_ids_[lead] : vocab_.find(word.substr(i, len));
        if (id >= 0) {
            if (pending_unk) add(unk_id_);
            pending_unk = false;
            add(id);
        } else {
            bool done = false;
            if (options_.byte_fallback) {
                bool all = true;
                for (std::size_t k = 0; k < len; ++k)
                    all = all && byte_ids_[static_cast<unsigned char>(word[i + k])] >= 0;
                if (all) {
                    for (std::size_t k = 0; k < len; ++k)
                        add(byte_ids_[static_cast<unsigned char>(word[i + k])]);
                    done = true;
                }
            }
            if (!done && unk_id_ >= 0) {
                if (pending_unk && !options_.fuse_unk) add(unk_id_);
                pending_unk = true;
            }
        }
        i += len;
    }
    if (pending_unk) add(unk_id_);
    if (syms.empty()) return;
    if (syms.size() > 1) merge_symbols(syms.data(), syms.size());
    for (int i = 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
}

}  // namespace markbase::tok
