// Command-line arguments: the input split at NUL bytes into argv, read as the subcommands read theirs.
#include <cstdint>
#include <string>
#include <vector>

#include "cli/commands/args.h"
#include "fuzz/fuzz_input.h"
#include "model/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view text = markbase::fuzz::as_text(data, size);
    std::vector<std::string> args;
    size_t start = 0;
    for (size_t i = 0; i <= text.size(); ++i) {
        if (i < text.size() && text[i] != '\0') continue;
        args.emplace_back(text.substr(start, i - start));
        start = i + 1;
    }
    try {
        markbase::cli::ArgReader a("run", args);
        (void)a.value({"-m", "--model"});
        (void)a.integer<int>({"-n", "--n-predict"}, 128, -1, 2147483647);
        (void)a.integer<int64_t>({"-c", "--ctx-size"}, 4096, 1, 2147483647);
        (void)a.integer<int64_t>({"-s", "--seed"}, -1, -1, INT64_MAX);
        (void)a.number({"--temp", "--temperature"}, 1.0);
        (void)a.number({"--top-p"}, 0.95);
        (void)a.flag({"--json"});
        (void)a.value_or({"-p", "--prompt"}, "");
        if (auto ids = a.value({"--ids"})) (void)markbase::cli::parse_id_list(*ids, "--ids");
        a.finish();
    } catch (const markbase::Error&) {
    } catch (const markbase::cli::HelpRequested& h) {  // -h/--help among the arguments: the usage text
        if (h.text.empty()) __builtin_trap();
    }
    return 0;
}
