// --check-weights, run as a user would: a NaN in a large tensor (which load does not scan by default) is
// named, with its file, before anything runs.
#include <gtest/gtest.h>

#include <fstream>

#include "loading/random_checkpoint.h"
#include "loading/safetensors.h"
#include "support/cli_run.h"
#include "support/tiny_models.h"

namespace markbase {
namespace {

TEST(CliWeights, CheckWeightsNamesANonFiniteLargeTensor) {
    testing::TempDir dir("cliweights");
    nlohmann::json c = testing::tiny_config("31b");
    c["vocab_size"] = 2048;  // embed_tokens: 131072 values, above the small-tensor scan
    write_random_checkpoint(dir.path(), c, 1);
    const auto file = dir.path() / "model.safetensors";
    uint64_t offset = 0;
    {
        const SafetensorsSet set = SafetensorsSet::open(file);
        offset = set.get("model.embed_tokens.weight").file_offset + 2 * 100000;
    }
    const uint16_t nan_bf16 = 0x7FC0;
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(offset));
    f.write(reinterpret_cast<const char*>(&nan_bf16), 2);
    f.close();

    const std::string model = "-m '" + dir.path().string() + "' --device cpu --ids 2,3 -n 1 --temp 0 --json";
    const auto checked = testing::run_cli("run --check-weights " + model);
    EXPECT_EQ(checked.code, 1) << checked.all();
    EXPECT_EQ(checked.out, "");
    EXPECT_NE(checked.err.find(file.string()), std::string::npos) << checked.err;
    EXPECT_NE(checked.err.find("model.embed_tokens.weight: 1 of 131072 values not finite"), std::string::npos)
        << checked.err;
    // without the flag the load does not read the large tensors
    const auto unchecked = testing::run_cli("run " + model);
    EXPECT_EQ(unchecked.err.find("values not finite"), std::string::npos) << unchecked.all();
}

}  // namespace
}  // namespace markbase
