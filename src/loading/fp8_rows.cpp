#include "loading/fp8_rows.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <thread>

#include "model/fp8.h"

namespace markbase {

namespace {

constexpr int64_t kPieceWeights = int64_t{1} << 20;  // enough work per piece to hide the hand-out

struct Piece {
    size_t job;
    int64_t r0, r1;
};

struct PieceResult {
    int64_t non_finite = 0;
    int64_t first = std::numeric_limits<int64_t>::max();  // flat index of the first non-finite value
};

PieceResult run_piece(const RowJob& j, int64_t r0, int64_t r1) {
    PieceResult res;
    for (int64_t r = r0; r < r1; ++r) {
        const uint8_t* q = nullptr;
        if (j.src) {
            j.scale[r] = quantize_row_fp8(j.src + r * j.K, j.K, j.q_out + r * j.K);
            q = j.q_out + r * j.K;
        } else {
            q = j.parts[static_cast<size_t>(r / j.part_rows)] + (r % j.part_rows) * j.K;
            if (j.q_out) {
                std::memcpy(j.q_out + r * j.K, q, static_cast<size_t>(j.K));
                q = j.q_out + r * j.K;
            }
        }
        bf16* out = j.out + r * j.K;
        dequantize_row_fp8(q, j.scale[r], j.K, out);
        for (int64_t k = 0; k < j.K; ++k) {
            if ((out[k] & 0x7f80) != 0x7f80) continue;  // exponent all ones: Inf or NaN
            if (res.non_finite++ == 0) res.first = r * j.K + k;
        }
    }
    return res;
}

}  // namespace

std::vector<std::string> run_row_jobs(const std::vector<RowJob>& jobs, int threads) {
    std::vector<Piece> pieces;
    for (size_t i = 0; i < jobs.size(); ++i) {
        const int64_t step = std::max<int64_t>(1, kPieceWeights / std::max<int64_t>(jobs[i].K, 1));
        for (int64_t r = 0; r < jobs[i].rows; r += step)
            pieces.push_back({i, r, std::min(jobs[i].rows, r + step)});
    }
    std::vector<PieceResult> results(pieces.size());
    std::atomic<size_t> next{0};
    auto worker = [&] {
        for (size_t p = next++; p < pieces.size(); p = next++)
            results[p] = run_piece(jobs[pieces[p].job], pieces[p].r0, pieces[p].r1);
    };
    const int n = threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    std::vector<std::thread> pool;
    for (int t = 1; t < std::min<int64_t>(n, static_cast<int64_t>(pieces.size())); ++t)
        pool.emplace_back(worker);
    worker();
    for (std::thread& t : pool) t.join();

    std::vector<PieceResult> per_job(jobs.size());
    for (size_t p = 0; p < pieces.size(); ++p) {
        PieceResult& j = per_job[pieces[p].job];
        j.non_finite += results[p].non_finite;
        j.first = std::min(j.first, results[p].first);
    }
    std::vector<std::string> lines;
    for (size_t i = 0; i < jobs.size(); ++i) {
        if (per_job[i].non_finite == 0) continue;
        lines.push_back(jobs[i].file + ": tensor " + jobs[i].name + ": " +
                        std::to_string(per_job[i].non_finite) + " of " +
                        std::to_string(jobs[i].rows * jobs[i].K) +
                        " values not finite after FP8 dequantisation (first at index " +
                        std::to_string(per_job[i].first) + ")");
    }
    return lines;
}

}  // namespace markbase
