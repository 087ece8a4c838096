#include "loading/quant_rows.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <thread>

#include "model/fp8.h"
#include "model/int4.h"

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

// Row r's quantised bytes: made from src, or the published row (copied into q_out where that is set).
const uint8_t* quantised_row(const RowJob& j, int64_t r) {
    const int64_t bytes = quant_row_bytes(j.format, j.K), spr = quant_scales_per_row(j.format, j.K);
    if (j.src) {
        uint8_t* q = j.q_out + r * bytes;
        if (j.format == WeightFormat::kFp8)
            j.scale[r] = quantize_row_fp8(j.src + r * j.K, j.K, q);
        else
            quantize_row_int4(j.src + r * j.K, j.K, q, j.scale + r * spr,
                              j.zero ? j.zero + r * spr : nullptr);
        return q;
    }
    const int64_t stride = j.part_stride ? j.part_stride : bytes;
    const uint8_t* q = j.parts[static_cast<size_t>(r / j.part_rows)] + (r % j.part_rows) * stride;
    if (!j.q_out) return q;
    std::memcpy(j.q_out + r * bytes, q, static_cast<size_t>(bytes));
    return j.q_out + r * bytes;
}

PieceResult run_piece(const RowJob& j, int64_t r0, int64_t r1) {
    PieceResult res;
    const int64_t spr = quant_scales_per_row(j.format, j.K);
    for (int64_t r = r0; r < r1; ++r) {
        const uint8_t* q = quantised_row(j, r);
        bf16* out = j.out + r * j.K;
        if (j.format == WeightFormat::kFp8)
            dequantize_row_fp8(q, j.scale[r], j.K, out);
        else
            dequantize_row_int4(q, j.scale + r * spr, j.zero ? j.zero + r * spr : nullptr, j.K, out);
        for (int64_t k = 0; k < j.K; ++k) {
            if ((out[k] & 0x7f80) != 0x7f80) continue;  // exponent all ones: Inf or NaN
            if (res.non_finite++ == 0) res.first = r * j.K + k;
        }
    }
    return res;
}

}  // namespace

int64_t quant_row_bytes(WeightFormat f, int64_t K) {
    return f == WeightFormat::kFp8 ? K : (K + 1) / 2;
}

int64_t quant_scales_per_row(WeightFormat f, int64_t K) {
    return f == WeightFormat::kFp8 ? 1 : int4_groups(K);
}

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
                        std::to_string(jobs[i].rows * jobs[i].K) + " values not finite after " +
                        (jobs[i].format == WeightFormat::kFp8 ? "FP8" : "int4") +
                        " dequantisation (first at index " + std::to_string(per_job[i].first) + ")");
    }
    return lines;
}

}  // namespace markbase
