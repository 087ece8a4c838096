// markbase-quant-quality [--format fp8|int4] [-m DIR] [-f TEXT_FILE] [-p PROMPT] [-n 128] [-t THREADS]
//                        [--json-out FILE]
// The quality receipt of a quantised format (issue 31): a checkpoint loaded as bf16 and with --quantize fp8
// or int4 (default fp8), both on the CPU backend: the max |logit - bf16 logit| over the prompt and along
// bf16's greedy run of N tokens, top-1 agreement along that run (the quantised model fed the same tokens),
// how far the quantised model's own greedy run follows bf16's, perplexity of a text file (windows of 512, as
// `markbase perplexity`), load and decode times. Defaults: the bundled model and its held-out text.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "loading/checkpoint.h"
#include "loading/quant_checkpoint.h"
#include "model/error.h"
#include "runtime/backend.h"
#include "runtime/perplexity.h"
#include "tokenizer/tokenizer.h"

using namespace markbase;

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Options {
    WeightFormat format = WeightFormat::kFp8;
    std::string model = std::string(MARKBASE_SOURCE_DIR) + "/models/default";
    std::string text = std::string(MARKBASE_SOURCE_DIR) + "/data/corpus/heldout.txt";
    std::string prompt = "And God said unto Moses,";
    int n = 128;
    int threads = 0;
    std::string json_out;
};

struct Model {
    std::unique_ptr<Checkpoint> ck;
    double load_s = 0;
    std::unique_ptr<Backend> backend(const Options& o, int64_t ctx) const {
        BackendOptions b;
        b.threads = o.threads;
        b.ctx_size = ctx;
        return make_cpu_backend(*ck, b);
    }
};

Model load(const std::string& dir, WeightFormat q) {
    const auto t0 = Clock::now();
    Model m;
    m.ck = load_checkpoint(dir, LoadOptions{.quantize = q});
    m.load_s = since(t0);
    return m;
}

int argmax(const float* row, int64_t V) {
    return static_cast<int>(std::max_element(row, row + V) - row);
}

// Greedy from `prompt` for n tokens; the ids (prompt included) and the decode seconds per token.
std::vector<int> greedy(Backend& be, std::vector<int> ids, int n, double* s_per_token) {
    const int64_t V = be.config().vocab_size;
    std::vector<float> row(V);
    be.reset();
    be.eval(ids.data(), static_cast<int64_t>(ids.size()), row.data(), false);
    const auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) {
        ids.push_back(argmax(row.data(), V));
        if (i + 1 < n) be.eval(&ids.back(), 1, row.data(), false);
    }
    *s_per_token = since(t0) / std::max(1, n - 1);
    return ids;
}

std::vector<float> all_logits(Backend& be, const std::vector<int>& ids) {
    std::vector<float> out(ids.size() * be.config().vocab_size);
    be.reset();
    be.eval(ids.data(), static_cast<int64_t>(ids.size()), out.data(), true);
    return out;
}

// Positions [from, to) of two [positions][V] logits: max |a - b|, max |a|, argmax agreements.
struct Compare {
    double max_diff = 0, max_ref = 0;
    int agree = 0, positions = 0;
};
Compare compare(const std::vector<float>& a, const std::vector<float>& b, int64_t V, size_t from, size_t to) {
    Compare c;
    for (size_t p = from; p < to; ++p) {
        const float* ra = a.data() + p * V;
        const float* rb = b.data() + p * V;
        for (int64_t v = 0; v < V; ++v) {
            c.max_diff = std::max(c.max_diff, static_cast<double>(std::fabs(ra[v] - rb[v])));
            c.max_ref = std::max(c.max_ref, static_cast<double>(std::fabs(ra[v])));
        }
        c.agree += argmax(ra, V) == argmax(rb, V);
        ++c.positions;
    }
    return c;
}

std::string read_text(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(path + ": cannot open");
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

std::string cpu_name() {
    std::ifstream f("/proc/cpuinfo");
    for (std::string line; std::getline(f, line);)
        if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
    return "unknown cpu";
}

nlohmann::json measure(const Options& o) {
    const Tokenizer tok = Tokenizer::load(o.model);
    const Model b = load(o.model, WeightFormat::kBf16), q = load(o.model, o.format);
    const int64_t V = b.ck->config.vocab_size, ctx = 1024;
    std::vector<int> prompt{tok.bos_id()};
    tok.encode_append(o.prompt, prompt);

    double b_tok = 0, q_tok = 0;
    const std::vector<int> run = greedy(*b.backend(o, ctx), prompt, o.n, &b_tok);
    const std::vector<int> q_run = greedy(*q.backend(o, ctx), prompt, o.n, &q_tok);
    size_t same = 0;
    while (prompt.size() + same < run.size() && run[prompt.size() + same] == q_run[prompt.size() + same])
        ++same;
    const std::vector<float> lb = all_logits(*b.backend(o, ctx), run),
                             lq = all_logits(*q.backend(o, ctx), run);
    const Compare over_prompt = compare(lb, lq, V, 0, prompt.size());
    const Compare along = compare(lb, lq, V, prompt.size() - 1, run.size() - 1);

    const std::vector<int> ids = tok.encode(read_text(o.text));
    const PerplexityResult pb = perplexity(*b.backend(o, 512), ids, 512, tok.bos_id());
    const PerplexityResult pq = perplexity(*q.backend(o, 512), ids, 512, tok.bos_id());

    std::time_t t = std::time(nullptr);
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
    const char* commit = std::getenv("MARKBASE_COMMIT");
    const std::string f = weight_format_name(o.format);
    return {{"kind", f + "-quality"},
            {"model", o.model},
            {"device", cpu_name() + " (CPU backend, " + b.backend(o, 16)->name() + ")"},
            {"commit", commit ? commit : "unknown"},
            {"date", date},
            {"weights", weight_format_summary(*q.ck)},
            {"prompt", o.prompt},
            {"prompt_tokens", prompt.size()},
            {"max_abs_logit_diff_prompt", over_prompt.max_diff},
            {"max_abs_logit_prompt_bf16", over_prompt.max_ref},
            {"greedy_tokens", o.n},
            {"top1_agreement", along.agree},
            {"top1_agreement_fraction", static_cast<double>(along.agree) / along.positions},
            {"max_abs_logit_diff_greedy_run", along.max_diff},
            {"max_abs_logit_greedy_run_bf16", along.max_ref},
            {f + "_greedy_tokens_identical_before_first_difference", same},
            {"perplexity_text", o.text},
            {"perplexity_tokens", pb.predicted},
            {"perplexity_windows", pb.windows},
            {"perplexity_bf16", pb.ppl},
            {"perplexity_" + f, pq.ppl},
            {"perplexity_change_pct", 100 * (pq.ppl / pb.ppl - 1)},
            {"load_s_bf16", b.load_s},
            {"load_s_" + f, q.load_s},
            {"decode_ms_per_token_bf16", 1e3 * b_tok},
            {"decode_ms_per_token_" + f, 1e3 * q_tok}};
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string k = argv[i];
        if (i + 1 >= argc) {
            std::fprintf(stderr,
                         "usage: %s [--format fp8|int4] [-m DIR] [-f TEXT] [-p PROMPT] [-n N] [-t THREADS] "
                         "[--json-out F]\n",
                         argv[0]);
            return 2;
        }
        const std::string v = argv[++i];
        if (k == "--format" && (v == "fp8" || v == "int4"))
            o.format = v == "fp8" ? WeightFormat::kFp8 : WeightFormat::kInt4;
        else if (k == "-m")
            o.model = v;
        else if (k == "-f")
            o.text = v;
        else if (k == "-p")
            o.prompt = v;
        else if (k == "-n")
            o.n = std::max(1, std::atoi(v.c_str()));
        else if (k == "-t")
            o.threads = std::atoi(v.c_str());
        else if (k == "--json-out")
            o.json_out = v;
        else {
            std::fprintf(stderr, "error: unknown option %s\n", k.c_str());
            return 2;
        }
    }
    try {
        const nlohmann::json j = measure(o);
        std::printf("%s\n", j.dump(1).c_str());
        if (!o.json_out.empty()) std::ofstream(o.json_out) << j.dump(1) << "\n";
    } catch (const Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
