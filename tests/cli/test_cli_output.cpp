// Output that is lost is reported: every command whose standard output cannot take what it writes (here
// /dev/full, where each write fails with ENOSPC) exits non-zero with "error: writing standard output: ...",
// never 0 with the text gone.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/cli_run.h"
#include "support/tiny_models.h"

namespace markbase {
namespace {

namespace fs = std::filesystem;

const std::string kBundled = (fs::path(MARKBASE_TEST_DATA) / ".." / ".." / "models" / "default").string();

TEST(CliOutput, AFullStdoutIsAnErrorForEveryCommand) {
    ASSERT_TRUE(fs::exists("/dev/full"));
    testing::TempDir dir("clioutput");
    const std::string text = (dir.path() / "text.txt").string();
    std::ofstream(text) << "In the beginning God created the heaven and the earth.\n";
    const std::string m = " -m '" + kBundled + "' --device cpu ";
    struct Case {
        std::string args, input;
    };
    for (const Case& c : std::vector<Case>{
             {"run" + m + "--ids 2,677,540 -n 3 --temp 0 --ignore-eos", ""},
             {"run" + m + "--ids 2,677,540 -n 3 --temp 0 --json", ""},
             {"run" + m + "-p 'And God said' -n 3 --temp 0 --ignore-eos", ""},
             {"chat" + m + "-n 3 --temp 0", "Hello\n"},
             {"inspect -m '" + kBundled + "'", ""},
             {"perplexity" + m + "-f '" + text + "' --window 8", ""},
             {"tokenize --tokenizer '" + kBundled + "'", "And God said"},
             {"detokenize --tokenizer '" + kBundled + "'", "[2, 677, 540]"},
             {"tokenize --help", ""},
             {"--help", ""},
             {"run --help", ""},
         }) {
        const testing::CliResult r = testing::run_cli(c.args, c.input, {"", "/dev/full"});
        EXPECT_EQ(r.code, 1) << c.args << "\n" << r.err;
        EXPECT_NE(r.err.find("error: writing standard output: No space left on device"), std::string::npos)
            << c.args << "\n"
            << r.err;
    }
}

TEST(CliOutput, AStreamingRunStopsAtTheFirstLostWrite) {
    // 2000 tokens would take seconds; the run ends at its first flush instead, with no receipt of a finished
    // run
    const testing::CliResult r =
        testing::run_cli("run -m '" + kBundled + "' --device cpu --ids 2,677 -n 2000 -c 2048 --ignore-eos",
                         "", {"", "/dev/full"});
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find("error: writing standard output: No space left on device"), std::string::npos)
        << r.err;
    EXPECT_EQ(r.err.find("decode"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace markbase
