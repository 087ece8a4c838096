// One process driving every GPU of the host (issue 7): an NCCL communicator per device, made together with
// ncclCommInitAll, and the sum all-reduce a tensor-parallel decode step needs after o_proj and the FFN.
// NVLink multicast (NVLS) is switched off before NCCL starts: on the shared machines here it can take the
// host's GPUs out of service, so NCCL_NVLS_ENABLE=0 is forced and cuMulticastCreate is never called. Built
// only with CUDA and NCCL (MARKBASE_HAS_NCCL); the partition arithmetic (partition.h) needs neither.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace markbase {

class NcclGroup {
  public:
    // Communicators over `devices` (CUDA ordinals), rank i on devices[i]. Throws markbase::Error on failure.
    explicit NcclGroup(const std::vector<int>& devices);
    ~NcclGroup();
    NcclGroup(const NcclGroup&) = delete;
    NcclGroup& operator=(const NcclGroup&) = delete;

    int world() const;
    // In-place sum over ranks of n floats: buffers[i] is on devices[i]; streams[i] (cudaStream_t, may be
    // null) orders it with that rank's work. Enqueued as one NCCL group so it can sit inside a captured
    // graph.
    void all_reduce_sum(const std::vector<float*>& buffers, size_t n, const std::vector<void*>& streams);

    // The same collectives for one rank, enqueued on its stream alone: for one host thread per GPU, each
    // capturing its own decode graph with the collectives inside (the caller has made devices[rank] current).
    void all_reduce_sum(int rank, float* buffer, size_t n, void* stream);
    // Element-wise max of n 64-bit keys (the (logit, id) argmax keys of the ranks' vocabulary slices).
    void all_reduce_max_u64(int rank, unsigned long long* buffer, size_t n, void* stream);
    int device(int rank) const;

    static int device_count();  // CUDA devices visible; 0 when there is no driver

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace markbase
