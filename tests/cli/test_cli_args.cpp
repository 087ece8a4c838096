// Numbers on the command line: every integer flag is range-checked against the setting it feeds (no value
// wraps into an int, none saturates), every number must be finite, and the error names the flag as given.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli/commands/args.h"
#include "loading/random_checkpoint.h"
#include "model/error.h"
#include "support/cli_run.h"
#include "support/tiny_models.h"

namespace markbase {
namespace {

using cli::ArgReader;

// The message ArgReader throws for `args`, or "" when it returned.
template <class F>
std::string error_of(const std::vector<std::string>& args, F read) {
    ArgReader a("cmd", args);
    try {
        read(a);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(CliArgReader, IntegerChecksTheRangeAndNamesTheFlagAsGiven) {
    auto n = [](ArgReader& a) { return a.integer({"-n", "--n-predict"}, 128, -1, cli::kIntMax); };
    EXPECT_EQ(error_of({"-n", "4294967296"}, n), "cmd: -n must be in [-1, 2147483647], got 4294967296");
    EXPECT_EQ(error_of({"--n-predict=-2"}, n), "cmd: --n-predict must be in [-1, 2147483647], got -2");
    EXPECT_EQ(error_of({"-n", "99999999999999999999"}, n),
              "cmd: -n must be in [-1, 2147483647], got 99999999999999999999");
    EXPECT_EQ(error_of({"-n", "-99999999999999999999"}, n),
              "cmd: -n must be in [-1, 2147483647], got -99999999999999999999");
    for (const char* bad : {"", "5 ", " 5", "0x10", "1e3", "5k", "+", "-", "+-5", "1.0"})
        EXPECT_EQ(error_of({"-n", bad}, n), std::string("cmd: -n expects an integer, got '") + bad + "'");

    ArgReader a("cmd", {"-n", "2147483647", "-s", "-9223372036854775808", "-k", "+7"});
    EXPECT_EQ(a.integer({"-n"}, 0, -1, cli::kIntMax), 2147483647);
    EXPECT_EQ(a.integer<int64_t>({"-s"}, 0, INT64_MIN, INT64_MAX), INT64_MIN);
    EXPECT_EQ(a.integer({"-k"}, 0, 0, 10), 7);
    EXPECT_EQ(a.integer({"--absent"}, 42, 0, 10), 42);  // the default is the caller's own
    a.finish();
}

TEST(CliArgReader, NumberMustBeFinite) {
    auto t = [](ArgReader& a) { return a.number({"--temp", "--temperature"}, 1.0); };
    for (const char* bad : {"nan", "NaN", "inf", "-inf", "infinity", "1e999", "-1e999"})
        EXPECT_EQ(error_of({"--temp", bad}, t),
                  std::string("cmd: --temp must be a finite number, got ") + bad);
    for (const char* bad : {"", "0.5x", " 0.5", "0.5 ", "0x1p3", "--1"})
        EXPECT_EQ(error_of({"--temperature", bad}, t),
                  std::string("cmd: --temperature expects a number, got '") + bad + "'");
    ArgReader a("cmd", {"--temp", "1e-3", "--top-p", "-.5", "--min-p", "1e-400"});
    EXPECT_DOUBLE_EQ(a.number({"--temp"}, 0), 1e-3);
    EXPECT_DOUBLE_EQ(a.number({"--top-p"}, 0), -0.5);
    EXPECT_GE(a.number({"--min-p"}, 1), 0.0);  // an underflow is a tiny number, not an error
}

class CliArgs : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir = new testing::TempDir("cliargs");
        write_random_checkpoint(dir->path(), testing::tiny_config("e2b"), 3);
    }
    static void TearDownTestSuite() { delete dir; }
    static std::string model() { return " -m '" + dir->path().string() + "' "; }
    static testing::TempDir* dir;
};
testing::TempDir* CliArgs::dir = nullptr;

// Each value used to wrap (4294967296 -> 0, 4294967297 -> 1), saturate or run unbounded; now each command
// refuses it before loading anything, naming the flag and its range.
TEST_F(CliArgs, OutOfRangeIntegersAreRefusedNamingTheFlag) {
    struct Case {
        std::string args, expect;
    };
    const std::string run = "run" + model() + "--device cpu --ids 2,3 ";
    for (const Case& c : std::vector<Case>{
             {run + "-n 4294967296", "run: -n must be in [-1, 2147483647], got 4294967296"},
             {run + "-n -2", "run: -n must be in [-1, 2147483647], got -2"},
             {run + "--n-predict=4294967296", "run: --n-predict must be in [-1, 2147483647], got 4294967296"},
             {run + "--top-k 4294967297", "run: --top-k must be in [0, 2147483647], got 4294967297"},
             {run + "-t 4294967297", "run: -t must be in [0, 4096], got 4294967297"},
             {run + "-b 4294967297", "run: -b must be in [1, 8192], got 4294967297"},
             {run + "-c 99999999999999999999",
              "run: -c must be in [1, 2147483647], got 99999999999999999999"},
             {run + "--repeat-last-n 4294967296", "run: --repeat-last-n must be in [-1, 2147483647]"},
             {run + "-tp 4294967297", "run: -tp must be in [1, 1024], got 4294967297"},
             {run + "-s 99999999999999999999", "run: -s must be in [-1, 9223372036854775807]"},
             {"chat --device cpu -n 4294967296",  // the bundled model: chat needs a tokenizer
              "chat: -n must be in [-1, 2147483647], got 4294967296"},
             {"perplexity" + model() + "-f /nonexistent --window 4294967298",
              "perplexity: --window must be in [2, 2147483647], got 4294967298"},
             {"bench" + model() + "--device cpu -r 4294967297",
              "bench: -r must be in [1, 2147483647], got 4294967297"},
             {"inspect" + model() + "-tp 4294967297", "inspect: -tp must be in [1, 1024], got 4294967297"},
             {"bench load" + model() + "--no-cold -t 4294967297",
              "bench load: -t must be in [1, 4096], got 4294967297"},
         }) {
        const testing::CliResult r = testing::run_cli(c.args);
        EXPECT_EQ(r.code, 2) << c.args << "\n" << r.all();
        EXPECT_NE(r.err.find("error: " + c.expect), std::string::npos) << c.args << "\n" << r.all();
    }
}

TEST_F(CliArgs, NonFiniteNumbersAreRefusedNamingTheFlag) {
    const std::string run = "run" + model() + "--device cpu --ids 2,3 ";
    for (const auto& [args, expect] : std::vector<std::pair<std::string, std::string>>{
             {"--temp 1e999", "run: --temp must be a finite number, got 1e999"},
             {"--temp nan", "run: --temp must be a finite number, got nan"},
             {"--presence-penalty -inf", "run: --presence-penalty must be a finite number, got -inf"},
             {"--top-p 0.5x", "run: --top-p expects a number, got '0.5x'"},
         }) {
        const testing::CliResult r = testing::run_cli(run + args);
        EXPECT_EQ(r.code, 2) << args << "\n" << r.all();
        EXPECT_NE(r.err.find("error: " + expect), std::string::npos) << args << "\n" << r.all();
    }
}

// The README's exit codes: 0 success (--help too), 2 a command line the command cannot take, 1 an error while
// running.
TEST_F(CliArgs, ExitCodesSeparateUsageFromFailure) {
    EXPECT_EQ(testing::run_cli("run --help").code, 0);
    EXPECT_EQ(testing::run_cli("run --device cpu --bogus 1").code, 2);
    EXPECT_EQ(testing::run_cli("run --device cpu -n x").code, 2);
    EXPECT_EQ(testing::run_cli("frobnicate").code, 2);
    const testing::CliResult r = testing::run_cli("run -m /nonexistent --device cpu --ids 2");
    EXPECT_EQ(r.code, 1) << r.all();
    EXPECT_NE(r.err.find("/nonexistent"), std::string::npos) << r.all();
}

}  // namespace
}  // namespace markbase
