// Quantised weights from the command line: `--quantize fp8` and `--quantize int4` on the bundled model
// generate what the published checkpoint of the same quantisation generates, `inspect` says the format and
// its bytes per token, a second quantisation is a note, and an unknown format is a usage error (exit 2).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "support/cli_run.h"
#include "support/quant_checkpoints.h"
#include "support/tiny_models.h"

namespace markbase {
namespace {

namespace fs = std::filesystem;

const fs::path kModel = fs::path(MARKBASE_TEST_DATA) / ".." / ".." / "models" / "default";

TEST(CliQuantize, QuantizeFp8RunsAsThePublishedFp8CheckpointDoes) {
    testing::TempDir dir("cli_fp8");
    testing::Fp8Layout layout;
    layout.quantized = [](const std::string& n) { return n.find("per_layer") == std::string::npos; };
    layout.ignore = {"re:.*per_layer.*"};
    testing::write_fp8_copy(kModel, dir.path() / "fp8", dir.path() / "ref", layout);
    for (const char* f : {"tokenizer.json", "generation_config.json"})
        fs::copy_file(kModel / f, dir.path() / "fp8" / f);
    const std::string gen = " --device cpu -t 2 --ids 2,651,1567,1176 -n 12 --temp 0 --ignore-eos --json";

    const auto quantized = testing::run_cli("run -m '" + kModel.string() + "' --quantize fp8" + gen);
    const auto published = testing::run_cli("run -m '" + (dir.path() / "fp8").string() + "'" + gen);
    ASSERT_EQ(quantized.code, 0) << quantized.all();
    ASSERT_EQ(published.code, 0) << published.all();
    EXPECT_EQ(quantized.out, published.out);
    EXPECT_NE(quantized.out.find("\"ids\""), std::string::npos) << quantized.out;

    const auto again =
        testing::run_cli("run -m '" + (dir.path() / "fp8").string() + "' --quantize fp8" + gen);
    EXPECT_EQ(again.out, published.out);
    EXPECT_NE(again.err.find("note: --quantize fp8: "), std::string::npos) << again.err;
    EXPECT_NE(again.err.find("is an FP8 checkpoint already"), std::string::npos) << again.err;

    const auto inspect = testing::run_cli("inspect -m '" + (dir.path() / "fp8").string() + "'");
    ASSERT_EQ(inspect.code, 0) << inspect.all();
    EXPECT_NE(inspect.out.find("weights      FP8 e4m3 with per-row scales: "), std::string::npos)
        << inspect.out;
    const auto plain = testing::run_cli("inspect -m '" + kModel.string() + "'");
    EXPECT_NE(plain.out.find("weights      bf16\n"), std::string::npos) << plain.out;
#ifdef MARKBASE_HAS_CUDA
    // the GPU's weights with and without the projections' bf16 copy (--bf16-copy): without it, less than
    // the bf16 checkpoint's bytes; with it, more
    const size_t at = inspect.out.find("gpu weights  ");
    ASSERT_NE(at, std::string::npos) << inspect.out;
    double keep = 0, drop = 0, bound = 0;
    ASSERT_EQ(std::sscanf(inspect.out.c_str() + at,
                          "gpu weights  %lf GB with the projections' bf16 copy %*[^,], %lf", &keep, &drop),
              2)
        << inspect.out;
    const size_t cb = plain.out.find("checkpoint   ");
    ASSERT_NE(cb, std::string::npos) << plain.out;
    ASSERT_EQ(std::sscanf(plain.out.c_str() + cb, "checkpoint   %*d file(s), %lf GB bound", &bound), 1)
        << plain.out;
    EXPECT_GT(keep, bound) << inspect.out;
    EXPECT_LT(drop, bound) << inspect.out;
    EXPECT_EQ(plain.out.find("gpu weights"), std::string::npos) << "a bf16 checkpoint has no copy to drop";
#endif
}

TEST(CliQuantize, QuantizeInt4RunsAsThePublishedInt4CheckpointDoes) {
    testing::TempDir dir("cli_int4");
    testing::Int4Layout layout;
    layout.quantized = [](const std::string& n) { return n.find("per_layer") == std::string::npos; };
    layout.ignore = {"re:.*per_layer.*"};
    testing::write_int4_copy(kModel, dir.path() / "int4", dir.path() / "ref", layout);
    for (const char* f : {"tokenizer.json", "generation_config.json"})
        fs::copy_file(kModel / f, dir.path() / "int4" / f);
    const std::string gen = " --device cpu -t 2 --ids 2,651,1567,1176 -n 12 --temp 0 --ignore-eos --json";

    const auto quantized = testing::run_cli("run -m '" + kModel.string() + "' --quantize int4" + gen);
    const auto published = testing::run_cli("run -m '" + (dir.path() / "int4").string() + "'" + gen);
    ASSERT_EQ(quantized.code, 0) << quantized.all();
    ASSERT_EQ(published.code, 0) << published.all();
    EXPECT_EQ(quantized.out, published.out);

    const auto again =
        testing::run_cli("run -m '" + (dir.path() / "int4").string() + "' --quantize fp8" + gen);
    EXPECT_EQ(again.out, published.out);
    EXPECT_NE(again.err.find("note: --quantize fp8: "), std::string::npos) << again.err;
    EXPECT_NE(again.err.find("is an int4 checkpoint already"), std::string::npos) << again.err;

    const auto inspect = testing::run_cli("inspect -m '" + (dir.path() / "int4").string() + "'");
    ASSERT_EQ(inspect.code, 0) << inspect.all();
    EXPECT_NE(inspect.out.find("weights      int4 with a scale per 128 weights (symmetric): "),
              std::string::npos)
        << inspect.out;
    EXPECT_NE(inspect.out.find("as the GPU's decode step reads them (int4 projections"), std::string::npos)
        << inspect.out;
}

TEST(CliQuantize, AnUnknownFormatIsAUsageError) {
    const auto r = testing::run_cli("run -m '" + kModel.string() + "' --quantize int3 --ids 2 -n 1");
    EXPECT_EQ(r.code, 2) << r.all();
    EXPECT_NE(r.err.find("--quantize: unknown weight format 'int3' (expected fp8, int4 or none)"),
              std::string::npos)
        << r.err;
    const auto help = testing::run_cli("perplexity --help");
    EXPECT_NE(help.out.find("--quantize"), std::string::npos) << help.out;
}

}  // namespace
}  // namespace markbase
