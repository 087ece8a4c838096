#include "loading/weight_check.h"

#include <algorithm>
#include <atomic>
#include <thread>

namespace markbase {

namespace {

constexpr uint64_t kPieceElements = uint64_t{16} << 20;  // a work item of the full scan (32 MB)

struct Piece {
    size_t tensor;
    uint64_t begin, end;  // elements
    uint64_t count = 0;   // non-finite values in [begin, end)
    uint64_t first = 0;   // index of the first one
};

// A BF16 value is NaN or Inf when its 8 exponent bits are all ones: bits 7..14 of the little-endian
// 16-bit word, i.e. the low 7 bits of the high byte and the top bit of the low byte. Read as bytes: the
// data of a foreign file need not be 2-byte aligned.
bool non_finite(const uint8_t* p, uint64_t i) {
    return (p[2 * i + 1] & 0x7F) == 0x7F && (p[2 * i] & 0x80);
}

void scan(const TensorInfo& t, Piece& piece) {
    constexpr uint64_t kBlock = 4096;
    for (uint64_t b = piece.begin; b < piece.end; b += kBlock) {
        const uint64_t e = std::min(piece.end, b + kBlock);
        uint64_t bad = 0;
        for (uint64_t i = b; i < e; ++i) bad += non_finite(t.data, i);  // branch-free: vectorizes
        if (!bad) continue;
        if (!piece.count) {
            for (uint64_t i = b; i < e; ++i) {
                if (non_finite(t.data, i)) {
                    piece.first = i;
                    break;
                }
            }
        }
        piece.count += bad;
    }
}

std::string describe(const TensorInfo& t, uint64_t count, uint64_t first) {
    const uint8_t lo = t.data[2 * first], hi = t.data[2 * first + 1];
    const bool nan = (lo & 0x7F) != 0;  // any mantissa bit set
    const std::string what = nan ? "NaN" : (hi & 0x80) ? "-Inf" : "Inf";
    const uint64_t n = t.nbytes / 2;
    return t.file + ": tensor " + t.name + ": " + std::to_string(count) + " of " + std::to_string(n) +
           " values not finite (first at index " + std::to_string(first) + ": " + what + ")";
}

}  // namespace

std::vector<std::string> find_non_finite(const std::vector<const TensorInfo*>& tensors, bool all) {
    std::vector<Piece> pieces;
    for (size_t k = 0; k < tensors.size(); ++k) {
        const TensorInfo& t = *tensors[k];
        const uint64_t n = t.nbytes / 2;
        if (t.dtype != DType::BF16 || (!all && n > uint64_t(kAlwaysCheckedElements))) continue;
        for (uint64_t b = 0; b < n; b += kPieceElements)
            pieces.push_back({k, b, std::min(n, b + kPieceElements)});
    }
    std::atomic<size_t> next{0};
    auto work = [&] {
        for (size_t i = next++; i < pieces.size(); i = next++) scan(*tensors[pieces[i].tensor], pieces[i]);
    };
    const size_t threads =
        all ? std::min<size_t>(pieces.size(), std::clamp(std::thread::hardware_concurrency(), 1u, 16u)) : 0;
    std::vector<std::thread> pool;
    for (size_t i = 1; i < threads; ++i) pool.emplace_back(work);
    work();
    for (auto& th : pool) th.join();

    // Pieces of one tensor are adjacent and in order: the first piece with a hit holds the first index.
    std::vector<std::string> out;
    for (size_t i = 0; i < pieces.size();) {
        const size_t k = pieces[i].tensor;
        uint64_t count = 0, first = 0;
        for (; i < pieces.size() && pieces[i].tensor == k; ++i) {
            if (pieces[i].count && !count) first = pieces[i].first;
            count += pieces[i].count;
        }
        if (count) out.push_back(describe(*tensors[k], count, first));
    }
    return out;
}

}  // namespace markbase
