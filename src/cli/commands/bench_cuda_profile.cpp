// bench_cuda_profile.h: where a step's time goes, for `markbase bench --profile / --timeline`.
#include "cli/commands/bench_cuda_profile.h"

#ifdef MARKBASE_HAS_CUDA

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <string>

#include "loading/checkpoint.h"
#include "model/config.h"
#include "runtime/timing.h"

namespace markbase::cli {

namespace {

struct Agg {
    int calls = 0;
    double ms = 0, bytes = 0;
};

// Profile entries summed by phase over the layers, printed largest first and kept in *out; the total ms.
double phase_table(const std::vector<CudaProfileEntry>& entries, const char* title, nlohmann::json* out) {
    std::map<std::string, Agg> by_phase;
    double total = 0;
    for (const auto& e : entries) {
        Agg& k = by_phase[e.kernel];
        ++k.calls;
        k.ms += e.ms;
        k.bytes += e.bytes;
        total += e.ms;
    }
    std::vector<std::pair<std::string, Agg>> rows(by_phase.begin(), by_phase.end());
    std::sort(rows.begin(), rows.end(),
              [](const auto& x, const auto& y) { return x.second.ms > y.second.ms; });
    std::printf("profile   %s, phase by phase (events, no graph): %.3f ms\n", title, total);
    std::printf("  %-18s %6s %10s %7s %8s\n", "phase", "calls", "total ms", "%", "GB/s");
    for (const auto& [name, k] : rows) {
        std::printf("  %-18s %6d %10.3f %6.1f%% %8.0f\n", name.c_str(), k.calls, k.ms, 100.0 * k.ms / total,
                    k.ms > 0 ? k.bytes / (k.ms * 1e6) : 0.0);
        (*out)[name] = {{"calls", k.calls}, {"ms", k.ms}, {"bytes", k.bytes}};
    }
    return total;
}

}  // namespace

std::vector<int> random_prompt(int n, const ModelConfig& c, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int> p(static_cast<size_t>(std::max(n, 0)));
    if (n > 0) p[0] = c.bos_id;
    for (int i = 1; i < n; ++i) p[i] = static_cast<int>(rng() % static_cast<uint32_t>(c.vocab_size));
    return p;
}

void fill_slots(CudaBackend* be, const ModelConfig& c, const BenchArgs& b, int slots,
                std::vector<int>* slot_ids, std::vector<int>* next) {
    slot_ids->resize(static_cast<size_t>(slots));
    next->resize(static_cast<size_t>(slots));
    for (int sl = 0; sl < slots; ++sl) {
        (*slot_ids)[static_cast<size_t>(sl)] = sl;
        be->slot_reset(sl);
        const std::vector<int> pr = random_prompt(b.n_prompt, c, 1000 + sl);
        be->slot_eval(sl, pr.data(), b.n_prompt);
        (*next)[static_cast<size_t>(sl)] = pr.back();
    }
}

void profile_decode(CudaBackend* be, const BenchArgs& b, const std::vector<int>& prompt, double dc,
                    ProfileRuns* p) {
    be->reset();
    be->eval(prompt.data(), b.n_prompt, nullptr, false);
    be->decode_greedy(1, nullptr);
    const std::vector<CudaProfileEntry> entries = be->profile_step();
    std::map<std::string, Agg> by_kernel;
    std::map<int, double> by_layer;
    for (const auto& e : entries) {
        Agg& k = by_kernel[e.kernel];
        ++k.calls;
        k.ms += e.ms;
        k.bytes += e.bytes;
        by_layer[e.layer] += e.ms;
        p->total += e.ms;
        p->steps.push_back({{"kernel", e.kernel}, {"layer", e.layer}, {"ms", e.ms}, {"bytes", e.bytes}});
    }
    std::vector<std::pair<std::string, Agg>> rows(by_kernel.begin(), by_kernel.end());
    std::sort(rows.begin(), rows.end(),
              [](const auto& x, const auto& y) { return x.second.ms > y.second.ms; });
    std::printf(
        "profile   one decode step, kernel by kernel (events around each launch, no graph, %s): %.3f ms "
        "in "
        "%zu launches; graph step %.3f ms\n",
        be->profile_gated() ? "enqueued whole behind a gate" : "NOT gated: small kernels read high", p->total,
        entries.size(), dc * 1e3);
    std::printf("  %-18s %6s %10s %7s %10s %8s\n", "kernel", "calls", "total ms", "%", "MB", "GB/s");
    for (const auto& [name, k] : rows) {
        std::printf("  %-18s %6d %10.4f %6.1f%% %10.2f %8.1f\n", name.c_str(), k.calls, k.ms,
                    100.0 * k.ms / p->total, k.bytes / 1e6, k.ms > 0 ? k.bytes / (k.ms * 1e-3) / 1e9 : 0.0);
        p->by_kernel[name] = {{"calls", k.calls}, {"ms", k.ms}, {"bytes", k.bytes}};
    }
    std::printf("  per layer (ms):");
    for (const auto& [layer, ms] : by_layer) {
        if (layer < 0)
            std::printf(" outside=%.3f", ms);
        else
            std::printf(" %d=%.3f", layer, ms);
    }
    std::printf("\n");
}

// The prefill the same way, phase by phase (a phase is one or a few launches: GEMMs with their input
// splits, attention, the MoE's router / route / experts / combine): the prompt's last chunk, after its other
// tokens, so a long --prefill-tokens shows the cost deep into the context.
void profile_prefill(CudaBackend* be, const BenchArgs& b, const std::vector<int>& long_prompt, int chunk,
                     ProfileRuns* p) {
    const int n_pp = std::min(b.n_prefill, chunk);
    if (n_pp <= 0) return;
    be->reset();
    p->prefill_at = b.n_prefill - n_pp;
    if (p->prefill_at > 0) be->eval(long_prompt.data(), p->prefill_at, nullptr, false);
    const std::vector<CudaProfileEntry> pp = be->profile_prefill(long_prompt.data() + p->prefill_at, n_pp);
    char title[128];
    std::snprintf(title, sizeof title, "prefill of %d tokens at position %d", n_pp, p->prefill_at);
    p->prefill_total = phase_table(pp, title, &p->prefill_by_phase);
}

MixedRuns bench_mixed(CudaBackend* be, const ModelConfig& c, const BenchArgs& b, int slots) {
    MixedRuns m;
    m.decode_rows = slots - 1;
    m.chunk = be->mixed_rows() - m.decode_rows;
    const int reps = std::max(5, 2 * b.reps), steps = 2 * reps + 4;
    if (slots < 2 || m.chunk < 1) return m;
    if (b.n_prompt + steps > be->ctx_size() || m.chunk > be->ctx_size()) {
        std::printf(
            "mixed     skipped: the context (%lld) holds neither %d + %d positions nor a chunk of %d\n",
            static_cast<long long>(be->ctx_size()), b.n_prompt, steps, m.chunk);
        return m;
    }
    std::vector<int> slot_ids, next;
    fill_slots(be, c, b, m.decode_rows, &slot_ids, &next);
    const int last = m.decode_rows;
    const std::vector<int> chunk = random_prompt(m.chunk, c, 77);
    auto items = [&] {
        std::vector<SlotItem> it;
        for (int t = 0; t < m.decode_rows; ++t) it.push_back({t, &next[static_cast<size_t>(t)], 1, true});
        it.push_back({last, chunk.data(), m.chunk, true});
        return it;
    };
    std::vector<double> mixed, prefill, decode;
    for (int r = 0; r <= reps; ++r) {  // the first round warms up (graphs captured, buffers touched)
        be->slot_reset(last);
        double t0 = now_s();
        be->slot_eval(last, chunk.data(), m.chunk);
        const double p = now_s() - t0;
        be->slot_reset(last);
        std::vector<SlotItem> it = items();
        t0 = now_s();
        std::vector<int> out = be->mixed_batch(it.data(), static_cast<int>(it.size()), nullptr);
        const double x = now_s() - t0;
        std::copy(out.begin(), out.begin() + m.decode_rows, next.begin());
        t0 = now_s();
        next = be->decode_batch(slot_ids.data(), next.data(), m.decode_rows, nullptr);
        const double d = now_s() - t0;
        if (r == 0) continue;
        mixed.push_back(x * 1e3);
        prefill.push_back(p * 1e3);
        decode.push_back(d * 1e3);
    }
    m.ran = true;
    m.mixed_ms = median(mixed);
    m.prefill_ms = median(prefill);
    m.decode_ms = median(decode);
    std::printf(
        "mixed     %d decode rows + a %d-token chunk in one pass: %.3f ms; apart %.3f (the chunk's "
        "prefill) + %.3f (the batched step) = %.3f ms\n",
        m.decode_rows, m.chunk, m.mixed_ms, m.prefill_ms, m.decode_ms, m.prefill_ms + m.decode_ms);
    if (!b.profile) return m;
    be->slot_reset(last);
    std::vector<SlotItem> it = items();
    const std::vector<CudaProfileEntry> pm = be->profile_mixed(it.data(), static_cast<int>(it.size()));
    char title[128];
    std::snprintf(title, sizeof title, "mixed step of %d decode rows and a %d-token chunk", m.decode_rows,
                  m.chunk);
    m.profile_total = phase_table(pm, title, &m.profile_by_phase);
    return m;
}

nlohmann::json mixed_json(const MixedRuns& m) {
    return {{"decode_rows", m.decode_rows},          {"chunk", m.chunk},
            {"mixed_ms_median", m.mixed_ms},         {"apart_prefill_ms_median", m.prefill_ms},
            {"apart_decode_ms_median", m.decode_ms}, {"profile_total_ms", m.profile_total},
            {"profile_by_phase", m.profile_by_phase}};
}

// One batched step of every slot the same way (after each slot's prompt): where the step's time goes. The
// attention phase is split by layer kind, with the K/V bytes its layers read (every slot at n_prompt + 1
// keys, a sliding layer at most its window; KV-shared layers read their source's), so its GB/s show.
void profile_batched(CudaBackend* be, const ModelConfig& c, const BenchArgs& b, int slots, int kv_elem_bytes,
                     ProfileRuns* p) {
    std::vector<int> slot_ids, next;
    fill_slots(be, c, b, slots, &slot_ids, &next);
    std::vector<CudaProfileEntry> pb = be->profile_batch(slot_ids.data(), next.data(), slots);
    for (CudaProfileEntry& e : pb) {
        if (e.kernel != "attention" || e.layer < 0 || e.layer >= c.n_layers) continue;
        const LayerSpec& s = c.layers[static_cast<size_t>(e.layer)];
        const bool sliding = s.kind == AttentionKind::Sliding;
        const int64_t keys = sliding ? std::min<int64_t>(b.n_prompt + 1, c.sliding_window) : b.n_prompt + 1;
        e.kernel = sliding ? "attention_sliding" : "attention_full";
        e.bytes = 2.0 * slots * static_cast<double>(keys) * s.n_kv_heads * s.head_dim * kv_elem_bytes;
    }
    char title[128];
    std::snprintf(title, sizeof title, "batched step of %d sequences after %d tokens", slots, b.n_prompt);
    p->batch_total = phase_table(pb, title, &p->batch_by_phase);
}

namespace {

// The batched step's launches whose bytes run() does not count, as bench's step roofline counts them: the
// experts (those the step's tokens are expected to touch: batched_step_bytes) and attention (the K/V of
// keys positions), so the "why" lines weigh them.
void count_step_bytes(GraphTimeline* t, const ModelConfig& c, int slots, int64_t keys, int kv_elem_bytes,
                      double expert_weight_bytes) {
    const StepBytes sb = batched_step_bytes(c, slots, keys, kv_elem_bytes, expert_weight_bytes);
    const double experts =
        sb.experts_touched * c.n_layers * 3.0 * c.hidden * c.expert_width * expert_weight_bytes;
    for (TimelineKernel& k : t->by_kernel) {
        if (k.name == "experts") k.bytes = experts;
        if (k.name == "attention") k.bytes = sb.kv;
    }
}

}  // namespace

GraphTimeline timeline_batched(CudaBackend* be, const ModelConfig& c, const BenchArgs& b, int slots,
                               int kv_elem_bytes, double roofline_gbs) {
    std::vector<int> slot_ids, next;
    fill_slots(be, c, b, slots, &slot_ids, &next);
    GraphTimeline t = be->batch_timeline(slot_ids.data(), next.data(), slots, kTimelineReplays);
    if (t.ok)
        count_step_bytes(&t, c, slots, b.n_prompt + 1, kv_elem_bytes, be->batch_expert_weight_bytes(slots));
    char what[128];
    std::snprintf(what, sizeof what, "one batched step of %d sequences after %d tokens", slots, b.n_prompt);
    print_timeline(stdout, t, what);
    print_gap(stdout, timeline_gap(t, roofline_gbs, c.n_layers));
    return t;
}

}  // namespace markbase::cli

#endif
