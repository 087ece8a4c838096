// What the decode step and the prefill carry for `bench` besides their launches: the Profiler (events around
// each launch of a step run without a graph: bench --profile) and the launch hooks (Tuning::skip, and the
// timeline's note of each launch's graph nodes: bench --timeline). CudaModel::run() is the one place that
// consults them; a normal decode step, recorded into its graph, has no Profiler, skips nothing and notes
// nothing.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "cuda/backend.h"
#include "cuda/check.h"

namespace markbase::cuda {

struct TimelineCapture;  // graph_timeline_cupti.cu

class Profiler {
  public:
    Profiler() = default;
    Profiler(const Profiler&) = delete;
    Profiler& operator=(const Profiler&) = delete;
    ~Profiler() { discard(); }

    // launch() between two events on stream s, charged to `kernel` of `layer` (bytes: the weights it streams)
    template <class F>
    void time(const char* kernel, int layer, double bytes, cudaStream_t s, F&& launch) {
        Rec r{kernel, layer, bytes, nullptr, nullptr};
        CUDA_CHECK(cudaEventCreate(&r.start));
        CUDA_CHECK(cudaEventCreate(&r.stop));
        CUDA_CHECK(cudaEventRecord(r.start, s));
        launch();
        CUDA_CHECK(cudaEventRecord(r.stop, s));
        recs_.push_back(r);
    }
    // The events' times, in launch order (after the stream has synchronised); the events are destroyed.
    std::vector<CudaProfileEntry> collect();

  private:
    struct Rec {
        const char* kernel;
        int layer;
        double bytes;
        cudaEvent_t start, stop;
    };
    std::vector<Rec> recs_;
    void discard();  // destroys the events not yet collected
};

struct LaunchHooks {
    // Tuning::skip: those launches (run()'s names: qkv, route_topk, ffn_combine, ...) are left out of every
    // step. A timing experiment only: the graph step without a kernel, against the step with it, is that
    // kernel's true cost in the graph (the profile's events stop PDL overlap and overstate it); every output
    // is wrong.
    std::vector<std::string> skip;
    // Set only while decode_timeline captures its graph: run() then notes the nodes each launch created.
    TimelineCapture* capture = nullptr;

    bool skips(const char* name) const { return !skip.empty() && skipped(name); }
    bool skipped(const char* name) const;
};

}  // namespace markbase::cuda
