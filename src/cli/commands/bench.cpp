// markbase bench -m DIR [-p 128] [-n 32] [-r 3] [--json-out FILE]
// A benchmark, not a test: prefill tok/s over a random prompt of -p tokens, then decode ms/token for -n
// tokens, median of -r repetitions; achieved GB/s from the bytes each decoded token must read, next to this
// machine's own read bandwidth measured in the same run, and the prompt's matmul GFLOP/s next to the measured
// FMA ceiling of the SIMD path the matmuls run. Prints a receipt with a hash of the final logits.
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
#include "cpu/forward.h"
#include "cpu/matmul.h"
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

struct BenchRuns {
    std::vector<double> prefill, decode;  // seconds per run; decode per token
    std::vector<float> logits;            // after the last run's last step
};

// `reps` runs of a prefill over a seeded random prompt, then n_gen greedy decode steps.
BenchRuns time_runs(Backend& be, int n_prompt, int n_gen, int reps) {
    const ModelConfig& c = be.config();
    const int64_t V = c.vocab_size;
    std::mt19937 rng(1234);
    std::vector<int> prompt(n_prompt);
    prompt[0] = c.bos_id;
    for (int i = 1; i < n_prompt; ++i) prompt[i] = static_cast<int>(rng() % static_cast<uint32_t>(V));
    BenchRuns runs;
    std::vector<float>& logits = runs.logits;
    logits.resize(V);
    for (int r = 0; r < reps; ++r) {
        be.reset();
        double t0 = now_s();
        be.eval(prompt.data(), n_prompt, logits.data(), false);
        runs.prefill.push_back(now_s() - t0);
        int next = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        double t1 = now_s();
        for (int i = 0; i < n_gen; ++i) {
            be.eval(&next, 1, logits.data(), false);
            next = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        }
        runs.decode.push_back((now_s() - t1) / n_gen);
    }
    return runs;
}

// The measurements and the medians the receipt and the JSON report show.
struct BenchResult {
    int n_prompt = 0, n_gen = 0, reps = 0;
    double read_gbs = 0;    // this machine's measured read bandwidth
    double fma_gflops = 0;  // and its measured fp32 multiply-add ceiling on the matmul's SIMD path
    // the measured ceiling of the bf16 dot product when the prompt products run on it (0: they are fp32)
    double bf16_gflops = 0;
    double prefill_flops = 0;  // the prompt's matmul flops: 2 per weight per token, the lm_head's one row
    BenchRuns runs;
    double prefill_s = 0, decode_s = 0, decode_gbs = 0;  // medians; decode per token
    std::string hash;                                    // of the final logits
};

void print_receipt(const ModelOptions& mo, const Backend& be, const ModelCounts& counts,
                   const BenchResult& r) {
    const ModelConfig& c = be.config();
    std::printf("model     %s (%d layers, hidden %d, %.3f B active params, %.3f GB/token)\n",
                mo.model_dir.c_str(), c.n_layers, c.hidden, counts.active_params / 1e9,
                counts.bytes_per_token / 1e9);
    std::printf("device    %s, %s, %u hw threads; measured read bandwidth %.1f GB/s\n", be.name().c_str(),
                cpu_name().c_str(), std::thread::hardware_concurrency(), r.read_gbs);
    const double gflops = r.prefill_flops / r.prefill_s / 1e9;
    const bool bf16 = r.bf16_gflops > 0;
    const double peak = bf16 ? r.bf16_gflops : r.fma_gflops;
    std::printf(
        "prefill   %d tok: %.1f ms, %.1f tok/s (median of %d), %.1f GFLOP/s = %.0f%% of the measured %s peak "
        "(%.1f GFLOP/s)\n",
        r.n_prompt, r.prefill_s * 1e3, r.n_prompt / r.prefill_s, r.reps, gflops, 100.0 * gflops / peak,
        bf16 ? (std::string(cpu::bf16_products_unit()) + " bf16").c_str()
             : (std::string(cpu::matmul_simd_path()) + " FMA").c_str(),
        peak);
    std::printf(
        "decode    %d tok after %d: %.2f ms/tok, %.2f tok/s, %.2f GB/s = %.0f%% of measured bandwidth\n",
        r.n_gen, r.n_prompt, r.decode_s * 1e3, 1.0 / r.decode_s, r.decode_gbs,
        100.0 * r.decode_gbs / r.read_gbs);
    std::printf("logits    hash %s (greedy chain from a seeded random prompt)\n", r.hash.c_str());
}

void write_bench_json(const std::string& path, const ModelOptions& mo, const Backend& be,
                      const ModelCounts& counts, const BenchResult& r) {
    const ModelConfig& c = be.config();
    std::time_t t = std::time(nullptr);
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
    const char* commit = std::getenv("MARKBASE_COMMIT");
    nlohmann::json j = {
        {"kind", "cpu-bench"},
        {"model", mo.model_dir},
        {"device", cpu_name()},
        {"threads", be.name()},
        {"date", date},
        {"commit", commit ? commit : "unknown"},
        {"layers", c.n_layers},
        {"hidden", c.hidden},
        {"active_params", counts.active_params},
        {"bytes_per_token", counts.bytes_per_token},
        {"n_prompt", r.n_prompt},
        {"n_gen", r.n_gen},
        {"repetitions", r.reps},
        {"prefill_s_median", r.prefill_s},
        {"prefill_tok_s", r.n_prompt / r.prefill_s},
        {"prefill_s_all", r.runs.prefill},
        {"prefill_gflop_s", r.prefill_flops / r.prefill_s / 1e9},
        {"measured_fma_peak_gflop_s", r.fma_gflops},
        {"prefill_pct_of_fma_peak", 100.0 * r.prefill_flops / r.prefill_s / 1e9 / r.fma_gflops},
        {"prompt_products",
         r.bf16_gflops > 0 ? std::string("bf16 on ") + cpu::bf16_products_unit() : std::string("exact fp32")},
        {"measured_bf16_unit_peak_gflop_s", r.bf16_gflops},
        {"prefill_pct_of_bf16_unit_peak",
         r.bf16_gflops > 0 ? 100.0 * r.prefill_flops / r.prefill_s / 1e9 / r.bf16_gflops : 0.0},
        {"simd_path", cpu::matmul_simd_path()},
        {"decode_ms_per_tok_median", r.decode_s * 1e3},
        {"decode_s_per_tok_all", r.runs.decode},
        {"decode_tok_s", 1.0 / r.decode_s},
        {"decode_gb_s", r.decode_gbs},
        {"measured_read_gb_s", r.read_gbs},
        {"decode_pct_of_measured_bw", 100.0 * r.decode_gbs / r.read_gbs},
        {"logits_hash", r.hash}};
    std::ofstream f(path);
    f << j.dump(2) << "\n";
    if (!f) throw Error(path + ": cannot write");
}

}  // namespace

int cmd_bench(const Args& args) {
    if (!args.empty() && args[0] == "load") return cmd_bench_load(Args(args.begin() + 1, args.end()));
    ArgReader a("bench", args);
    if (bench_wants_cuda(a)) return cmd_bench_cuda(a);  // bench_cuda.cpp: --device cuda, --synthetic
    ModelOptions mo = ModelOptions::read(a);
    BenchResult r;
    r.n_prompt = a.integer({"-p", "--n-prompt"}, 128, 1, kMaxTokens);
    r.n_gen = a.integer({"-n", "--n-gen"}, 32, 1, kMaxTokens);
    r.reps = a.integer({"-r", "--repetitions"}, 3, 1, kIntMax);
    const std::string json_out = a.value_or({"--json-out"}, "");
    a.finish();
    mo.backend.ctx_size = std::max<int64_t>(mo.backend.ctx_size, int64_t{r.n_prompt} + r.n_gen);

    LoadedModel lm = load_model(mo);
    Backend& be = *lm.backend;
    const ModelCounts counts = count_params(be.config());
    // Kept alive through the timed runs, so that results stay comparable with earlier receipts.
    cpu::ThreadPool pool(mo.backend.threads);
    r.read_gbs = cpu::measure_read_bandwidth(pool).read_gbs;
    r.fma_gflops = cpu::measure_fma_peak_gflops(pool);
    if (cpu::prompt_products(mo.backend.tuning) == cpu::PromptProducts::kBf16)
        r.bf16_gflops = cpu::measure_bf16_peak_gflops(pool);
    const double lm_head = double(be.config().vocab_size) * be.config().hidden;
    r.prefill_flops = 2.0 * ((counts.active_params - lm_head) * r.n_prompt + lm_head);
    r.runs = time_runs(be, r.n_prompt, r.n_gen, r.reps);
    r.prefill_s = median(r.runs.prefill);
    r.decode_s = median(r.runs.decode);
    r.decode_gbs = counts.bytes_per_token / r.decode_s / 1e9;
    char hash[32];
    std::snprintf(hash, sizeof hash, "%016llx",
                  static_cast<unsigned long long>(fnv1a(r.runs.logits.data(), r.runs.logits.size())));
    r.hash = hash;
    print_receipt(mo, be, counts, r);
    if (!json_out.empty()) write_bench_json(json_out, mo, be, counts, r);
    return 0;
}

}  // namespace markbase::cli
