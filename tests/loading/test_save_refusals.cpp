// What --save's writer (loading/save_quantized.h) refuses, before writing anything: a bf16 model (nothing
// quantised), an existing file, a folder that is not empty, the source folder. A save that fails part way
// leaves nothing behind; an empty folder is saved into.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "loading/save_quantized.h"
#include "support/error_text.h"
#include "support/tiny_models.h"

namespace markbase {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::expect_has;

const fs::path kModel = fs::path(MARKBASE_TEST_DATA) / ".." / ".." / "models" / "default";

size_t entries(const fs::path& dir) {
    size_t n = 0;
    for ([[maybe_unused]] const fs::directory_entry& e : fs::directory_iterator(dir)) ++n;
    return n;
}

TEST(SaveRefusals, ABf16ModelHasNothingToSave) {
    testing::TempDir dir("save_bf16");
    const auto ck = load_checkpoint(kModel);
    const std::string msg = error_of([&] { save_quantized(*ck, dir.path() / "out"); });
    expect_has(msg, {"nothing to save: the model in " + kModel.string() + " is bf16",
                     "add --quantize fp8 or --quantize int4"});
    EXPECT_EQ(entries(dir.path()), 0u);
}

TEST(SaveRefusals, AnExistingFileAFolderThatIsNotEmptyAndTheSourceAreRefused) {
    testing::TempDir dir("save_target");
    const auto ck = load_checkpoint(kModel, LoadOptions{.quantize = WeightFormat::kFp8});
    std::ofstream(dir.path() / "file") << "x";
    fs::create_directories(dir.path() / "full");
    std::ofstream(dir.path() / "full" / "notes.txt") << "mine";

    expect_has(error_of([&] { save_quantized(*ck, dir.path() / "file"); }),
               {"cannot save to " + (dir.path() / "file").string() + ": it is a file, not a folder",
                "saving needs a new or empty folder"});
    expect_has(error_of([&] { save_quantized(*ck, dir.path() / "full"); }),
               {"cannot save to " + (dir.path() / "full").string() + ": the folder is not empty",
                "nothing is overwritten"});
    EXPECT_EQ(entries(dir.path() / "full"), 1u);
    const std::string same = (kModel / "." / "").string();  // spelled otherwise, still the source
    expect_has(error_of([&] { save_quantized(*ck, same); }),
               {"cannot save to " + same + ": it is the folder the model was loaded from"});
    EXPECT_EQ(entries(dir.path()), 2u) << "nothing written beside the targets";
}

TEST(SaveRefusals, AnEmptyFolderIsSavedIntoAndMissingParentsAreMade) {
    testing::TempDir dir("save_empty");
    const auto ck = load_checkpoint(kModel, LoadOptions{.quantize = WeightFormat::kInt4});
    fs::create_directories(dir.path() / "empty");
    save_quantized(*ck, dir.path() / "empty");
    EXPECT_TRUE(fs::exists(dir.path() / "empty" / "model.safetensors"));
    const SaveResult r = save_quantized(*ck, dir.path() / "a" / "b" / "");
    EXPECT_EQ(r.dir, dir.path() / "a" / "b");
    EXPECT_EQ(load_checkpoint(r.dir)->format, WeightFormat::kInt4);
}

TEST(SaveRefusals, ASaveThatFailsPartWayLeavesNothing) {
    // the source's config.json gone after the load: the tensors are written, then the config cannot be
    testing::TempDir dir("save_fails");
    fs::create_directories(dir.path() / "src");
    for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"})
        fs::copy_file(kModel / f, dir.path() / "src" / f);
    const auto ck = load_checkpoint(dir.path() / "src", LoadOptions{.quantize = WeightFormat::kFp8});
    fs::remove(dir.path() / "src" / "config.json");
    expect_has(error_of([&] { save_quantized(*ck, dir.path() / "out"); }),
               {(dir.path() / "src" / "config.json").string(), "does not exist"});
    EXPECT_EQ(entries(dir.path()), 1u) << "neither out nor its partial folder";
}

}  // namespace
}  // namespace markbase
