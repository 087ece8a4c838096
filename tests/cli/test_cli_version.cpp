// `markbase --version` and `markbase version`: the same report, every field present, the version being
// CMake's project() version (the generated header this test also reads).
#include <gtest/gtest.h>

#include <string>

#include "markbase_build_info.h"
#include "support/cli_run.h"

namespace markbase {
namespace {

// The value of the "name: value" line, or "(missing)".
std::string field(const std::string& out, const std::string& name) {
    const std::string key = "\n" + name + ": ";
    const size_t at = out.find(key);
    if (at == std::string::npos) return "(missing)";
    const size_t start = at + key.size();
    return out.substr(start, out.find('\n', start) - start);
}

TEST(CliVersion, ReportsEveryField) {
    const testing::CliResult r = testing::run_cli("--version");
    ASSERT_EQ(r.code, 0) << r.all();
    EXPECT_EQ(r.out.rfind(std::string("markbase ") + MARKBASE_VERSION + "\n", 0), 0u) << r.out;
    EXPECT_EQ(field(r.out, "commit"), MARKBASE_GIT_COMMIT);
    EXPECT_NE(field(r.out, "commit"), "");
    EXPECT_EQ(field(r.out, "build type"), MARKBASE_BUILD_TYPE);
    EXPECT_NE(field(r.out, "compiler"), "(missing)");
#ifdef MARKBASE_HAS_CUDA
    EXPECT_EQ(field(r.out, "cuda").rfind("yes (toolkit ", 0), 0u) << r.out;
    EXPECT_NE(field(r.out, "cuda").find(std::string("architectures ") + MARKBASE_CUDA_ARCHITECTURES),
              std::string::npos);
    EXPECT_NE(field(r.out, "cublas"), "(missing)");
    EXPECT_NE(field(r.out, "nccl"), "(missing)");
#else
    EXPECT_EQ(field(r.out, "cuda").rfind("no", 0), 0u) << r.out;
#endif
    EXPECT_NE(field(r.out, "cpu build"), "(missing)");
    // the chosen path first, then the compiled ones and those this CPU runs
    const std::string matmul = field(r.out, "cpu matmul");
    EXPECT_NE(matmul.find(std::string("compiled: ") + MARKBASE_MATMUL_PATHS_COMPILED), std::string::npos)
        << matmul;
    EXPECT_NE(matmul.find("this CPU runs: scalar"), std::string::npos) << matmul;
#ifdef MARKBASE_HAS_HTTP
    EXPECT_EQ(
        field(r.out, "http server").rfind(std::string("yes (cpp-httplib ") + MARKBASE_HTTPLIB_VERSION, 0),
        0u);
#else
    EXPECT_EQ(field(r.out, "http server").rfind("no", 0), 0u) << r.out;
#endif
    EXPECT_NE(field(r.out, "default model"), "(missing)");
    EXPECT_EQ(r.err, "");
}

TEST(CliVersion, CommandAndFlagAgree) {
    const testing::CliResult flag = testing::run_cli("--version"), command = testing::run_cli("version");
    ASSERT_EQ(command.code, 0) << command.all();
    EXPECT_EQ(command.out, flag.out);
}

TEST(CliVersion, RefusesArguments) {
    const testing::CliResult r = testing::run_cli("version --bogus");
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("--bogus"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace markbase
