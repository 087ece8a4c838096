// bench --profile: one decode step, or one prefill chunk, run without a graph with events around each launch
// (profiler.h), and the launch hooks' skip list.
#include "cuda/model.h"

namespace markbase::cuda {

std::vector<CudaProfileEntry> Profiler::collect() {
    std::vector<CudaProfileEntry> out;
    for (auto& r : recs_) {
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, r.start, r.stop));
        cudaEventDestroy(r.start);
        cudaEventDestroy(r.stop);
        r.start = r.stop = nullptr;
        out.push_back({r.kernel, r.layer, ms, r.bytes});
    }
    recs_.clear();
    return out;
}

void Profiler::discard() {
    for (auto& r : recs_) {
        if (r.start) cudaEventDestroy(r.start);
        if (r.stop) cudaEventDestroy(r.stop);
    }
    recs_.clear();
}

bool LaunchHooks::skipped(const char* name) const {
    for (const std::string& s : skip)
        if (s == name) return true;
    return false;
}

std::vector<CudaProfileEntry> CudaModel::profile_prefill(const int* ids, int n) {
    if (sharded()) throw Error("the per-kernel profile runs on one GPU: use --tensor-parallel-size 1");
    Profiler pf;
    prefill_pf_ = &pf;
    try {
        prefill(ids, n, nullptr, false);
    } catch (...) {
        prefill_pf_ = nullptr;
        throw;
    }
    prefill_pf_ = nullptr;
    return pf.collect();
}

std::vector<CudaProfileEntry> CudaModel::profile_batch(const int* slot_ids, const int* ids, int n) {
    if (sharded()) throw Error("the per-kernel profile runs on one GPU: use --tensor-parallel-size 1");
    Profiler pf;  // (its destructor frees the events if the step throws)
    batch_step(slot_ids, ids, n, nullptr, &pf);
    return pf.collect();
}

std::vector<CudaProfileEntry> CudaModel::profile_step() {
    if (n_past >= ctx_) throw Error("context full: no room for a profiled step");
    if (sharded()) throw Error("the per-kernel profile runs on one GPU: use --tensor-parallel-size 1");
    // Gate the stream while the step is enqueued (profile_gate.cu): the events then time the GPU, not the
    // host's launch rate. If enqueueing outlasts the gate's timeout, the profile says so.
    int* flag = nullptr;
    CUDA_CHECK(cudaHostAlloc(&flag, sizeof(int), cudaHostAllocMapped));
    *reinterpret_cast<volatile int*>(flag) = 0;
    int* d_flag = nullptr;
    CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&d_flag), flag, 0));
    int* d_timed_out = st_.d_sel_info ? st_.d_sel_info + 1 : nullptr;  // scratch int (the top-k flag slot)
    int timed_out = 0;
    Profiler pf;
    // the long range's attention as its graph runs it (the short range's clusters profile as the general
    // graph's pieces)
    rec_range_ = step_range(n_past) == StepRange::kLong ? StepRange::kLong : StepRange::kGeneral;
    try {
        if (d_timed_out) CUDA_CHECK(cudaMemsetAsync(d_timed_out, 0, sizeof(int), stream_));
        if (d_timed_out) stream_gate(d_flag, 2.0, d_timed_out, stream_);
        record_step(&pf);
        rec_range_ = StepRange::kGeneral;
        *reinterpret_cast<volatile int*>(flag) = 1;
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        if (d_timed_out) CUDA_CHECK(cudaMemcpy(&timed_out, d_timed_out, sizeof(int), cudaMemcpyDeviceToHost));
    } catch (...) {
        rec_range_ = StepRange::kGeneral;
        *reinterpret_cast<volatile int*>(flag) = 1;
        cudaStreamSynchronize(stream_);
        cudaFreeHost(flag);
        throw;
    }
    cudaFreeHost(flag);
    profile_gated_ = d_timed_out && !timed_out;
    ++n_past;
    return pf.collect();
}

}  // namespace markbase::cuda
