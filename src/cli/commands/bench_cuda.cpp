// markbase bench --device cuda [-m DIR | --synthetic VARIANT [--layers N] [--seed S]] [-p 128] [-n 256]
//     [-r 3] [--prefill-tokens 512] [-np N] [--profile] [--timeline] [--json-out FILE]
// Decode at batch 1: prefill a seeded random prompt of -p tokens, then -n greedy tokens decoded on the device
// (one CUDA-graph launch per token, ids copied back once), median of -r repetitions; achieved GB/s from the
// bytes each token must read (count_params) against the H200's 4.16 TB/s read roofline. Prefill tok/s over a
// separate --prefill-tokens prompt. -np N: N sequences decoded together (batched decode), and the serving
// step of N - 1 decodes and a prompt chunk as one mixed pass against the two apart. --profile times one
// decode step kernel by kernel (bench_cuda_profile.cpp). --timeline: where the graph step's time goes inside
// its replay (CUPTI kernel records, graph_timeline.h), the decode step's and with -np the batched step's;
// without CUPTI it says why and the bench goes on. Prints a receipt with a
// logits hash.
#include "cli/commands/bench_cuda.h"

#include "runtime/timing.h"

#ifdef MARKBASE_HAS_CUDA

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cli/commands/bench_cuda_profile.h"
#include "cli/commands/bench_cuda_setup.h"
#include "cli/commands/model_options.h"
#include "cuda/backend.h"
#include "loading/quant_checkpoint.h"
#include "model/error.h"
#include "runtime/generate.h"

namespace markbase::cli {

namespace {

constexpr double kRooflineGBs = 4160.0;  // PERFORMANCE.md: measured H200 HBM read

std::string hash_hex(const void* p, size_t bytes) {
    uint64_t h = 1469598103934665603ull;
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < bytes; ++i) h = (h ^ b[i]) * 1099511628211ull;
    char s[32];
    std::snprintf(s, sizeof s, "%016llx", static_cast<unsigned long long>(h));
    return s;
}

// The timed runs at batch 1: prefill of the long prompt, greedy decode after the prompt, and sampled decode.
struct DecodeRuns {
    std::vector<double> prefill, decode;  // s per prefill; s per token
    std::vector<float> logits;            // the last decode's final logits
    std::vector<int> ids;                 // the last decode's ids
    double sampled_dev_ms = 0, sampled_host_ms = 0;
    double pf = 0, dc = 0;     // medians
    std::string prefill_note;  // how the prefill ran (CudaBackend::prefill_note), after these runs
};

// What `markbase run` pays per token with Gemma's default sampling (top_k 64, top_p 0.95, T 1): the
// generation loop, selecting on the device (k candidates cross the bus), or with the whole row copied to the
// host sampler.
double sampled_ms(CudaBackend* be, const std::vector<int>& prompt, const BenchArgs& b, bool device) {
    GenerateOptions go;
    go.max_new_tokens = b.n_gen;
    go.ignore_eos = true;
    go.sampling.top_k = 64;
    go.sampling.top_p = 0.95f;
    go.sampling.temperature = 1.0f;
    go.sampling.seed = 5;
    go.device_select = device;
    std::vector<double> per;
    for (int r = 0; r < b.reps; ++r) {
        be->reset();
        const GenerateStats st = generate(*be, prompt, go, [](int) { return true; });
        per.push_back(st.generated > 1 ? st.decode_s / (st.generated - 1) : 0.0);
    }
    return median(per) * 1e3;
}

DecodeRuns bench_decode(CudaBackend* be, const BenchArgs& b, const std::vector<int>& prompt,
                        const std::vector<int>& long_prompt, int64_t V) {
    DecodeRuns d;
    // warm-up: module load, cuBLAS handles, graph capture
    be->reset();
    be->eval(prompt.data(), b.n_prompt, nullptr, false);
    be->decode_greedy(4, nullptr);

    for (int r = 0; r < b.reps && b.n_prefill > 0; ++r) {
        be->reset();
        const double t0 = now_s();
        be->eval(long_prompt.data(), b.n_prefill, nullptr, false);
        d.prefill.push_back(now_s() - t0);
    }
    d.logits.resize(V);
    for (int r = 0; r < b.reps; ++r) {
        be->reset();
        be->eval(prompt.data(), b.n_prompt, nullptr, false);
        const double t0 = now_s();
        d.ids = be->decode_greedy(b.n_gen, r + 1 == b.reps ? d.logits.data() : nullptr);
        d.decode.push_back((now_s() - t0) / b.n_gen);
    }
    d.sampled_dev_ms = sampled_ms(be, prompt, b, true);
    d.sampled_host_ms = sampled_ms(be, prompt, b, false);
    d.pf = median(d.prefill);
    d.dc = median(d.decode);
    d.prefill_note = be->prefill_note();
    return d;
}

// Batched decode: every slot gets its own random prompt, then n_gen steps of one token per slot (greedy);
// tokens/s over all slots against the one-sequence step. The median step (s) and the last run's ids hash.
double bench_batched(CudaBackend* be, const ModelConfig& c, const BenchArgs& b, int slots, double dc,
                     std::string* batch_ids_hash) {
    std::vector<int> slot_ids, next;
    std::vector<double> per;
    for (int r = 0; r < b.reps; ++r) {
        fill_slots(be, c, b, slots, &slot_ids, &next);
        std::vector<int> all;
        // warm-up step (it feeds each prompt's last token again; the timed steps feed the greedy ids)
        next = be->decode_batch(slot_ids.data(), next.data(), slots, nullptr);
        const double t0 = now_s();
        for (int g = 0; g < b.n_gen; ++g) {
            next = be->decode_batch(slot_ids.data(), next.data(), slots, nullptr);
            all.insert(all.end(), next.begin(), next.end());
        }
        per.push_back((now_s() - t0) / b.n_gen);
        if (r + 1 == b.reps) *batch_ids_hash = hash_hex(all.data(), all.size() * sizeof(int));
    }
    const double batch_step = median(per);
    std::printf(
        "batched   %d sequences x %d steps: %.3f ms/step, %.1f tok/s = %.2fx the one-sequence decode's "
        "tokens/s "
        "(ids hash %s)\n",
        slots, b.n_gen, batch_step * 1e3, slots / batch_step, slots * dc / batch_step,
        batch_ids_hash->c_str());
    return batch_step;
}

// The batched step against the bytes it must read (batched_step_bytes) at the read roofline (GB/s).
void print_step_roofline(const StepBytes& sb, double step_s, double roofline_gbs, int n_experts) {
    const double bytes = sb.weights + sb.kv, floor_ms = bytes / (roofline_gbs * 1e6);
    char experts[96] = "";
    if (n_experts > 0)
        std::snprintf(experts, sizeof experts, "; ~%.1f of %d experts per layer touched if routed uniformly",
                      sb.experts_touched, n_experts);
    std::printf(
        "batched   a step reads >= %.2f GB (weights %.2f, K/V %.2f%s): %.3f ms at %.2f TB/s, %.1f%% of it\n",
        bytes / 1e9, sb.weights / 1e9, sb.kv / 1e9, experts, floor_ms, roofline_gbs / 1e3,
        step_s > 0 ? 100.0 * floor_ms / (step_s * 1e3) : 0.0);
}

}  // namespace

bool bench_wants_cuda(ArgReader& a) {
    if (a.value({"--synthetic"})) return true;
    return resolve_device(a.value_or({"--device", "-dev"}, "auto")) == "cuda";
}

namespace {

// The one-sequence receipt on stdout.
void print_decode(const BenchModel& m, CudaBackend* be, const BenchArgs& b, const DecodeRuns& d, double gbs,
                  double roofline, int tp, const std::string& logits_hash, const std::string& ids_hash) {
    const ModelConfig& c = be->config();
    const ModelCounts counts = count_params(c, m.weights);
    const CudaDeviceInfo dev = be->device();
    std::printf(
        "model     %s (%d layers, hidden %d, %.3f B active params, %.3f GB/token, %.1f GB on the GPU)\n",
        m.label.c_str(), c.n_layers, c.hidden, counts.active_params / 1e9, counts.bytes_per_token / 1e9,
        be->weight_bytes() / 1e9);
    std::printf("device    %s, %d SMs, %.1f GiB; weights ready in %.1f s; KV cache %s %.1f MB\n",
                dev.name.c_str(), dev.sm_count, dev.memory_gib, m.load_s, gpu_kv_name(m.kv_dtype, m.slots),
                be->cache_bytes() / 1e6);
    if (b.n_prefill > 0)
        std::printf("prefill   %d tok: %.1f ms, %.1f tok/s (median of %d)\n", b.n_prefill, d.pf * 1e3,
                    b.n_prefill / d.pf, b.reps);
    if (!d.prefill_note.empty()) std::printf("prefill   %s\n", d.prefill_note.c_str());
    std::printf(
        "decode    %d tok after %d: %.3f ms/tok, %.1f tok/s, %.1f GB/s = %.1f%% of the %.2f TB/s roofline\n",
        b.n_gen, b.n_prompt, d.dc * 1e3, 1.0 / d.dc, gbs, 100.0 * gbs / roofline, roofline / 1e3);
    if (const std::string t = tuning_string(m.tuning); !t.empty()) std::printf("tuning    %s\n", t.c_str());
    if (tp > 1)
        std::printf("parallel  tensor parallel over %d GPUs (roofline %d x %.2f TB/s)\n", tp, tp,
                    kRooflineGBs / 1e3);
    std::printf(
        "sampled   top_k 64, top_p 0.95, T 1 through the generation loop: %.3f ms/tok selecting on the "
        "device, %.3f ms/tok with the row copied to the host sampler\n",
        d.sampled_dev_ms, d.sampled_host_ms);
    std::printf("logits    hash %s, ids hash %s (greedy chain from a seeded random prompt)\n",
                logits_hash.c_str(), ids_hash.c_str());
}

// --json-out: the receipt's fields.
struct Receipt {
    double gbs = 0, roofline = 0, batch_step = 0;
    StepBytes batch_bytes;  // what the timed batched steps must read (at their middle position)
    int tp = 1;
    std::string logits_hash, ids_hash, batch_ids_hash;
};

// --timeline: the decode step's and (with -np) the batched step's, each where it ran
struct Timelines {
    GraphTimeline decode, batch;
    bool has_decode = false, has_batch = false;
};

void write_receipt(const std::string& path, const BenchModel& m, CudaBackend* be, const BenchArgs& b,
                   const DecodeRuns& d, const Receipt& r, const ProfileRuns& p, const Timelines& tls,
                   const MixedRuns& mx) {
    const ModelConfig& c = be->config();
    const ModelCounts counts = count_params(c, m.weights);
    const CudaDeviceInfo dev = be->device();
    const double pf = d.pf, dc = d.dc, batch_step = r.batch_step;
    const int slots = m.slots;
    std::time_t t = std::time(nullptr);
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
    const char* commit = std::getenv("MARKBASE_COMMIT");
    nlohmann::json j = {
        {"kind", "cuda-bench"},
        {"model", m.label},
        {"weights", weight_format_name(m.weights)},
        {"device", dev.name},
        {"sm_count", dev.sm_count},
        {"date", date},
        {"commit", commit ? commit : "unknown"},
        {"tuning", tuning_string(m.tuning)},
        {"dtype",
         std::string("bf16 weights, fp32 activations, ") + gpu_kv_name(m.kv_dtype, m.slots) + " KV cache"},
        {"kv_cache_dtype", gpu_kv_name(m.kv_dtype, m.slots)},
        {"batch", 1},
        {"layers", c.n_layers},
        {"hidden", c.hidden},
        {"active_params", counts.active_params},
        {"bytes_per_token", counts.bytes_per_token},
        {"weight_bytes_on_gpu", be->weight_bytes()},
        {"kv_cache_bytes", be->cache_bytes()},
        {"ctx_size", be->ctx_size()},
        {"load_s", m.load_s},
        {"n_prompt", b.n_prompt},
        {"n_gen", b.n_gen},
        {"repetitions", b.reps},
        {"prefill_tokens", b.n_prefill},
        {"prefill_s_median", pf},
        {"prefill_tok_s", pf > 0 ? b.n_prefill / pf : 0.0},
        {"prefill_s_all", d.prefill},
        {"prefill_note", d.prefill_note},
        {"decode_ms_per_tok_median", dc * 1e3},
        {"decode_s_per_tok_all", d.decode},
        {"decode_tok_s", 1.0 / dc},
        {"sampled_ms_per_tok_device_select", d.sampled_dev_ms},
        {"sampled_ms_per_tok_host_sampler", d.sampled_host_ms},
        {"decode_gb_s", r.gbs},
        {"tensor_parallel", r.tp},
        {"batch_slots", slots},
        {"batch_ms_per_step", batch_step * 1e3},
        {"batch_tok_s", batch_step > 0 ? slots / batch_step : 0.0},
        {"batch_speedup_vs_one_sequence", batch_step > 0 ? slots * dc / batch_step : 0.0},
        {"batch_step_weight_bytes", r.batch_bytes.weights},
        {"batch_step_kv_bytes", r.batch_bytes.kv},
        {"batch_experts_touched_per_layer_expected", r.batch_bytes.experts_touched},
        {"batch_step_roofline_ms", (r.batch_bytes.weights + r.batch_bytes.kv) / (r.roofline * 1e6)},
        {"batch_pct_of_step_roofline",
         batch_step > 0 ? 100.0 * (r.batch_bytes.weights + r.batch_bytes.kv) / (r.roofline * 1e9 * batch_step)
                        : 0.0},
        {"batch_ids_hash", r.batch_ids_hash},
        {"roofline_gb_s", r.roofline},
        {"decode_pct_of_roofline", 100.0 * r.gbs / r.roofline},
        {"logits_hash", r.logits_hash},
        {"ids_hash", r.ids_hash},
        {"profile_total_ms", p.total},
        {"profile_gated", b.profile && be->profile_gated()},
        {"profile_by_kernel", p.by_kernel},
        {"profile_prefill_total_ms", p.prefill_total},
        {"profile_prefill_at", p.prefill_at},
        {"profile_prefill_by_phase", p.prefill_by_phase},
        {"profile_batch_total_ms", p.batch_total},
        {"profile_batch_by_phase", p.batch_by_phase},
        {"profile", p.steps}};
    if (tls.has_decode) {
        j["timeline"] = timeline_json(tls.decode);
        j["timeline_gap"] = gap_json(timeline_gap(tls.decode, kRooflineGBs, c.n_layers));
    }
    if (mx.ran) j["mixed_step"] = mixed_json(mx);
    if (tls.has_batch) {
        j["batch_timeline"] = timeline_json(tls.batch);
        j["batch_timeline_gap"] = gap_json(timeline_gap(tls.batch, kRooflineGBs, c.n_layers));
    }
    std::ofstream f(path);
    f << j.dump(1) << "\n";
    if (!f) throw Error(path + ": cannot write");
}

}  // namespace

int cmd_bench_cuda(ArgReader& a) {
    const BenchArgs b = parse_bench(a);
    BenchModel m = load_backend(a, b);
    auto* be = dynamic_cast<CudaBackend*>(m.owner.get());
    if (!be) throw Error("internal: the CUDA bench got a non-CUDA backend");
    const ModelConfig& c = be->config();
    const std::vector<int> prompt = random_prompt(b.n_prompt, c, 1234);
    const std::vector<int> long_prompt = random_prompt(b.n_prefill, c, 4321);

    const DecodeRuns d = bench_decode(be, b, prompt, long_prompt, c.vocab_size);
    Receipt r;
    // With tensor parallelism the roofline is the GPUs' together (each streams its share of the weights).
    r.tp = m.bo.tensor_parallel > 1 ? m.bo.tensor_parallel : std::max(1, m.checkpoint_tp);
    r.roofline = kRooflineGBs * r.tp;
    r.gbs = count_params(c, m.weights).bytes_per_token / d.dc / 1e9;
    r.logits_hash = hash_hex(d.logits.data(), d.logits.size() * sizeof(float));
    r.ids_hash = hash_hex(d.ids.data(), d.ids.size() * sizeof(int));
    print_decode(m, be, b, d, r.gbs, r.roofline, r.tp, r.logits_hash, r.ids_hash);
    const int kv_elem = gpu_kv_bytes(m.kv_dtype, m.slots);
    if (m.slots > 1) {
        r.batch_step = bench_batched(be, c, b, m.slots, d.dc, &r.batch_ids_hash);
        r.batch_bytes = batched_step_bytes(c, m.slots, b.n_prompt + 1 + b.n_gen / 2, kv_elem,
                                           be->batch_expert_weight_bytes(m.slots));
        print_step_roofline(r.batch_bytes, r.batch_step, r.roofline, c.n_experts);
    }
    const MixedRuns mx = m.slots > 1 ? bench_mixed(be, c, b, m.slots) : MixedRuns{};

    ProfileRuns p;
    if (b.profile) {
        profile_decode(be, b, prompt, d.dc, &p);
        profile_prefill(be, b, long_prompt, m.chunk, &p);
        if (m.slots > 1) profile_batched(be, c, b, m.slots, kv_elem, &p);
    }
    // The graph step from the inside: after the prompt and one token, as the profile starts
    Timelines tls;
    if (b.timeline) {
        be->reset();
        be->eval(prompt.data(), b.n_prompt, nullptr, false);
        be->decode_greedy(1, nullptr);
        tls.decode = be->decode_timeline(kTimelineReplays);
        tls.has_decode = true;
        print_timeline(stdout, tls.decode);
        // the step against the roofline: bytes, the weight launches' excess, the rest, per launch per layer
        // (one GPU's timeline, so one GPU's roofline)
        print_gap(stdout, timeline_gap(tls.decode, kRooflineGBs, c.n_layers));
        if (m.slots > 1) {
            tls.batch = timeline_batched(be, c, b, m.slots, kv_elem, kRooflineGBs);
            tls.has_batch = true;
        }
    }
    if (!b.json_out.empty()) write_receipt(b.json_out, m, be, b, d, r, p, tls, mx);
    return 0;
}

}  // namespace markbase::cli

#else

#include "model/error.h"

namespace markbase::cli {
bool bench_wants_cuda(ArgReader& a) {
    const auto dev = a.value({"--device", "-dev"});
    return a.value({"--synthetic"}).has_value() || (dev && *dev == "cuda");
}
int cmd_bench_cuda(ArgReader&) {
    throw Error(
        "bench: --device cuda / --synthetic need the CUDA backend, which this build does not have "
        "(configure where nvcc is found, or with -DMARKBASE_CUDA=ON)");
}
}  // namespace markbase::cli

#endif
