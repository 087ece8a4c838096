// CudaModel::decode_timeline and batch_timeline (graph_timeline.h): the decode graph, or the batched step's,
// captured again with each run() launch's graph nodes noted, instantiated, replayed between CUDA events (no
// tracing) and then under CUPTI's activity API, and each kernel record charged to the launch whose node ran
// it.
//
// libcupti is loaded at run time (dlopen), never linked: the binary must start where it is missing. Only its
// headers are used here, for the types; without them (no cupti.h at configure time) the feature is compiled
// out and says so.
//
// Mapping records to launches: a record's graphNodeId is its node's CUPTI id, the captured graph's node or
// the clone of it that the instantiated graph runs (CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED tells which clone
// belongs to which node), checked by the kernel function names (CUPTI's record name against the node's
// function, both demangled) and by every node running once per replay. It holds on all four variants on
// the H200; where it does not, the timeline says why instead of guessing another mapping.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>

#include "cuda/model.h"
#include "runtime/graph_timeline.h"

#ifdef MARKBASE_HAS_CUPTI
#include "cuda/profiling/cupti.h"
#endif

namespace markbase::cuda {

// What the capture noted: the run() launches in order, and the graph nodes each one created.
struct TimelineCapture {
    cudaGraph_t graph = nullptr;  // the graph being captured (cudaStreamGetCaptureInfo)
    std::vector<TimelineLabel> launches;
    std::vector<std::vector<cudaGraphNode_t>> nodes;  // [launch]
    std::unordered_set<cudaGraphNode_t> seen;
    std::vector<cudaGraphNode_t> all;  // scratch
    // Whether each launch's new nodes were the tail of cudaGraphGetNodes' array (the count-based ranges
    // would then have worked too). The set difference used here does not depend on it; the note reports it.
    bool tail_order = true;
};

// After each launch of a capture with a timeline: the nodes not seen before are this launch's. The MoE's
// experts are captured on a second stream into the same graph; host order still separates the launches.
void CudaModel::timeline_note(const char* name, int layer, double bytes) {
    TimelineCapture& c = *hooks_.capture;
    if (!c.graph) {
        cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
        CUDA_CHECK(cudaStreamGetCaptureInfo(stream_, &st, nullptr, &c.graph));
        if (st != cudaStreamCaptureStatusActive || !c.graph)
            throw Error("internal: the timeline's launch notes ran outside a graph capture");
    }
    c.launches.push_back({name, layer, bytes, 1});
    c.nodes.emplace_back();
    size_t n = 0;
    CUDA_CHECK(cudaGraphGetNodes(c.graph, nullptr, &n));
    const size_t before = c.seen.size();
    if (n == before) return;
    c.all.resize(n);
    CUDA_CHECK(cudaGraphGetNodes(c.graph, c.all.data(), &n));
    for (size_t i = 0; i < n; ++i)
        if (c.seen.insert(c.all[i]).second) {
            c.nodes.back().push_back(c.all[i]);
            if (i < before) c.tail_order = false;
        }
}

#ifndef MARKBASE_HAS_CUPTI

GraphTimeline CudaModel::decode_timeline(int) {
    GraphTimeline t;
    t.unavailable = true;
    t.why_not = "--timeline needs CUPTI: this build found no cupti.h at configure time";
    return t;
}

GraphTimeline CudaModel::batch_timeline(const int*, const int*, int, int) {
    return decode_timeline(0);
}

#else

namespace {

using namespace profiling;

struct KernelNode {
    cudaGraphNode_t node = nullptr;
    int label = -1;  // the launch (index into the timeline's labels)
    uint64_t id = 0;
    std::string name;  // demangled; "" when the runtime would not say
};

// Everything that must be undone however the timeline ends: the subscription, the activity, the graphs.
struct TimelineSession {
    CUpti_SubscriberHandle sub = nullptr;
    bool activity_on = false;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    cudaEvent_t ev[2] = {nullptr, nullptr};
    std::unordered_map<uint64_t, uint64_t> clones;  // clone id -> captured node id
    ~TimelineSession() {
        if (activity_on) {
            cupti().flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
            cupti().disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
        }
        if (sub) cupti().unsubscribe(sub);
        if (exec) cudaGraphExecDestroy(exec);
        if (graph) cudaGraphDestroy(graph);
        for (cudaEvent_t e : ev)
            if (e) cudaEventDestroy(e);
    }
};

// The activity callbacks (once per process) and this timeline's subscription to the clone callback.
void subscribe(Cupti& cu, TimelineSession& ss) {
    if (!cu.callbacks_registered) {
        cupti_check(cu.register_callbacks(buffer_requested, buffer_completed),
                    "cuptiActivityRegisterCallbacks");
        cu.callbacks_registered = true;
    }
    const CUptiResult r = cu.subscribe(&ss.sub, on_resource, &ss.clones);
    if (r != CUPTI_SUCCESS) {
        ss.sub = nullptr;
        throw Error("CUPTI: cuptiSubscribe failed (" + cupti_error(r) +
                    "): another CUPTI client such as Nsight Systems is attached");
    }
    cupti_check(cu.enable_callback(1, ss.sub, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED),
                "cuptiEnableCallback(GRAPHNODE_CLONED)");
}

// Nodes no run() created (none expected) are charged to "other".
void note_other_nodes(cudaGraph_t graph, TimelineCapture& cap) {
    size_t n = 0;
    CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
    std::vector<cudaGraphNode_t> all(n);
    CUDA_CHECK(cudaGraphGetNodes(graph, all.data(), &n));
    std::vector<cudaGraphNode_t> extra;
    for (cudaGraphNode_t nd : all)
        if (!cap.seen.count(nd)) extra.push_back(nd);
    if (!extra.empty()) {
        cap.launches.push_back({"other", -1, 0.0, 1});
        cap.nodes.push_back(extra);
    }
}

// The kernel nodes in creation order, and the launches that own any (the timeline's labels); names_known
// turns false when the runtime would not name a node's function.
std::vector<KernelNode> kernel_nodes(Cupti& cu, const TimelineCapture& cap,
                                     std::vector<TimelineLabel>* labels, bool* names_known) {
    std::vector<KernelNode> knodes;
    for (size_t l = 0; l < cap.launches.size(); ++l) {
        int label = -1;
        for (cudaGraphNode_t nd : cap.nodes[l]) {
            cudaGraphNodeType type;
            CUDA_CHECK(cudaGraphNodeGetType(nd, &type));
            if (type != cudaGraphNodeTypeKernel) continue;
            if (label < 0) {
                label = static_cast<int>(labels->size());
                labels->push_back(cap.launches[l]);
            }
            KernelNode k;
            k.node = nd;
            k.label = label;
            cupti_check(cu.node_id(nd, &k.id), "cuptiGetGraphNodeId");
            cudaKernelNodeParams p = {};
            const char* fname = nullptr;
            if (cudaGraphKernelNodeGetParams(nd, &p) == cudaSuccess && p.func &&
                cudaFuncGetName(&fname, p.func) == cudaSuccess && fname)
                k.name = demangled(fname);
            else
                *names_known = false;
            cudaGetLastError();  // (a refused name is not an error of the step)
            knodes.push_back(std::move(k));
        }
    }
    return knodes;
}

// The replays' records charged to the kernel nodes: each record's node id is a captured node or a clone of
// one, its function name agrees with the node's (when the names are known), and every node runs once per
// replay. The spans of each replay; throws when the mapping does not hold. note: how it was checked.
std::vector<std::vector<TimelineSpan>> charge_records(const std::vector<std::vector<KernelRecord>>& groups,
                                                      const std::vector<KernelNode>& knodes,
                                                      const std::unordered_map<uint64_t, uint64_t>& clones,
                                                      bool names_known, std::string* note) {
    const size_t K = knodes.size();
    std::unordered_map<uint64_t, size_t> by_id;
    for (size_t k = 0; k < K; ++k) by_id[knodes[k].id] = k;
    size_t via_clone = 0;
    // (a clone of a clone, should instantiation copy the graph first, is followed back to the captured node)
    for (const auto& [clone, orig] : clones) {
        uint64_t up = orig;
        for (int hop = 0; hop < 8 && !by_id.count(up); ++hop) {
            auto next = clones.find(up);
            if (next == clones.end()) break;
            up = next->second;
        }
        auto it = by_id.find(up);
        if (it != by_id.end() && !by_id.count(clone)) by_id[clone] = it->second;
    }
    // CUPTI's names demangled once per distinct name (a replay repeats a few dozen kernels)
    std::unordered_map<std::string, std::string> cpp;
    for (const auto& g : groups)
        for (const KernelRecord& r : g)
            if (!cpp.count(r.name)) cpp[r.name] = demangled(r.name);
    int loosest = 0;  // the loosest names_agree level any check needed
    auto same = [&](const KernelNode& n, const KernelRecord& r) {
        const int a = names_agree(n.name, cpp[r.name]);
        loosest = std::max(loosest, a);
        return a >= 0;
    };
    const char* levels[] = {"names checked", "names checked without signatures",
                            "names checked by unqualified template name only"};
    std::string why_id;
    std::vector<std::vector<TimelineSpan>> spans(groups.size());
    for (size_t g = 0; g < groups.size() && why_id.empty(); ++g) {
        std::vector<int> hits(K, 0);
        for (const KernelRecord& r : groups[g]) {
            auto it = by_id.find(r.node_id);
            if (it == by_id.end()) {
                why_id = "a record's node id " + std::to_string(r.node_id) + " is no captured node or clone";
                break;
            }
            const KernelNode& n = knodes[it->second];
            if (names_known && !same(n, r)) {
                why_id = "node id " + std::to_string(r.node_id) + " ran " + cpp[r.name] +
                         ", its node holds " + n.name;
                break;
            }
            if (n.id != r.node_id) ++via_clone;
            ++hits[it->second];
            spans[g].push_back({r.start, r.end, n.label});
        }
        if (why_id.empty() && std::any_of(hits.begin(), hits.end(), [](int h) { return h != 1; }))
            why_id = "a replay did not run each kernel node once";
    }
    if (!why_id.empty())
        throw Error("CUPTI's records could not be charged to the step's launches: " + why_id);
    *note += std::string("ids of ") + (via_clone ? "the instantiated graph's clones" : "the captured nodes") +
             (names_known ? std::string(", ") + levels[loosest]
                          : std::string(", names NOT checked (the runtime gave no function names)")) +
             "; ";
    return spans;
}

// kTimelineUntraced replays timed between events, without tracing (ms each).
template <class F>
std::vector<double> time_untraced(TimelineSession& ss, cudaStream_t s, F&& replay) {
    CUDA_CHECK(cudaEventCreate(&ss.ev[0]));
    CUDA_CHECK(cudaEventCreate(&ss.ev[1]));
    std::vector<double> untraced;
    for (int i = 0; i < kTimelineUntraced; ++i) {
        CUDA_CHECK(cudaEventRecord(ss.ev[0], s));
        replay();
        CUDA_CHECK(cudaEventRecord(ss.ev[1], s));
        CUDA_CHECK(cudaStreamSynchronize(s));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, ss.ev[0], ss.ev[1]));
        untraced.push_back(ms);
    }
    return untraced;
}

}  // namespace

GraphTimeline CudaModel::decode_timeline(int replays) {
    GraphTimeline t;
    int64_t launched = 0;  // graph launches so far: each one is a decode step, so n_past follows
    try {
        t = timeline_run(
            replays, [&] { return capture_step(step_range(n_past)); }, true, &launched);
    } catch (const std::exception& e) {
        t = {};
        t.why_not = e.what();
    }
    n_past += launched;
    return t;
}

GraphTimeline CudaModel::batch_timeline(const int* slot_ids, const int* ids, int n, int replays) {
    GraphTimeline t;
    try {
        if (n < 2)
            throw Error("the batched step's timeline takes 2 or more sequences (one runs the decode graph)");
        std::vector<int> pos, slot;
        const int64_t max_pos = check_batch(slot_ids, n, &pos, &slot);
        if (!batch_on_device(n))
            throw Error("this batched step of " + std::to_string(n) +
                        " sequences runs eagerly (its experts planned on the host): no graph to trace");
        ensure_all_logits();
        stage_batch(ids, pos, slot);
        const int64_t range = batch_range(max_pos);
        int64_t launched = 0;  // (the same step each replay: nothing advances)
        t = timeline_run(
            replays, [&] { return capture_batch(n, range); }, false, &launched);
    } catch (const std::exception& e) {
        t = {};
        t.why_not = e.what();
    }
    batch_rows_ = nullptr;  // the replays' logits rows are no step decode_batch returned
    batch_n_ = 0;
    return t;
}

GraphTimeline CudaModel::timeline_run(int replays, const std::function<cudaGraph_t()>& capture, bool decode,
                                      int64_t* launched) {
    GraphTimeline t;
    if (sharded()) throw Error("the timeline runs on one GPU: use --tensor-parallel-size 1");
    if (replays < 1) throw Error("the timeline needs at least one replay");
    const int64_t most = timeline_positions(replays);
    if (decode && n_past + most > ctx_)
        throw Error("context full: the timeline decodes up to " + std::to_string(most) + " tokens after " +
                    std::to_string(n_past) + " (raise --ctx-size)");
    Cupti& cu = cupti();
    if (!cu.loaded) {
        t.unavailable = true;
        t.why_not = "--timeline needs CUPTI: " + cu.why_not;
        return t;
    }
    TimelineSession ss;
    subscribe(cu, ss);

    // 1. the step captured as its graph is (ensure_graph's, batch_graph's), each launch's nodes noted
    TimelineCapture cap;
    struct Noting {  // hooks_.capture only while this capture runs, also when it throws
        TimelineCapture*& p;
        Noting(TimelineCapture*& ptr, TimelineCapture* c) : p(ptr) { p = c; }
        ~Noting() { p = nullptr; }
    };
    {
        Noting on(hooks_.capture, &cap);
        ss.graph = capture();
    }
    note_other_nodes(ss.graph, cap);
    std::vector<TimelineLabel> labels;
    bool names_known = true;
    const std::vector<KernelNode> knodes = kernel_nodes(cu, cap, &labels, &names_known);
    const size_t K = knodes.size();
    if (K == 0) throw Error("internal: the captured step holds no kernel nodes");

    // 2. instantiated (the clone callback fires now), warmed up, then timed between events without tracing
    CUDA_CHECK(cudaGraphInstantiate(&ss.exec, ss.graph, 0));
    if (decode)
        CUDA_CHECK(cudaMemsetAsync(st_.d_state + 2, 0, sizeof(int), stream_));  // decode_greedy's ids count
    auto replay = [&] {
        CUDA_CHECK(cudaGraphLaunch(ss.exec, stream_));
        ++*launched;
    };
    for (int i = 0; i < kTimelineWarmup; ++i) replay();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    const std::vector<double> untraced = time_untraced(ss, stream_, replay);

    // 3. the traced replays, one at a time (a sync after each, so replays never overlap)
    cupti_check(cu.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
    take_records(nullptr);  // anything left from before
    cupti_check(cu.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable(CONCURRENT_KERNEL)");
    ss.activity_on = true;
    for (int i = 0; i < replays; ++i) {
        replay();
        CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    cupti_check(cu.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
    cupti_check(cu.disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityDisable");
    ss.activity_on = false;
    size_t invalid = 0;
    std::vector<KernelRecord> recs = graph_records(take_records(&invalid));
    if (recs.empty()) throw Error("CUPTI returned no kernel records for the graph replays");
    if (invalid) t.note += std::to_string(invalid) + " records without valid timestamps dropped; ";
    const auto groups = split_replays(std::move(recs), replays, K, &t.note);
    if (groups.empty()) throw Error("CUPTI's records held no whole replay: " + t.note);

    // 4. the mapping, checked on every record of every replay
    const auto spans = charge_records(groups, knodes, ss.clones, names_known, &t.note);
    t.mapping = "node-id";
    t.note += std::string("graph nodes listed in creation order: ") + (cap.tail_order ? "yes" : "no");

    GraphTimeline s = summarize_timeline(labels, spans, untraced);
    s.ok = true;
    s.mapping = t.mapping;
    s.note = t.note;
    return s;
}

#endif  // MARKBASE_HAS_CUPTI

}  // namespace markbase::cuda
