// CudaModel::decode_timeline (graph_timeline.h): the decode graph captured again with each run() launch's
// graph nodes noted, instantiated, replayed between CUDA events (no tracing) and then under CUPTI's activity
// API, and each kernel record charged to the launch whose node ran it.
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
#include <map>
#include <mutex>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>

#include "cuda/model.h"
#include "runtime/graph_timeline.h"

#ifdef MARKBASE_HAS_CUPTI
#include <cupti.h>
#include <cxxabi.h>
#include <dlfcn.h>
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
    TimelineCapture& c = *tl_capture_;
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

#else

namespace {

// The CUPTI functions used, from the library loaded at run time.
struct Cupti {
    bool loaded = false;
    std::string why_not;
    decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
    decltype(&cuptiActivityEnable) enable = nullptr;
    decltype(&cuptiActivityDisable) disable = nullptr;
    decltype(&cuptiActivityFlushAll) flush_all = nullptr;
    decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
    decltype(&cuptiGetGraphNodeId) node_id = nullptr;
    decltype(&cuptiGetResultString) result_string = nullptr;
    decltype(&cuptiSubscribe) subscribe = nullptr;
    decltype(&cuptiEnableCallback) enable_callback = nullptr;
    decltype(&cuptiUnsubscribe) unsubscribe = nullptr;
    bool callbacks_registered = false;  // the activity buffers' callbacks: once per process
};

Cupti load_cupti() {
    Cupti c;
    const char* paths[] = {"libcupti.so", "libcupti.so.13", "/usr/local/cuda/lib64/libcupti.so",
                           "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so",
                           "/usr/local/cuda/lib/libcupti.so"};
    void* lib = nullptr;
    std::string errors;
    for (const char* p : paths) {
        lib = dlopen(p, RTLD_NOW | RTLD_LOCAL);
        if (lib) break;
        const char* e = dlerror();
        if (errors.empty() && e) errors = e;
    }
    if (!lib) {
        c.why_not =
            "libcupti could not be loaded (tried libcupti.so, libcupti.so.13 and the CUDA toolkit's "
            "folders; first error: " +
            errors + ")";
        return c;
    }
    bool all = true;
    auto sym = [&](auto& fn, const char* name) {
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
        if (!fn) {
            all = false;
            if (c.why_not.empty()) c.why_not = std::string("libcupti has no ") + name;
        }
    };
    sym(c.register_callbacks, "cuptiActivityRegisterCallbacks");
    sym(c.enable, "cuptiActivityEnable");
    sym(c.disable, "cuptiActivityDisable");
    sym(c.flush_all, "cuptiActivityFlushAll");
    sym(c.next_record, "cuptiActivityGetNextRecord");
    sym(c.node_id, "cuptiGetGraphNodeId");
    sym(c.result_string, "cuptiGetResultString");
    sym(c.subscribe, "cuptiSubscribe");
    sym(c.enable_callback, "cuptiEnableCallback");
    sym(c.unsubscribe, "cuptiUnsubscribe");
    c.loaded = all;  // (the library stays loaded: CUPTI does not support being unloaded)
    return c;
}

Cupti& cupti() {
    static Cupti c = load_cupti();
    return c;
}

std::string cupti_error(CUptiResult r) {
    const char* s = nullptr;
    if (cupti().result_string) cupti().result_string(r, &s);
    return s ? s : "CUPTI error " + std::to_string(static_cast<int>(r));
}
void cupti_check(CUptiResult r, const char* what) {
    if (r != CUPTI_SUCCESS) throw Error(std::string("CUPTI: ") + what + " failed: " + cupti_error(r));
}

// One kernel record, copied out of CUPTI's buffer.
struct KernelRecord {
    uint64_t start = 0, end = 0, node_id = 0;
    uint32_t correlation = 0;
    std::string name;
};
// The activity buffers' callbacks take no user pointer, so the records land here.
struct RecordSink {
    std::mutex mu;
    std::vector<KernelRecord> records;
    size_t invalid = 0;  // timestamps of 0 (CUPTI could not time them) or end < start
};
RecordSink& sink() {
    static RecordSink s;
    return s;
}

constexpr size_t kBufferBytes = size_t{8} << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(ACTIVITY_RECORD_ALIGNMENT, kBufferBytes));
    *size = *buffer ? kBufferBytes : 0;
    *max_records = 0;
}

// CUpti_ActivityKernel10: the kernel record of the installed header (cupti_activity.h; the older ones are
// in cupti_activity_deprecated.h). The fields read here have kept their offsets since graphNodeId appeared.
void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
    RecordSink& s = sink();
    {
        std::lock_guard<std::mutex> lock(s.mu);
        CUpti_Activity* rec = nullptr;
        while (cupti().next_record(buffer, valid, &rec) == CUPTI_SUCCESS) {
            if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
            const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
            if (k->start == 0 || k->end < k->start) {
                ++s.invalid;
                continue;
            }
            s.records.push_back({k->start, k->end, k->graphNodeId, k->correlationId, k->name ? k->name : ""});
        }
    }
    std::free(buffer);
}

// GRAPHNODE_CLONED while the graph is instantiated: the clone's CUPTI id -> the captured node's id.
void CUPTIAPI on_resource(void* user, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* data) {
    if (domain != CUPTI_CB_DOMAIN_RESOURCE || cbid != CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED || !data) return;
    const auto* rd = static_cast<const CUpti_ResourceData*>(data);
    const auto* gd = static_cast<const CUpti_GraphData*>(rd->resourceDescriptor);
    if (!gd || !gd->node || !gd->originalNode) return;
    uint64_t clone = 0, orig = 0;
    if (cupti().node_id(gd->node, &clone) != CUPTI_SUCCESS) return;
    if (cupti().node_id(gd->originalNode, &orig) != CUPTI_SUCCESS) return;
    (*static_cast<std::unordered_map<uint64_t, uint64_t>*>(user))[clone] = orig;
}

// A kernel's name as C++ (demangled when it is mangled), for comparing CUPTI's name with the node's.
std::string demangled(const std::string& s) {
    int status = 0;
    char* d = abi::__cxa_demangle(s.c_str(), nullptr, nullptr, &status);
    std::string out = status == 0 && d ? d : s;
    std::free(d);
    return out;
}
// A kernel name without its return type and parameter list (names_agree compares these).
std::string short_kernel_name(const std::string& full) {
    std::string s = full;
    if (!s.empty() && s.back() == ')') {
        int depth = 0;
        for (size_t i = s.size(); i-- > 0;) {
            if (s[i] == ')') ++depth;
            if (s[i] == '(' && --depth == 0) {
                s.resize(i);
                break;
            }
        }
    }
    if (s.rfind("void ", 0) == 0) s = s.substr(5);
    return s.empty() ? full : s;
}

// How closely two kernel names agree: 0 the same, 1 the same without return type and parameters (one side
// may come without a signature), 2 the same function template's unqualified name; -1 different.
int names_agree(const std::string& a, const std::string& b) {
    if (a == b) return 0;
    const std::string sa = short_kernel_name(a), sb = short_kernel_name(b);
    if (sa == sb) return 1;
    auto base = [](std::string x) {
        x = x.substr(0, x.find('<'));
        const size_t c = x.rfind("::");
        return c == std::string::npos ? x : x.substr(c + 2);
    };
    return base(sa) == base(sb) ? 2 : -1;
}

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

std::vector<KernelRecord> take_records(size_t* invalid) {
    RecordSink& s = sink();
    std::lock_guard<std::mutex> lock(s.mu);
    std::vector<KernelRecord> out;
    out.swap(s.records);
    if (invalid) *invalid = s.invalid;
    s.invalid = 0;
    return out;
}

// Only our replays ran while tracing (a sync before and after each), so every record is theirs; those with
// no graph node id are dropped only when others have one (with none, the node-id mapping fails and the
// order is tried).
std::vector<KernelRecord> graph_records(std::vector<KernelRecord> recs) {
    if (std::any_of(recs.begin(), recs.end(), [](const KernelRecord& r) { return r.node_id != 0; }))
        std::erase_if(recs, [](const KernelRecord& r) { return r.node_id == 0; });
    return recs;
}

// The records of `replays` graph launches, one vector per launch: grouped by correlation id (a graph
// launch's kernels share it) when that gives whole replays, else, when the count is exact, as consecutive
// runs of K in start order (the replays were serialised by a sync). Partial replays are dropped.
std::vector<std::vector<KernelRecord>> split_replays(std::vector<KernelRecord> recs, int replays, size_t K,
                                                     std::string* note) {
    std::sort(recs.begin(), recs.end(),
              [](const KernelRecord& a, const KernelRecord& b) { return a.start < b.start; });
    std::map<uint32_t, std::vector<KernelRecord>> by_corr;
    for (const KernelRecord& r : recs) by_corr[r.correlation].push_back(r);
    std::vector<std::vector<KernelRecord>> whole;
    for (auto& [corr, v] : by_corr)
        if (v.size() == K) whole.push_back(std::move(v));
    if (whole.size() == static_cast<size_t>(replays)) return whole;
    if (recs.size() == K * static_cast<size_t>(replays)) {
        std::vector<std::vector<KernelRecord>> out;
        for (size_t i = 0; i < recs.size(); i += K) out.emplace_back(recs.begin() + i, recs.begin() + i + K);
        *note += "replays split by time (correlation ids did not group them); ";
        return out;
    }
    *note += std::to_string(recs.size()) + " records for " + std::to_string(replays) + " replays of " +
             std::to_string(K) + " kernels: kept the " + std::to_string(whole.size()) + " whole replays; ";
    std::sort(whole.begin(), whole.end(),
              [](const auto& a, const auto& b) { return a[0].start < b[0].start; });
    return whole;
}

}  // namespace

GraphTimeline CudaModel::decode_timeline(int replays) {
    GraphTimeline t;
    int64_t launched = 0;  // graph launches so far: each one is a decode step, so n_past follows
    try {
        t = timeline_run(replays, &launched);
    } catch (const std::exception& e) {
        t = {};
        t.why_not = e.what();
    }
    n_past += launched;
    return t;
}

GraphTimeline CudaModel::timeline_run(int replays, int64_t* launched) {
    GraphTimeline t;
    if (sharded()) throw Error("the timeline runs on one GPU: use --tensor-parallel-size 1");
    if (replays < 1) throw Error("the timeline needs at least one replay");
    const int64_t most = timeline_positions(replays);
    if (n_past + most > ctx_)
        throw Error("context full: the timeline decodes up to " + std::to_string(most) + " tokens after " +
                    std::to_string(n_past) + " (raise --ctx-size)");
    Cupti& cu = cupti();
    if (!cu.loaded) {
        t.unavailable = true;
        t.why_not = "--timeline needs CUPTI: " + cu.why_not;
        return t;
    }
    if (!cu.callbacks_registered) {
        cupti_check(cu.register_callbacks(buffer_requested, buffer_completed),
                    "cuptiActivityRegisterCallbacks");
        cu.callbacks_registered = true;
    }
    TimelineSession ss;
    {
        const CUptiResult r = cu.subscribe(&ss.sub, on_resource, &ss.clones);
        if (r != CUPTI_SUCCESS) {
            ss.sub = nullptr;
            throw Error("CUPTI: cuptiSubscribe failed (" + cupti_error(r) +
                        "): another CUPTI client such as Nsight Systems is attached");
        }
        cupti_check(
            cu.enable_callback(1, ss.sub, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED),
            "cuptiEnableCallback(GRAPHNODE_CLONED)");
    }

    // 1. the decode step captured as ensure_graph captures it, each launch's nodes noted
    TimelineCapture cap;
    struct Noting {  // tl_capture_ only while this capture runs, also when it throws
        TimelineCapture*& p;
        Noting(TimelineCapture*& ptr, TimelineCapture* c) : p(ptr) { p = c; }
        ~Noting() { p = nullptr; }
    };
    {
        Noting on(tl_capture_, &cap);
        ss.graph = capture_step(short_step(n_past));
    }
    {  // nodes no run() created (none expected) are charged to "other"
        size_t n = 0;
        CUDA_CHECK(cudaGraphGetNodes(ss.graph, nullptr, &n));
        std::vector<cudaGraphNode_t> all(n);
        CUDA_CHECK(cudaGraphGetNodes(ss.graph, all.data(), &n));
        std::vector<cudaGraphNode_t> extra;
        for (cudaGraphNode_t nd : all)
            if (!cap.seen.count(nd)) extra.push_back(nd);
        if (!extra.empty()) {
            cap.launches.push_back({"other", -1, 0.0, 1});
            cap.nodes.push_back(extra);
        }
    }
    // the kernel nodes in creation order, and the launches that own any (the timeline's labels)
    std::vector<TimelineLabel> labels;
    std::vector<KernelNode> knodes;
    bool names_known = true;
    for (size_t l = 0; l < cap.launches.size(); ++l) {
        int label = -1;
        for (cudaGraphNode_t nd : cap.nodes[l]) {
            cudaGraphNodeType type;
            CUDA_CHECK(cudaGraphNodeGetType(nd, &type));
            if (type != cudaGraphNodeTypeKernel) continue;
            if (label < 0) {
                label = static_cast<int>(labels.size());
                labels.push_back(cap.launches[l]);
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
                names_known = false;
            cudaGetLastError();  // (a refused name is not an error of the step)
            knodes.push_back(std::move(k));
        }
    }
    const size_t K = knodes.size();
    if (K == 0) throw Error("internal: the captured decode step holds no kernel nodes");

    // 2. instantiated (the clone callback fires now), warmed up, then timed between events without tracing
    CUDA_CHECK(cudaGraphInstantiate(&ss.exec, ss.graph, 0));
    CUDA_CHECK(cudaMemsetAsync(d_state_ + 2, 0, sizeof(int), stream_));  // decode_greedy's ids count
    auto replay = [&] {
        CUDA_CHECK(cudaGraphLaunch(ss.exec, stream_));
        ++*launched;
    };
    for (int i = 0; i < kTimelineWarmup; ++i) replay();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaEventCreate(&ss.ev[0]));
    CUDA_CHECK(cudaEventCreate(&ss.ev[1]));
    std::vector<double> untraced;
    for (int i = 0; i < kTimelineUntraced; ++i) {
        CUDA_CHECK(cudaEventRecord(ss.ev[0], stream_));
        replay();
        CUDA_CHECK(cudaEventRecord(ss.ev[1], stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, ss.ev[0], ss.ev[1]));
        untraced.push_back(ms);
    }

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
    std::unordered_map<uint64_t, size_t> by_id;
    for (size_t k = 0; k < K; ++k) by_id[knodes[k].id] = k;
    size_t via_clone = 0;
    // (a clone of a clone, should instantiation copy the graph first, is followed back to the captured node)
    for (const auto& [clone, orig] : ss.clones) {
        uint64_t up = orig;
        for (int hop = 0; hop < 8 && !by_id.count(up); ++hop) {
            auto next = ss.clones.find(up);
            if (next == ss.clones.end()) break;
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
    t.mapping = "node-id";
    t.note += std::string("ids of ") +
              (via_clone ? "the instantiated graph's clones" : "the captured nodes") +
              (names_known ? std::string(", ") + levels[loosest]
                           : std::string(", names NOT checked (the runtime gave no function names)")) +
              "; ";
    t.note += std::string("graph nodes listed in creation order: ") + (cap.tail_order ? "yes" : "no");

    GraphTimeline s = summarize_timeline(labels, spans, untraced);
    s.ok = true;
    s.mapping = t.mapping;
    s.note = t.note;
    return s;
}

#endif  // MARKBASE_HAS_CUPTI

}  // namespace markbase::cuda
