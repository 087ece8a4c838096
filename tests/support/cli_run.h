// Runs the markbase binary as a user would, through a shell: exit code, stdout and stderr apart.
#pragma once

#include <string>

namespace markbase::testing {

struct CliResult {
    int code = -1;    // exit status; -1 when the process did not exit normally (a crash)
    std::string out;  // stdout
    std::string err;  // stderr
    std::string all() const { return out + err; }
};

// `markbase ARGS` with stdin from `input` (nothing when empty).
CliResult run_cli(const std::string& args, const std::string& input = "");

// How the shell around the binary differs from run_cli's.
struct CliShell {
    std::string before;     // shell commands run first, in the same shell: "ulimit -f 1;"
    std::string stdout_to;  // a path stdout goes to instead of `out`, which stays empty: "/dev/full"
};
CliResult run_cli(const std::string& args, const std::string& input, const CliShell& shell);

}  // namespace markbase::testing
