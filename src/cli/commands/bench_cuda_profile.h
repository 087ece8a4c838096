// bench --profile and --timeline's batched step on the CUDA backend (bench_cuda.cpp runs them): the decode
// step kernel by kernel, the prefill's last chunk and one batched step phase by phase (events around each
// launch, no graph), and the batched step inside its graph replay (CUPTI, graph_timeline.h).
#pragma once

#ifdef MARKBASE_HAS_CUDA

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "cli/commands/bench_cuda_setup.h"
#include "cuda/backend.h"
#include "runtime/graph_timeline.h"

namespace markbase::cli {

// BOS, then n - 1 ids drawn from the vocabulary (seeded)
std::vector<int> random_prompt(int n, const ModelConfig& c, uint32_t seed);
// Every slot reset and given its own random prompt (-p tokens); slot_ids = 0.., next = each prompt's last
// token.
void fill_slots(CudaBackend* be, const ModelConfig& c, const BenchArgs& b, int slots,
                std::vector<int>* slot_ids, std::vector<int>* next);

struct ProfileRuns {
    nlohmann::json steps = nlohmann::json::array();
    nlohmann::json by_kernel = nlohmann::json::object();
    double total = 0, prefill_total = 0, batch_total = 0;
    int prefill_at = 0;  // the profiled prefill chunk's first position
    nlohmann::json prefill_by_phase = nlohmann::json::object();
    nlohmann::json batch_by_phase = nlohmann::json::object();
};

// One decode step kernel by kernel (after the prompt and one token); dc: the graph step (s), for the title.
void profile_decode(CudaBackend* be, const BenchArgs& b, const std::vector<int>& prompt, double dc,
                    ProfileRuns* p);
// The prefill's last chunk (of --prefill-tokens), phase by phase.
void profile_prefill(CudaBackend* be, const BenchArgs& b, const std::vector<int>& long_prompt, int chunk,
                     ProfileRuns* p);
// One batched step of every slot after its prompt, phase by phase; attention split by layer kind with the
// K/V bytes its layers read (kv_elem_bytes a cache element).
void profile_batched(CudaBackend* be, const ModelConfig& c, const BenchArgs& b, int slots, int kv_elem_bytes,
                     ProfileRuns* p);
// The serving step two ways (-np N: N - 1 sequences decoding after their prompts, the last slot taking a
// prompt chunk of what -b leaves, as the scheduler's one-pass budget cuts it): one mixed step against the
// chunk's own prefill plus the batched step of the N - 1, medians of repeated runs; with --profile the
// mixed step phase by phase. ran = false where the backend has no mixed steps or the context is too short.
struct MixedRuns {
    bool ran = false;
    int decode_rows = 0, chunk = 0;
    double mixed_ms = 0, prefill_ms = 0, decode_ms = 0;
    double profile_total = 0;
    nlohmann::json profile_by_phase = nlohmann::json::object();
};
MixedRuns bench_mixed(CudaBackend* be, const ModelConfig& c, const BenchArgs& b, int slots);
nlohmann::json mixed_json(const MixedRuns& m);

// The batched step of every slot after its prompt inside its graph replay, printed with its "why" lines
// against roofline_gbs (the experts' bytes as expected touched, attention's its K/V: kv_elem_bytes an
// element).
GraphTimeline timeline_batched(CudaBackend* be, const ModelConfig& c, const BenchArgs& b, int slots,
                               int kv_elem_bytes, double roofline_gbs);

}  // namespace markbase::cli

#endif
