// A batched step's sampled rows cut on the device: the serving engine's sequences that sample (temperature,
// top-k, penalties) need only each row's k best candidates after the penalties, as decode_select gives one
// sequence, not the row. A 262,144-float row is 1 MB to copy and ~2 ms of host sampling (bench's sampled
// decode: 4.88 against 2.24 ms a token with the row copied), so at 100 sampled sequences a step's rows
// would cost ~40x the step; here one launch pair selects every row (topk_select_rows: a grid of slices x
// rows, the window's penalties first, then a merging block a row; one row alone costs the one-sequence
// decode ~0.25 ms, so row after row would be ~25 ms at 100), and k keys a row cross the bus in one copy. The
// draw stays on the host (Sampler::sample_top), so the ids are the host sampler's over the whole row.
#include <algorithm>
#include <string>

#include "cuda/kernels/kernels.h"
#include "cuda/model.h"

namespace markbase::cuda {

void CudaModel::batch_row_logits(int row, float* host) {
    if (!batch_rows_ || row < 0 || row >= batch_n_)
        throw Error("internal: row " + std::to_string(row) + " of a batched step of " +
                    std::to_string(batch_n_));
    const int64_t V = c_.vocab_size;
    CUDA_CHECK(
        cudaMemcpyAsync(host, batch_rows_ + row * V, V * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaModel::batch_select(BatchRowSelect* rows, int m) {
    if (m < 0 || m > batch_select_rows())
        throw Error("internal: batch_select of " + std::to_string(m) + " rows; this model selects at most " +
                    std::to_string(batch_select_rows()));
    const int64_t V = c_.vocab_size;
    constexpr int P = 2 * kMaxPenaltyIds;           // a row's window: ids, then counts
    for (int c0 = 0; c0 < m; c0 += kTopKRowsMax) {  // one launch pair for up to kTopKRowsMax rows
        TopkRows a;
        a.logits = batch_rows_;
        a.row_stride = V;
        a.pen = st_.d_pen + int64_t{c0} * P;
        a.pen_stride = P;
        a.slices = st_.d_sel_slices;  // the stream orders the next launch pair after this one
        a.out = st_.d_sel_top + int64_t{c0} * kTopKMax;
        a.info = st_.d_sel_info + 2 * c0;
        a.n = std::min(kTopKRowsMax, m - c0);
        for (int j = 0; j < a.n; ++j) {
            const int i = c0 + j;
            const DeviceSelect& q = *rows[i].req;
            const int n_pen = static_cast<int>(q.pen_ids.size());
            if (!batch_rows_ || rows[i].row < 0 || rows[i].row >= batch_n_ || q.k < 1 || q.k > kTopKMax ||
                n_pen > kMaxPenaltyIds || q.pen_counts.size() != q.pen_ids.size())
                throw Error("internal: batch_select of row " + std::to_string(rows[i].row) + " (k " +
                            std::to_string(q.k) + ", " + std::to_string(n_pen) +
                            " penalty ids) after a step of " + std::to_string(batch_n_));
            if (n_pen) {  // pinned, one window a row: the copies queue without a sync
                int* h = st_.h_pen + int64_t{i} * P;
                std::copy(q.pen_ids.begin(), q.pen_ids.end(), h);
                std::copy(q.pen_counts.begin(), q.pen_counts.end(), h + n_pen);
                CUDA_CHECK(cudaMemcpyAsync(st_.d_pen + int64_t{i} * P, h, 2 * n_pen * sizeof(int),
                                           cudaMemcpyHostToDevice, stream_));
            }
            a.row[j] = rows[i].row;
            a.n_pen[j] = n_pen;
            a.k[j] = q.k;
            a.rp[j] = q.repeat_penalty;
            a.pp[j] = q.presence_penalty;
            a.fp[j] = q.frequency_penalty;
        }
        topk_select_rows(a, static_cast<int>(V), stream_);
    }
    if (m == 0) return;
    CUDA_CHECK(cudaMemcpyAsync(st_.h_sel_top, st_.d_sel_top,
                               int64_t{m} * kTopKMax * sizeof(unsigned long long), cudaMemcpyDeviceToHost,
                               stream_));
    CUDA_CHECK(cudaMemcpyAsync(st_.h_sel_info, st_.d_sel_info, 2 * int64_t{m} * sizeof(int),
                               cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (int i = 0; i < m; ++i) {
        BatchRowSelect& r = rows[i];
        r.out->ok = st_.h_sel_info[2 * i + 1] == 0;
        if (!r.out->ok) {  // NaN or +inf: the host sampler names the problem from the whole row
            batch_row_logits(r.row, r.fallback);
            continue;
        }
        r.out->n_finite = st_.h_sel_info[2 * i];
        unpack_top(st_.h_sel_top + int64_t{i} * kTopKMax, r.req->k, 0, &r.out->top);
    }
}

}  // namespace markbase::cuda
