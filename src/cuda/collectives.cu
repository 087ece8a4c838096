// A tensor-parallel rank's side of the collectives (issue 7): NCCL sums and the argmax max, the NVLink peer
// sums of the decode step (peer_sum.cu) and their buffers, and host logits rows of the whole vocabulary of
// which the rank writes its columns. On a model that is not sharded the collectives do nothing.
#include "cuda/model.h"
#include "parallel/nccl_comm.h"

namespace markbase::cuda {

void CudaModel::logits_to_host(float* host, const float* dev, int rows) {
    const int64_t V = c_.vocab_size;
    if (!sharded()) {
        CUDA_CHECK(cudaMemcpyAsync(host, dev, static_cast<size_t>(rows) * V * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream_));
        return;
    }
    CUDA_CHECK(cudaMemcpy2DAsync(host + shard_.vocab_begin, shard_.vocab_total * sizeof(float), dev,
                                 V * sizeof(float), V * sizeof(float), rows, cudaMemcpyDeviceToHost,
                                 stream_));
}

void CudaModel::connect() {
    if (!sharded()) return;
    all_reduce(nullptr, -1, act_.x, static_cast<size_t>(c_.hidden));
    all_reduce_argmax(nullptr);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
}

CudaModel::PeerEndpoint CudaModel::peer_endpoint() {
    if (!sharded()) throw Error("internal: peer_endpoint on a model that is not sharded");
    const int world = shard_.world,
              max_n = 2 * c_.hidden;  // the largest decode sum: the MoE's [dense | experts]
    PeerEndpoint e;
    e.inbox = alloc<float>(static_cast<size_t>(2) * world * max_n);
    e.flags = alloc<unsigned long long>(static_cast<size_t>(world) + 1);  // + this rank's call count
    CUDA_CHECK(cudaMemset(e.flags, 0, (world + 1) * sizeof(unsigned long long)));
    int* timed_out = alloc<int>(1);
    CUDA_CHECK(cudaMemset(timed_out, 0, sizeof(int)));
    ps_.max_n = max_n;
    ps_.calls = e.flags + world;
    ps_.timed_out = timed_out;
    return e;
}

void CudaModel::use_peers(const std::vector<PeerEndpoint>& ranks) {
    if (static_cast<int>(ranks.size()) != shard_.world || shard_.world > kMaxPeers || !ps_.calls)
        throw Error("internal: use_peers needs every rank's endpoint (world " + std::to_string(shard_.world) +
                    ")");
    if (!step_graphs_.empty()) throw Error("internal: use_peers after the decode graph was captured");
    for (size_t q = 0; q < ranks.size(); ++q) {
        ps_.inbox[q] = ranks[q].inbox;
        ps_.flags[q] = ranks[q].flags;
    }
    ps_.rank = shard_.rank;
    ps_.world = shard_.world;
}

bool CudaModel::peer_timed_out() {
    if (!ps_.timed_out) return false;
    int v = 0;
    CUDA_CHECK(cudaMemcpy(&v, ps_.timed_out, sizeof v, cudaMemcpyDeviceToHost));
    return v != 0;
}

void CudaModel::all_reduce(Profiler* pf, int layer, float* buf, size_t n) {
    if (!sharded()) return;
    if (peer_ready(n)) {
        run(pf, "peer_sum", layer, 0.0, [&] { peer_sum(ps_, buf, static_cast<int>(n), nullptr, stream_); });
        return;
    }
    run(pf, "all_reduce", layer, 0.0, [&] { shard_.group->all_reduce_sum(shard_.rank, buf, n, stream_); });
}

void CudaModel::all_reduce_argmax(Profiler* pf) {
    if (!sharded()) return;
    run(pf, "argmax_all_reduce", -1, 0.0,
        [&] { shard_.group->all_reduce_max_u64(shard_.rank, st_.d_argmax, 1, stream_); });
}

}  // namespace markbase::cuda
