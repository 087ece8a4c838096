// CUPTI loaded at run time, its kernel records and the kernel names (cupti.h).
#ifdef MARKBASE_HAS_CUPTI

#include <cxxabi.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <type_traits>
#include <unordered_map>

#include "cuda/profiling/cupti.h"
#include "model/error.h"

namespace markbase::cuda::profiling {

namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

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
namespace {

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

}  // namespace

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

}  // namespace markbase::cuda::profiling

#endif  // MARKBASE_HAS_CUPTI
