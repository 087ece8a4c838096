// Where `markbase` finds its bundled model without -m: beside an installed binary (bin/markbase and
// share/markbase/models/default, as `cmake --install` and the Debian package lay them out) before the source
// tree it was built from; `inspect` with no -m reports the folder it used.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "loading/random_checkpoint.h"
#include "support/cli_run.h"
#include "support/tiny_models.h"

namespace markbase {
namespace {

namespace fs = std::filesystem;

// The "model" line of `inspect` run from `binary`: the folder it loaded.
std::string inspected_model(const fs::path& binary, const fs::path& scratch) {
    const fs::path out = scratch / "inspect.out";
    const std::string cmd =
        "env -u MARKBASE_MODEL '" + binary.string() + "' inspect >'" + out.string() + "' 2>&1";
    const int status = std::system(cmd.c_str());
    std::ifstream f(out);
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_EQ(status, 0) << text;
    const std::string key = "model        ";
    const size_t at = text.find(key);
    if (at == std::string::npos) return "(no model line) " + text;
    const size_t start = at + key.size();
    return text.substr(start, text.find('\n', start) - start);
}

TEST(CliInstall, InstalledModelComesBeforeTheSourceTree) {
    testing::TempDir prefix("install");
    fs::create_directories(prefix.path() / "bin");
    const fs::path binary = prefix.path() / "bin" / "markbase";
    // a copy, not a link: /proc/self/exe names the file a link points to
    fs::copy_file(MARKBASE_BINARY, binary);
    const fs::path model = prefix.path() / "share" / "markbase" / "models" / "default";
    fs::create_directories(model);
    write_random_checkpoint(model, testing::tiny_config("e2b"), 5);
    EXPECT_EQ(inspected_model(binary, prefix.path()), model.string());
}

TEST(CliInstall, BuildTreeBinaryUsesTheSourceTreeModel) {
    testing::TempDir scratch("install-src");
    const std::string dir = inspected_model(MARKBASE_BINARY, scratch.path());
    EXPECT_EQ(dir, (fs::path(MARKBASE_SOURCE_DIR) / "models" / "default").string());
}

}  // namespace
}  // namespace markbase
