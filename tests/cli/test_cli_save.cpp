// --save DIR from the command line: `run --quantize fp8|int4 --save DIR` says where it saved, in which
// format and how many bytes, then generates; `run -m DIR` generates the same ids. A bf16 model, a folder that
// is not empty and an empty folder name are refused before anything loads or is written.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "support/cli_run.h"
#include "support/tiny_models.h"

namespace markbase {
namespace {

namespace fs = std::filesystem;

const fs::path kModel = fs::path(MARKBASE_TEST_DATA) / ".." / ".." / "models" / "default";
const std::string kGen = " --device cpu -t 2 --ids 2,651,1567,1176 -n 12 --temp 0 --ignore-eos --json";

bool has(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

TEST(CliSave, QuantizeAndSaveThenRunTheSavedFolder) {
    testing::TempDir dir("cli_save");
    for (const std::string f : {"fp8", "int4"}) {
        const fs::path out = dir.path() / f;
        const auto saving = testing::run_cli("run -m '" + kModel.string() + "' --quantize " + f +
                                             " --save '" + out.string() + "'" + kGen);
        ASSERT_EQ(saving.code, 0) << saving.all();
        const std::string line = f == "fp8"
                                     ? "saved an FP8 compressed-tensors checkpoint (float-quantized, a "
                                       "scale per row) to "
                                     : "saved an int4 compressed-tensors checkpoint (pack-quantized, "
                                       "symmetric, group 128) to ";
        EXPECT_TRUE(has(saving.err, line + out.string() + ": 1 shard, ")) << saving.err;
        EXPECT_TRUE(has(saving.err, " bytes\n")) << saving.err;
        EXPECT_TRUE(has(saving.out, "\"ids\"")) << "the command goes on: " << saving.out;

        const auto saved = testing::run_cli("run -m '" + out.string() + "'" + kGen);
        ASSERT_EQ(saved.code, 0) << saved.all();
        EXPECT_EQ(saved.out, saving.out) << f;
        EXPECT_FALSE(has(saved.err, "note:")) << saved.err;

        // a second save of the published copy, through another command
        const auto again = testing::run_cli("logits -m '" + out.string() + "' --device cpu --ids 2,651 -o '" +
                                            (dir.path() / (f + ".npy")).string() + "' --save '" +
                                            (dir.path() / (f + "-again")).string() + "'");
        ASSERT_EQ(again.code, 0) << again.all();
        EXPECT_TRUE(has(again.err, line + (dir.path() / (f + "-again")).string())) << again.err;
    }
}

TEST(CliSave, RefusalsComeBeforeTheLoad) {
    testing::TempDir dir("cli_save_refused");
    const auto bf16 = testing::run_cli("run -m '" + kModel.string() + "' --save '" +
                                       (dir.path() / "out").string() + "'" + kGen);
    EXPECT_EQ(bf16.code, 1) << bf16.all();
    EXPECT_TRUE(has(bf16.err, "error: nothing to save: the model in " + kModel.string() + " is bf16"))
        << bf16.err;
    EXPECT_FALSE(fs::exists(dir.path() / "out"));

    std::ofstream(dir.path() / "keep.txt") << "mine";
    const auto full = testing::run_cli("run -m '" + kModel.string() + "' --quantize int4 --save '" +
                                       dir.path().string() + "'" + kGen);
    EXPECT_EQ(full.code, 1) << full.all();
    EXPECT_TRUE(has(full.err, "error: cannot save to " + dir.path().string() + ": the folder is not empty"))
        << full.err;
    EXPECT_FALSE(has(full.err, "load ")) << "refused before loading: " << full.err;

    const auto empty = testing::run_cli("run -m '" + kModel.string() + "' --quantize int4 --save ''" + kGen);
    EXPECT_EQ(empty.code, 2) << empty.all();
    EXPECT_TRUE(has(empty.err, "--save: expected a folder to write")) << empty.err;

    const auto help = testing::run_cli("run --help");
    EXPECT_TRUE(has(help.out, "--save")) << help.out;
    const auto usage = testing::run_cli("--help");
    EXPECT_TRUE(has(usage.out + usage.err, "--save DIR")) << usage.all();
}

}  // namespace
}  // namespace markbase
