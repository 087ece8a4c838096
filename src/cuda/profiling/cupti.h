// CUPTI for the graph timeline (graph_timeline_cupti.cu): the library loaded at run time (dlopen, never
// linked: the binary must start where it is missing), its activity buffers' kernel records, and the kernel
// names compared between CUPTI's records and the graph's nodes. Only with cupti.h at configure time.
#pragma once

#ifdef MARKBASE_HAS_CUPTI

#include <cupti.h>

#include <cstdint>
#include <string>
#include <vector>

namespace markbase::cuda::profiling {

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

// The library, loaded on first use (loaded = false and why_not when it cannot be).
Cupti& cupti();
std::string cupti_error(CUptiResult r);
void cupti_check(CUptiResult r, const char* what);  // throws markbase::Error naming `what`

// One kernel record, copied out of CUPTI's buffer.
struct KernelRecord {
    uint64_t start = 0, end = 0, node_id = 0;
    uint32_t correlation = 0;
    std::string name;
};
// The activity API's buffer callbacks (cuptiActivityRegisterCallbacks): the kernel records land in a
// process-wide sink that take_records empties.
void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records);
void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid);
// GRAPHNODE_CLONED while a graph is instantiated: user is a std::unordered_map<uint64_t, uint64_t>, clone
// id -> the captured node's id.
void CUPTIAPI on_resource(void* user, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* data);

// A kernel's name as C++ (demangled when it is mangled).
std::string demangled(const std::string& s);
// How closely two kernel names agree: 0 the same, 1 the same without return type and parameters (one side
// may come without a signature), 2 the same function template's unqualified name; -1 different.
int names_agree(const std::string& a, const std::string& b);

// The records collected so far (and, when asked, how many were dropped for bad timestamps); the sink empties.
std::vector<KernelRecord> take_records(size_t* invalid);
// Only our replays ran while tracing (a sync before and after each), so every record is theirs; those with
// no graph node id are dropped only when others have one (with none, the node-id mapping fails and the
// order is tried).
std::vector<KernelRecord> graph_records(std::vector<KernelRecord> recs);
// The records of `replays` graph launches, one vector per launch: grouped by correlation id (a graph
// launch's kernels share it) when that gives whole replays, else, when the count is exact, as consecutive
// runs of K in start order (the replays were serialised by a sync). Partial replays are dropped.
std::vector<std::vector<KernelRecord>> split_replays(std::vector<KernelRecord> recs, int replays, size_t K,
                                                     std::string* note);

}  // namespace markbase::cuda::profiling

#endif  // MARKBASE_HAS_CUPTI
