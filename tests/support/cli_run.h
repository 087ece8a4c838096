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

}  // namespace markbase::testing
