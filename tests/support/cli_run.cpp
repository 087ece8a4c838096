#include "support/cli_run.h"

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace markbase::testing {

namespace {

std::string temp_file(const char* ext) {
    static std::atomic<int> counter{0};
    return (std::filesystem::temp_directory_path() /
            ("markbase-cli-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + ext))
        .string();
}

std::string slurp(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

}  // namespace

CliResult run_cli(const std::string& args, const std::string& input) {
    return run_cli(args, input, CliShell{});
}

CliResult run_cli(const std::string& args, const std::string& input, const CliShell& shell) {
    const std::string err_file = temp_file(".err"), in_file = temp_file(".in");
    std::ofstream(in_file, std::ios::binary) << input;
    std::string cmd =
        shell.before + " " + std::string(MARKBASE_BINARY) + " " + args + " <" + in_file + " 2>" + err_file;
    if (!shell.stdout_to.empty()) cmd += " >'" + shell.stdout_to + "'";
    CliResult r;
    FILE* p = popen(cmd.c_str(), "r");
    if (p) {
        std::array<char, 4096> buf;
        size_t n;
        while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
        const int status = pclose(p);
        r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    r.err = slurp(err_file);
    std::filesystem::remove(err_file);
    std::filesystem::remove(in_file);
    return r;
}

}  // namespace markbase::testing
