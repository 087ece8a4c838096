#include "parallel/nccl_comm.h"

#if defined(MARKBASE_HAS_NCCL)

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <string>

#include "model/error.h"

namespace markbase {

namespace {

void check_nccl(ncclResult_t r, const char* what) {
    if (r != ncclSuccess) throw Error(std::string("NCCL: ") + what + " failed: " + ncclGetErrorString(r));
}
void check_cuda(cudaError_t r, const char* what) {
    if (r != cudaSuccess) throw Error(std::string("CUDA: ") + what + " failed: " + cudaGetErrorString(r));
}

}  // namespace

struct NcclGroup::Impl {
    std::vector<int> devices;
    std::vector<ncclComm_t> comms;
};

NcclGroup::NcclGroup(const std::vector<int>& devices) : impl_(std::make_unique<Impl>()) {
    if (devices.empty()) throw Error("NCCL: no devices given");
    setenv("NCCL_NVLS_ENABLE", "0", 1);  // never NVLink multicast here (see the header)
    impl_->devices = devices;
    impl_->comms.resize(devices.size());
    check_nccl(ncclCommInitAll(impl_->comms.data(), static_cast<int>(devices.size()), devices.data()),
               "ncclCommInitAll");
}

NcclGroup::~NcclGroup() {
    for (ncclComm_t c : impl_->comms)
        if (c) ncclCommDestroy(c);
}

int NcclGroup::world() const {
    return static_cast<int>(impl_->devices.size());
}

void NcclGroup::all_reduce_sum(const std::vector<float*>& buffers, size_t n,
                               const std::vector<void*>& streams) {
    const size_t w = impl_->devices.size();
    if (buffers.size() != w || streams.size() != w)
        throw Error("NCCL all-reduce: one buffer and stream per rank");
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (size_t i = 0; i < w; ++i) {
        check_cuda(cudaSetDevice(impl_->devices[i]), "cudaSetDevice");
        check_nccl(ncclAllReduce(buffers[i], buffers[i], n, ncclFloat, ncclSum, impl_->comms[i],
                                 static_cast<cudaStream_t>(streams[i])),
                   "ncclAllReduce");
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
}

void NcclGroup::all_reduce_sum(int rank, float* buffer, size_t n, void* stream) {
    check_nccl(ncclAllReduce(buffer, buffer, n, ncclFloat, ncclSum,
                             impl_->comms.at(static_cast<size_t>(rank)), static_cast<cudaStream_t>(stream)),
               "ncclAllReduce (sum)");
}

void NcclGroup::all_reduce_max_u64(int rank, unsigned long long* buffer, size_t n, void* stream) {
    check_nccl(ncclAllReduce(buffer, buffer, n, ncclUint64, ncclMax,
                             impl_->comms.at(static_cast<size_t>(rank)), static_cast<cudaStream_t>(stream)),
               "ncclAllReduce (max)");
}

int NcclGroup::device(int rank) const {
    return impl_->devices.at(static_cast<size_t>(rank));
}

int NcclGroup::device_count() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

}  // namespace markbase

#else  // no NCCL in this build

#include "model/error.h"

namespace markbase {

struct NcclGroup::Impl {};
NcclGroup::NcclGroup(const std::vector<int>&) {
    throw Error(
        "this build has no NCCL (it needs the CUDA backend and nccl.h): multi-GPU runs are unavailable");
}
NcclGroup::~NcclGroup() = default;
int NcclGroup::world() const {
    return 0;
}
void NcclGroup::all_reduce_sum(const std::vector<float*>&, size_t, const std::vector<void*>&) {}
void NcclGroup::all_reduce_sum(int, float*, size_t, void*) {}
void NcclGroup::all_reduce_max_u64(int, unsigned long long*, size_t, void*) {}
int NcclGroup::device(int) const {
    return 0;
}
int NcclGroup::device_count() {
    return 0;
}

}  // namespace markbase

#endif
