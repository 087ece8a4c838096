// markbase: the command-line entry point. Dispatches to src/cli/commands/; every user-facing error is a
// markbase::Error printed as one line, never a crash or a stack trace.
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "cli/commands/args.h"
#include "cli/commands/commands.h"
#include "cli/commands/output.h"
#include "model/error.h"

namespace {

const char* kUsage =
    "markbase: Gemma 4 inference\n"
    "usage: markbase COMMAND [options]\n"
    "  run        -m DIR (-p TEXT | --ids 2,17,300) [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P]\n"
    "             [--repeat-penalty R] [--presence-penalty P] [--frequency-penalty F] [-s SEED] [--json]\n"
    "  chat       -m DIR                       interactive multi-turn chat (Ctrl-D ends)\n"
    "  logits     -m DIR --ids 2,17,300 -o out.npy\n"
    "  inspect    -m DIR | --synthetic VARIANT [--layers N]\n"
    "                                          variant, layer plan, parameters, bytes per token\n"
    "  bench      -m DIR [-p 128] [-n 32] [-r 3]  prefill and decode receipt with achieved GB/s\n"
    "  bench      --device cuda (-m DIR | --synthetic VARIANT) [--profile] [--timeline] [--json-out F]\n"
    "                                          --profile: events around each launch of one step;\n"
    "                                          --timeline: the graph step's kernels under CUPTI (calls,\n"
    "                                          marginal ms, busy ms, GB/s per launch name; with -np N the\n"
    "                                          batched step's too; needs libcupti)\n"
    "  bench load -m DIR [--device cpu|cuda] [-t N] [--chunk-mib 64] [--direct] [--no-cold]\n"
    "                                          load speed (cold, warm) vs the raw read speed\n"
    "  perplexity -m DIR -f FILE [--window 512]  perplexity of a text file\n"
    "  serve      -m DIR [--host 127.0.0.1] [--port 8080] [-np N] [--max-queue N] [--api-key KEY]\n"
    "                                          OpenAI-compatible server: /v1/chat/completions,\n"
    "                                          /v1/completions, /v1/models, /health, /metrics\n"
    "                                          (-c: context per sequence; key also $MARKBASE_API_KEY;\n"
    "                                          --gpu-memory-utilization 0.9: the GPU's paged KV pool)\n"
    "  tokenize   --tokenizer PATH [--file F]  text (stdin) -> JSON array of ids\n"
    "  detokenize --tokenizer PATH             JSON array of ids (stdin) -> text\n"
    "  version    (also --version)             version, commit, build type, CUDA, CPU paths, HTTP server\n"
    "common: -t/--threads N  -c/--ctx-size N  -b/--batch-size N  --device cpu|cuda\n"
    "        -tp/--tensor-parallel-size N (cuda: one model over N GPUs)\n"
    "        --check-weights (scan every weight for NaN/Inf while loading)\n"
    "        --quantize fp8|int4|none (a bf16 checkpoint's projections at load: fp8 e4m3 with a scale per\n"
    "        row, or int4 with a scale per 128 weights; the CPU computes with their values in bf16.\n"
    "        compressed-tensors FP8 and int4 pack-quantized checkpoints load as published)\n"
    "        --bf16-copy auto|keep|drop (cuda, a quantised model: its projections' bf16 copy, which prompts\n"
    "        and batched steps read; drop: they dequantise each product's weights instead, for the memory\n"
    "        of the quantised rows alone; auto: kept where the model then fits the GPU, else dropped)\n"
    "        --save DIR (the quantised model, --quantize's or a published one, written to a new folder as\n"
    "        a compressed-tensors checkpoint that vLLM reads and -m DIR loads; then the command goes on)\n"
    "        --kv-cache-dtype auto|bf16|f32|fp8 (the KV cache; auto: bf16, half fp32's bytes, where\n"
    "        sequences decode together on the GPU; f32 for one sequence and on the CPU. fp8: e4m3 with no\n"
    "        scale, a quarter of fp32's bytes; the CPU rounds its fp32 cache to bf16 or fp8 alike)\n"
    "VARIANT (random weights at real widths): e2b, e4b, 12b, 26b-a4b, 26b-standard, 31b\n"
    "without -m, the bundled model (models/default) or $MARKBASE_MODEL is used\n"
    "markbase COMMAND --help: that command's flags and their defaults\n";

using markbase::cli::Args;

struct Command {
    const char* name;
    int (*run)(const Args&);
    // reads its flags through ArgReader, which answers --help with the flags it read; the others get kUsage
    bool own_help = true;
};

const Command kCommands[] = {
    {"run", markbase::cli::cmd_run},
    {"chat", markbase::cli::cmd_chat},
    {"logits", markbase::cli::cmd_logits},
    {"inspect", markbase::cli::cmd_inspect},
    {"bench", markbase::cli::cmd_bench},
    {"perplexity", markbase::cli::cmd_perplexity},
    {"tokenize", markbase::cli::cmd_tokenize, false},
    {"detokenize", markbase::cli::cmd_detokenize, false},
    {"serve", markbase::cli::cmd_serve},
    {"version", markbase::cli::cmd_version},
};

const Command* find_command(const std::string& name) {
    for (const Command& c : kCommands)
        if (name == c.name) return &c;
    return nullptr;
}

// The command's exit code; a markbase::Error (or any exception) escaping it is printed as one "error:" line.
int dispatch(const Command& cmd, const Args& args) {
    try {
        return cmd.run(args);
    } catch (const markbase::cli::HelpRequested& h) {
        std::fputs(h.text.c_str(), stdout);
        return 0;
    } catch (const markbase::cli::UsageError& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    } catch (const markbase::Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
    } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "error: out of memory\n");
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: internal: %s\n", e.what());
    }
    return 1;
}

// A run that succeeded is exit 0 only when its output reached stdout.
int with_output_checked(int code) {
    if (code != 0) return code;
    try {
        markbase::cli::flush_stdout();
    } catch (const markbase::Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    using markbase::cli::install_checked_stdout;
    // A file-size limit (ulimit -f) makes a write fail with EFBIG, reported, instead of killing the process
    // part way through a file.
    std::signal(SIGXFSZ, SIG_IGN);
    install_checked_stdout();
    if (argc < 2 || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help") ||
        !std::strcmp(argv[1], "help")) {
        std::fputs(kUsage, argc < 2 ? stderr : stdout);
        return with_output_checked(argc < 2 ? 2 : 0);
    }
    // --version is the conventional spelling; it takes no arguments of its own, as `version` does
    const Command* cmd = find_command(std::strcmp(argv[1], "--version") ? argv[1] : "version");
    if (cmd == nullptr) {  // also with --help: a misspelt command is never a success
        std::fprintf(stderr, "markbase: unknown command '%s'\n%s", argv[1], kUsage);
        return 2;
    }
    Args args(argv + 2, argv + argc);
    for (const auto& s : args)
        if (!cmd->own_help && (s == "-h" || s == "--help")) {
            std::fputs(kUsage, stdout);
            return with_output_checked(0);
        }
    return with_output_checked(dispatch(*cmd, args));
}
