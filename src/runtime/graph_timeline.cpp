// The decode-step timeline's arithmetic, summary and output (graph_timeline.h). Plain C++: built into the
// core library with or without CUDA, so its tests run everywhere.
#include "runtime/graph_timeline.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>

#include "model/error.h"
#include "runtime/timing.h"

namespace markbase {

ReplayTimes replay_times(const std::vector<TimelineSpan>& spans) {
    ReplayTimes r;
    r.spans.resize(spans.size());
    if (spans.empty()) return r;
    uint64_t t0 = spans[0].start, t1 = spans[0].end;
    for (const TimelineSpan& s : spans) {
        t0 = std::min(t0, s.start);
        t1 = std::max(t1, s.end);
    }
    r.step_ns = static_cast<double>(t1 - t0);

    std::vector<size_t> order(spans.size());
    std::iota(order.begin(), order.end(), size_t{0});
    // by end, ties by start, so the arithmetic does not depend on the input's order
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return spans[a].end != spans[b].end ? spans[a].end < spans[b].end : spans[a].start < spans[b].start;
    });
    uint64_t prev = t0;
    for (size_t i : order) {
        const TimelineSpan& s = spans[i];
        r.spans[i].marginal_ns = static_cast<double>(s.end - std::max(prev, t0));
        r.spans[i].busy_ns = static_cast<double>(s.end - std::min(s.start, s.end));
        prev = s.end;
    }

    // Idle: sweep in start order; a gap is a start after every earlier-starting span has ended. (Taking the
    // latest end over the spans that *end* earlier instead would count a gap that a long span covers.)
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return spans[a].start != spans[b].start ? spans[a].start < spans[b].start
                                                : spans[a].end < spans[b].end;
    });
    uint64_t covered = t0;
    for (size_t i : order) {
        const TimelineSpan& s = spans[i];
        if (s.start > covered) r.idle_ns += static_cast<double>(s.start - covered);
        covered = std::max(covered, s.end);
    }
    return r;
}

namespace {

// Per replay: marginal and busy time per label, the step and idle time, and each span's times.
struct ReplayStats {
    std::vector<std::vector<double>> marg, busy;  // [label][replay]
    std::vector<double> steps, idles;             // [replay]
    std::vector<ReplayTimes> times;               // [replay]
    std::vector<size_t> spans_per_label;          // over all replays
};

ReplayStats replay_stats(size_t L, const std::vector<std::vector<TimelineSpan>>& replays) {
    ReplayStats r;
    r.marg.resize(L);
    r.busy.resize(L);
    r.spans_per_label.assign(L, 0);
    for (const auto& spans : replays) {
        ReplayTimes rt = replay_times(spans);
        std::vector<double> m(L, 0.0), b(L, 0.0);
        for (size_t i = 0; i < spans.size(); ++i) {
            const int lb = spans[i].label;
            if (lb < 0 || static_cast<size_t>(lb) >= L)
                throw Error("internal: timeline span label " + std::to_string(lb) + " outside the " +
                            std::to_string(L) + " labels");
            m[static_cast<size_t>(lb)] += rt.spans[i].marginal_ns;
            b[static_cast<size_t>(lb)] += rt.spans[i].busy_ns;
            ++r.spans_per_label[static_cast<size_t>(lb)];
        }
        for (size_t l = 0; l < L; ++l) {
            r.marg[l].push_back(m[l]);
            r.busy[l].push_back(b[l]);
        }
        r.steps.push_back(rt.step_ns);
        r.idles.push_back(rt.idle_ns);
        r.times.push_back(std::move(rt));
    }
    return r;
}

// Per name: the (name, layer) labels' medians summed, in first-appearance order, then by marginal time.
void fill_by_kernel(GraphTimeline& t, const std::vector<TimelineLabel>& labels, const ReplayStats& st,
                    size_t n_replays) {
    std::map<std::string, size_t> at;
    for (size_t l = 0; l < labels.size(); ++l) {
        const TimelineLabel& lb = labels[l];
        auto [it, fresh] = at.emplace(lb.name, t.by_kernel.size());
        if (fresh) t.by_kernel.push_back({lb.name, 0, 0, 0.0, 0.0, 0.0});
        TimelineKernel& k = t.by_kernel[it->second];
        k.calls += lb.calls;
        k.kernels += static_cast<int>(st.spans_per_label[l] / n_replays);
        k.marginal_ms += median(st.marg[l]) * 1e-6;
        k.busy_ms += median(st.busy[l]) * 1e-6;
        k.bytes += lb.bytes;
    }
    std::stable_sort(
        t.by_kernel.begin(), t.by_kernel.end(),
        [](const TimelineKernel& a, const TimelineKernel& b) { return a.marginal_ms > b.marginal_ms; });
    for (const TimelineKernel& k : t.by_kernel) t.marginal_sum_ms += k.marginal_ms;
}

// The labels of the median replay (median() takes the upper middle for an even count; the same one here).
void fill_per_launch(GraphTimeline& t, const std::vector<TimelineLabel>& labels,
                     const std::vector<std::vector<TimelineSpan>>& replays, const ReplayStats& st) {
    const size_t L = labels.size();
    std::vector<size_t> order(replays.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return st.steps[a] < st.steps[b]; });
    const size_t r = order[order.size() / 2];
    const auto& spans = replays[r];
    uint64_t t0 = spans.empty() ? 0 : spans[0].start;
    for (const TimelineSpan& s : spans) t0 = std::min(t0, s.start);
    std::vector<TimelineLaunch> per(L);
    std::vector<bool> seen(L, false);
    for (size_t i = 0; i < spans.size(); ++i) {
        const size_t l = static_cast<size_t>(spans[i].label);
        TimelineLaunch& p = per[l];
        const double s = static_cast<double>(spans[i].start - t0) * 1e-6;
        const double e = static_cast<double>(spans[i].end - t0) * 1e-6;
        p.start_ms = seen[l] ? std::min(p.start_ms, s) : s;
        p.end_ms = seen[l] ? std::max(p.end_ms, e) : e;
        p.marginal_ms += st.times[r].spans[i].marginal_ns * 1e-6;
        p.busy_ms += st.times[r].spans[i].busy_ns * 1e-6;
        seen[l] = true;
    }
    for (size_t l = 0; l < L; ++l) {
        if (!seen[l]) continue;
        per[l].name = labels[l].name;
        per[l].layer = labels[l].layer;
        t.per_launch.push_back(per[l]);
    }
}

}  // namespace

GraphTimeline summarize_timeline(const std::vector<TimelineLabel>& labels,
                                 const std::vector<std::vector<TimelineSpan>>& replays,
                                 const std::vector<double>& untraced_ms) {
    GraphTimeline t;
    t.replays = static_cast<int>(replays.size());
    t.step_ms_untraced = median(untraced_ms);
    if (replays.empty()) return t;
    const ReplayStats st = replay_stats(labels.size(), replays);
    t.step_ms = median(st.steps) * 1e-6;
    t.idle_ms = median(st.idles) * 1e-6;
    fill_by_kernel(t, labels, st, replays.size());
    fill_per_launch(t, labels, replays, st);
    return t;
}

void print_timeline(std::FILE* f, const GraphTimeline& t, const char* what) {
    if (!t.ok) {
        std::fprintf(f, "timeline  %s not measured: %s\n", what, t.why_not.c_str());
        return;
    }
    std::fprintf(f,
                 "timeline  %s inside its graph replay (CUPTI kernel records, median of %d replays; "
                 "marginal = the time a kernel adds to the step's end)\n",
                 what, t.replays);
    std::fprintf(f, "  %-18s %6s %11s %7s %9s %9s\n", "name", "calls", "marginal ms", "%", "busy ms", "GB/s");
    for (const TimelineKernel& k : t.by_kernel) {
        const double pct = t.step_ms > 0 ? 100.0 * k.marginal_ms / t.step_ms : 0.0;
        std::fprintf(f, "  %-18s %6d %11.4f %6.1f%% %9.4f %9.1f\n", k.name.c_str(), k.calls, k.marginal_ms,
                     pct, k.busy_ms, k.gbs());
    }
    std::fprintf(f,
                 "  step %.4f ms (timeline), %.4f ms (events, no CUPTI), idle %.4f ms, marginals sum to "
                 "%.4f ms; mapping %s\n",
                 t.step_ms, t.step_ms_untraced, t.idle_ms, t.marginal_sum_ms, t.mapping.c_str());
    if (!t.note.empty()) std::fprintf(f, "  note: %s\n", t.note.c_str());
}

nlohmann::json timeline_json(const GraphTimeline& t) {
    nlohmann::json j = {{"ok", t.ok}};
    if (!t.ok) {
        j["why_not"] = t.why_not;
        return j;
    }
    nlohmann::json by = nlohmann::json::object();
    for (const TimelineKernel& k : t.by_kernel)
        by[k.name] = {{"calls", k.calls},
                      {"kernels", k.kernels},
                      {"marginal_ms", k.marginal_ms},
                      {"pct_of_step", t.step_ms > 0 ? 100.0 * k.marginal_ms / t.step_ms : 0.0},
                      {"busy_ms", k.busy_ms},
                      {"bytes", k.bytes},
                      {"gb_s", k.gbs()}};
    nlohmann::json per = nlohmann::json::array();
    for (const TimelineLaunch& p : t.per_launch)
        per.push_back({{"name", p.name},
                       {"layer", p.layer},
                       {"marginal_ms", p.marginal_ms},
                       {"busy_ms", p.busy_ms},
                       {"start_ms", p.start_ms},
                       {"end_ms", p.end_ms}});
    j.update({{"step_ms", t.step_ms},
              {"step_ms_untraced", t.step_ms_untraced},
              {"idle_ms", t.idle_ms},
              {"marginal_sum_ms", t.marginal_sum_ms},
              {"mapping", t.mapping},
              {"note", t.note},
              {"replays", t.replays},
              {"by_kernel", by},
              {"per_launch", per}});
    return j;
}

TimelineGap timeline_gap(const GraphTimeline& t, double roofline_gbs, int n_layers) {
    TimelineGap g;
    if (!t.ok || roofline_gbs <= 0 || t.step_ms <= 0) return g;
    g.ok = true;
    g.roofline_gbs = roofline_gbs;
    g.step_ms = t.step_ms;
    auto at_roofline_ms = [&](double bytes) { return bytes / (roofline_gbs * 1e9) * 1e3; };
    std::map<std::string, bool> outside;  // names launched outside the layers (embed, lm_head, ...)
    int layer_launches = 0;
    double layer_ms = 0;
    for (const TimelineLaunch& p : t.per_launch) {
        if (p.layer < 0) {
            outside[p.name] = true;
        } else {
            ++layer_launches;
            layer_ms += p.marginal_ms;
        }
    }
    double layer_bytes = 0;
    for (const TimelineKernel& k : t.by_kernel) {
        g.bytes += k.bytes;
        if (!outside.count(k.name)) layer_bytes += k.bytes;
        if (k.bytes > 0) {
            g.weight_ms += k.marginal_ms;
        } else {
            g.other_ms += k.marginal_ms;
            if (g.other_top.size() < 4)
                g.other_top.push_back({k.name, k.marginal_ms});  // by_kernel is sorted
        }
    }
    g.bytes_ms = at_roofline_ms(g.bytes);
    g.weight_over_ms = g.weight_ms - g.bytes_ms;
    g.unattributed_ms = t.step_ms - t.marginal_sum_ms;
    if (n_layers > 0 && layer_launches > 0) {
        g.layer_launches = static_cast<double>(layer_launches) / n_layers;
        g.layer_us = layer_ms * 1e3 / n_layers;
        g.layer_bytes_us = at_roofline_ms(layer_bytes) * 1e3 / n_layers;
        g.per_launch_over_us = (g.layer_us - g.layer_bytes_us) / g.layer_launches;
    }
    return g;
}

void print_gap(std::FILE* f, const TimelineGap& g) {
    if (!g.ok) return;
    std::fprintf(f,
                 "why       the step takes %.3f ms; the %.2f GB its launches read take %.3f ms at %.2f TB/s "
                 "(+%.3f ms):\n",
                 g.step_ms, g.bytes / 1e9, g.bytes_ms, g.roofline_gbs / 1e3, g.step_ms - g.bytes_ms);
    std::fprintf(
        f, "            launches that stream bytes: %.3f ms = %.2f TB/s, %+.3f ms beyond their bytes\n",
        g.weight_ms, g.weight_ms > 0 ? g.bytes / (g.weight_ms * 1e-3) / 1e12 : 0.0, g.weight_over_ms);
    std::fprintf(f, "            launches that stream none: %.3f ms (", g.other_ms);
    for (size_t i = 0; i < g.other_top.size(); ++i)
        std::fprintf(f, "%s%s %.3f", i ? ", " : "", g.other_top[i].first.c_str(), g.other_top[i].second);
    std::fprintf(f, "%s); charged to no launch: %.3f ms\n", g.other_top.empty() ? "none" : ", ...",
                 g.unattributed_ms);
    if (g.layer_launches > 0)
        std::fprintf(
            f,
            "            per layer: %.1f dependent launches in %.1f us, %.1f us of it the layer's bytes: "
            "%.2f us per launch beyond its bytes\n",
            g.layer_launches, g.layer_us, g.layer_bytes_us, g.per_launch_over_us);
}

nlohmann::json gap_json(const TimelineGap& g) {
    nlohmann::json top = nlohmann::json::object();
    for (const auto& [name, ms] : g.other_top) top[name] = ms;
    return {{"ok", g.ok},
            {"roofline_gb_s", g.roofline_gbs},
            {"step_ms", g.step_ms},
            {"bytes", g.bytes},
            {"bytes_ms_at_roofline", g.bytes_ms},
            {"weight_launches_ms", g.weight_ms},
            {"weight_launches_over_bytes_ms", g.weight_over_ms},
            {"no_weight_launches_ms", g.other_ms},
            {"no_weight_launches_top_ms", top},
            {"unattributed_ms", g.unattributed_ms},
            {"launches_per_layer", g.layer_launches},
            {"us_per_layer", g.layer_us},
            {"bytes_us_per_layer", g.layer_bytes_us},
            {"us_per_launch_beyond_bytes", g.per_launch_over_us}};
}

}  // namespace markbase
