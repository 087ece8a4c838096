// A timeline of the decode step inside its CUDA-graph replay (`markbase bench --timeline`): CUPTI's kernel
// records of a few replays, each charged to the CudaModel::run() launch (name, layer) that created its graph
// node. This header is plain C++ (no CUDA): the arithmetic, the summary and its output are built and tested
// on machines without a GPU; the CUPTI side is src/cuda/profiling/graph_timeline_cupti.cu.
//
// Why not the events profile (bench --profile): events around each launch serialise the step and stop
// programmatic dependent launch, so small kernels read high (E2B: 3.92 ms of events against a 2.02 ms graph
// step). Inside a replay kernels overlap, so a kernel's duration is not its cost; its *marginal* time is:
// with the replay's kernels sorted by end time, marginal_i = end_i - max(end_{i-1}, replay start). The
// marginals add up to the step exactly, and a kernel hidden under its neighbours costs ~0.
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace markbase {

// Graph launches of one timeline: warm-up, the untraced (event-timed) replays and the traced ones. Each
// launch is a real decode step (the position advances), so the context must hold timeline_positions(replays).
constexpr int kTimelineWarmup = 3, kTimelineUntraced = 20;
constexpr int64_t timeline_positions(int replays) {
    return kTimelineWarmup + kTimelineUntraced + int64_t{replays};
}

// One kernel execution of one replay: CUPTI's timestamps (ns) and what it is charged to (an index into the
// labels, see TimelineLabel).
struct TimelineSpan {
    uint64_t start = 0, end = 0;
    int label = -1;
};

struct SpanTimes {
    double marginal_ns = 0;  // end - max(previous end in end order, replay start)
    double busy_ns = 0;      // end - start
};
struct ReplayTimes {
    double step_ns = 0;            // last end - first start
    double idle_ns = 0;            // time inside the step when none of its kernels runs
    std::vector<SpanTimes> spans;  // in the input's order
};
// The marginal / idle arithmetic of one replay (no CUDA: tested on hand-made spans). The marginals sum to
// step_ns. Idle time is the step minus the union of the spans: spans sorted by start, each gap between a
// start and the latest end before it.
ReplayTimes replay_times(const std::vector<TimelineSpan>& spans);

// What a span is charged to: a run() launch (name, layer, the weight bytes it streams, calls = 1), or with
// the "kernel-name" mapping a kernel function (layer -1, bytes 0, calls = its kernel nodes per step).
struct TimelineLabel {
    std::string name;
    int layer = -1;
    double bytes = 0;
    int calls = 1;
};

// Per name: medians over the replays per (name, layer) label, then summed over the name's labels.
struct TimelineKernel {
    std::string name;
    int calls = 0;    // launches (run() calls) of this name per step
    int kernels = 0;  // kernel records per step (a launch may hold several kernels)
    double marginal_ms = 0, busy_ms = 0;
    double bytes = 0;  // weight bytes per step (run()'s bytes)
    double gbs() const { return marginal_ms > 0 ? bytes / (marginal_ms * 1e-3) / 1e9 : 0.0; }
};
// One label in the replay whose step time is nearest the median; start/end relative to its first start.
struct TimelineLaunch {
    std::string name;
    int layer = -1;
    double marginal_ms = 0, busy_ms = 0, start_ms = 0, end_ms = 0;
};

struct GraphTimeline {
    bool ok = false;
    bool unavailable = false;  // CUPTI could not be loaded / is not built in (why_not says which)
    std::string why_not;
    std::string mapping;          // "node-id": how records were matched to launches (graph node ids)
    std::string note;             // what the mapping checks found, dropped replays, ...
    int replays = 0;              // replays that went into the medians
    double step_ms = 0;           // median over replays of last end - first start
    double step_ms_untraced = 0;  // the same graph's replay between CUDA events, CUPTI off (median)
    double idle_ms = 0;           // median over replays
    double marginal_sum_ms = 0;   // the sum of by_kernel's marginals (sum of medians, ~ step_ms)
    std::vector<TimelineKernel> by_kernel;   // by marginal time, largest first
    std::vector<TimelineLaunch> per_launch;  // label order (launch order) of the median replay
};

// The summary of replays whose spans carry labels into `labels`; untraced_ms: the event-timed replays.
// Fills everything but ok, unavailable, why_not, mapping and note. Spans with a label outside `labels` are
// an error (Error thrown): the caller's mapping is broken.
GraphTimeline summarize_timeline(const std::vector<TimelineLabel>& labels,
                                 const std::vector<std::vector<TimelineSpan>>& replays,
                                 const std::vector<double>& untraced_ms);

// The bench receipt's table (after the receipt) and the JSON object under "timeline"; what: the step
// replayed, as the table's title names it.
void print_timeline(std::FILE* f, const GraphTimeline& t, const char* what = "one decode step");
nlohmann::json timeline_json(const GraphTimeline& t);

// Where a step's time goes against the memory roofline (the receipt's "why" lines under --timeline: what the
// issue asks the profile to say when a target is missed). From by_kernel's marginals and weight bytes:
//   step = bytes at the roofline + weight launches' time over their bytes + launches streaming no weights
//          + time no launch is charged with,
// and per layer: launches, time, the layer's bytes at the roofline, and so the time each launch adds beyond
// its bytes (the per-launch floor that a chain of dependent launches pays).
struct TimelineGap {
    bool ok = false;
    double roofline_gbs = 0;
    double step_ms = 0, bytes = 0, bytes_ms = 0;  // the step; every launch's weight bytes, at the roofline
    double weight_ms = 0, weight_over_ms = 0;     // launches with weight bytes: marginal time, beyond bytes
    double other_ms = 0;                          // launches with none (attention, updates, norms, routing)
    std::vector<std::pair<std::string, double>> other_top;        // their largest names by marginal ms (<= 4)
    double unattributed_ms = 0;                                   // step - the marginals' sum
    double layer_launches = 0, layer_us = 0, layer_bytes_us = 0;  // per layer, averaged over the layers
    double per_launch_over_us = 0;  // (layer_us - layer_bytes_us) / layer_launches
};
TimelineGap timeline_gap(const GraphTimeline& t, double roofline_gbs, int n_layers);
void print_gap(std::FILE* f, const TimelineGap& g);
nlohmann::json gap_json(const TimelineGap& g);

}  // namespace markbase
