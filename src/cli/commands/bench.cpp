// markbase bench -m DIR [-p 128] [-n 32] [-r 3] [--json-out FILE]
// A benchmark, not a test: prefill tok/s over a random prompt of -p tokens, then decode ms/token for -n
// tokens, median of -r repetitions; achieved GB/s from the bytes each decoded token must read, next to this
// machine's own read bandwidth measured in the same run. Prints a receipt with a hash of the final logits.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands/bench_cuda.h"
#include "cli/commands/commands.h"
#include "cli/commands/model_options.h"
#include "cpu/memory_bandwidth.h"
#include "cpu/thread_pool.h"
#include "model/error.h"
#include "runtime/timing.h"

namespace markbase::cli {

namespace {

uint64_t fnv1a(const float* p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    const auto* b = reinterpret_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n * sizeof(float); ++i) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}
std::string cpu_name() {
    std::ifstream f("/proc/cpuinfo");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
    return "unknown cpu";
}

}  // namespace

int cmd_bench(const Args& args) {
    if (!args.empty() && args[0] == "load") return cmd_bench_load(Args(args.begin() + 1, args.end()));
    ArgReader a("bench", args);
    if (bench_wants_cuda(a)) return cmd_bench_cuda(a);  // bench_cuda.cpp: --device cuda, --synthetic
    ModelOptions mo = ModelOptions::read(a);
    const int n_prompt = a.integer({"-p", "--n-prompt"}, 128, 1, kMaxTokens);
    const int n_gen = a.integer({"-n", "--n-gen"}, 32, 1, kMaxTokens);
    const int reps = a.integer({"-r", "--repetitions"}, 3, 1, kIntMax);
    const std::string json_out = a.value_or({"--json-out"}, "");
    a.finish();
    mo.backend.ctx_size = std::max<int64_t>(mo.backend.ctx_size, int64_t{n_prompt} + n_gen);

    LoadedModel lm = load_model(mo);
    Backend& be = *lm.backend;
    const ModelConfig& c = be.config();
    const ModelCounts counts = count_params(c);
    const int64_t V = c.vocab_size;

    cpu::ThreadPool pool(mo.backend.threads);
    const cpu::BandwidthResult bw = cpu::measure_read_bandwidth(pool);

    std::mt19937 rng(1234);
    std::vector<int> prompt(n_prompt);
    prompt[0] = c.bos_id;
    for (int i = 1; i < n_prompt; ++i) prompt[i] = static_cast<int>(rng() % static_cast<uint32_t>(V));
    std::vector<float> logits(V);
    std::vector<double> prefill, decode;
    for (int r = 0; r < reps; ++r) {
        be.reset();
        double t0 = now_s();
        be.eval(prompt.data(), n_prompt, logits.data(), false);
        prefill.push_back(now_s() - t0);
        int next = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        double t1 = now_s();
        for (int i = 0; i < n_gen; ++i) {
            be.eval(&next, 1, logits.data(), false);
            next = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        }
        decode.push_back((now_s() - t1) / n_gen);
    }
    const double pf = median(prefill), dc = median(decode);
    const double gbs = counts.bytes_per_token / dc / 1e9;
    const uint64_t hash = fnv1a(logits.data(), logits.size());
    char hash_s[32];
    std::snprintf(hash_s, sizeof hash_s, "%016llx", static_cast<unsigned long long>(hash));

    std::printf("model     %s (%d layers, hidden %d, %.3f B active params, %.3f GB/token)\n",
                mo.model_dir.c_str(), c.n_layers, c.hidden, counts.active_params / 1e9,
                counts.bytes_per_token / 1e9);
    std::printf("device    %s, %s, %u hw threads; measured read bandwidth %.1f GB/s\n", be.name().c_str(),
                cpu_name().c_str(), std::thread::hardware_concurrency(), bw.read_gbs);
    std::printf("prefill   %d tok: %.1f ms, %.1f tok/s (median of %d)\n", n_prompt, pf * 1e3, n_prompt / pf,
                reps);
    std::printf(
        "decode    %d tok after %d: %.2f ms/tok, %.2f tok/s, %.2f GB/s = %.0f%% of measured bandwidth\n",
        n_gen, n_prompt, dc * 1e3, 1.0 / dc, gbs, 100.0 * gbs / bw.read_gbs);
    std::printf("logits    hash %s (greedy chain from a seeded random prompt)\n", hash_s);

    if (!json_out.empty()) {
        std::time_t t = std::time(nullptr);
        char date[32];
        std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
        const char* commit = std::getenv("MARKBASE_COMMIT");
        nlohmann::json j = {{"kind", "cpu-bench"},
                            {"model", mo.model_dir},
                            {"device", cpu_name()},
                            {"threads", be.name()},
                            {"date", date},
                            {"commit", commit ? commit : "unknown"},
                            {"layers", c.n_layers},
                            {"hidden", c.hidden},
                            {"active_params", counts.active_params},
                            {"bytes_per_token", counts.bytes_per_token},
                            {"n_prompt", n_prompt},
                            {"n_gen", n_gen},
                            {"repetitions", reps},
                            {"prefill_s_median", pf},
                            {"prefill_tok_s", n_prompt / pf},
                            {"prefill_s_all", prefill},
                            {"decode_ms_per_tok_median", dc * 1e3},
                            {"decode_s_per_tok_all", decode},
                            {"decode_tok_s", 1.0 / dc},
                            {"decode_gb_s", gbs},
                            {"measured_read_gb_s", bw.read_gbs},
                            {"decode_pct_of_measured_bw", 100.0 * gbs / bw.read_gbs},
                            {"logits_hash", hash_s}};
        std::ofstream f(json_out);
        f << j.dump(2) << "\n";
        if (!f) throw Error(json_out + ": cannot write");
    }
    return 0;
}

}  // namespace markbase::cli
