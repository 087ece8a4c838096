// The CLI contract, run as a user would: `logits` writes a [n_ids, vocab] float32 .npy equal to the library's
// forward, `run --json` prints the generated ids, and bad input ends in one clear "error:" line and exit 1.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "loading/checkpoint.h"
#include "loading/npy.h"
#include "loading/random_checkpoint.h"
#include "runtime/backend.h"
#include "runtime/generate.h"
#include "support/cli_run.h"
#include "support/tiny_models.h"

namespace markbase {
namespace {

using Result = testing::CliResult;
Result run(const std::string& args) {
    return testing::run_cli(args);
}

class Cli : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir = new testing::TempDir("cli");
        write_random_checkpoint(dir->path(), testing::tiny_config("26b-a4b"), 11);
    }
    static void TearDownTestSuite() { delete dir; }
    static std::string model() { return "-m " + dir->path().string(); }
    static testing::TempDir* dir;
};
testing::TempDir* Cli::dir = nullptr;

TEST_F(Cli, LogitsWritesTheForwardAsNpy) {
    const std::string out = (dir->path() / "out.npy").string();
    Result r =
        run("logits " + model() + " --device cpu --ids 2,17,200 -o " + out);  // exact: the CPU reference
    ASSERT_EQ(r.code, 0) << r.all();
    NpyArray a = read_npy_f32(out);
    ASSERT_EQ(a.shape, (std::vector<int64_t>{3, 256}));

    auto ck = load_checkpoint(dir->path());
    BackendOptions o;
    o.threads = 1;
    auto be = make_cpu_backend(*ck, o);
    std::vector<int> ids{2, 17, 200};
    std::vector<float> ref(3 * 256);
    be->eval(ids.data(), 3, ref.data(), true);
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(a.data[i], ref[i], 1e-5f) << i;
}

// A write that fails part way (here a 512-byte file-size limit: EFBIG) leaves the file that was there byte
// for byte, and no temporary beside it.
TEST_F(Cli, LogitsLeavesTheOldFileWhenTheWriteFails) {
    testing::TempDir out_dir("clilogits");
    const std::filesystem::path out = out_dir.path() / "kept.npy";
    const std::string old(2000, 'x');
    std::ofstream(out, std::ios::binary) << old;
    testing::CliShell limited;
    limited.before = "ulimit -f 1;";
    Result r = testing::run_cli(
        "logits " + model() + " --device cpu --ids 2,17,200 -o '" + out.string() + "'", "", limited);
    EXPECT_EQ(r.code, 1) << r.all();
    EXPECT_NE(
        r.err.find("error: " + out.string() + ": write failed: File too large (the file was not changed)"),
        std::string::npos)
        << r.all();
    std::ifstream f(out, std::ios::binary);
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()), old);
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(out_dir.path()))
        names.push_back(e.path().filename().string());
    EXPECT_EQ(names, std::vector<std::string>{"kept.npy"});

    // without the limit the same command replaces it
    r = run("logits " + model() + " --device cpu --ids 2,17,200 -o '" + out.string() + "'");
    ASSERT_EQ(r.code, 0) << r.all();
    EXPECT_EQ(read_npy_f32(out.string()).shape, (std::vector<int64_t>{3, 256}));
}

TEST_F(Cli, RunJsonPrintsTheGreedyIds) {
    Result r = run("run " + model() + " --ids 2,17,200 -n 7 --temp 0 --json");
    ASSERT_EQ(r.code, 0) << r.all();
    const auto line = r.out.substr(0, r.out.find('\n'));
    nlohmann::json j = nlohmann::json::parse(line);
    std::vector<int> ids = j.at("ids").get<std::vector<int>>();

    auto ck = load_checkpoint(dir->path());
    auto be = make_cpu_backend(*ck, BackendOptions{});
    GenerateOptions go;
    go.max_new_tokens = 7;
    go.sampling.temperature = 0;
    go.stop_ids = ck->config.stop_ids;
    std::vector<int> expect;
    generate(
        *be, {2, 17, 200}, go, [](int) { return true; }, &expect);
    EXPECT_EQ(ids, expect);
    EXPECT_NE(r.err.find("decode"), std::string::npos) << "no receipt on stderr: " << r.err;
}

TEST_F(Cli, SameSeedSameSample) {
    Result a =
        run("run " + model() + " --ids 2,5 -n 12 --temp 1.5 --top-k 0 --top-p 1 -s 99 --json --ignore-eos");
    Result b =
        run("run " + model() + " --ids 2,5 -n 12 --temp 1.5 --top-k 0 --top-p 1 -s 99 --json --ignore-eos");
    ASSERT_EQ(a.code, 0) << a.all();
    EXPECT_EQ(a.out.substr(0, a.out.find('\n')), b.out.substr(0, b.out.find('\n')));
}

TEST_F(Cli, BadInputsGiveOneClearError) {
    struct Case {
        std::string args, expect;
    };
    for (const Case& c : std::vector<Case>{
             {"run " + model() + " --ids 2,3 --bogus 1", "--bogus"},
             {"run " + model() + " --ids 2,999", "outside the vocabulary"},
             {"run " + model() + " --ids 2,x", "not a token id"},
             {"run " + model() + " --ids 2,3,4,5,6,7 -c 4", "context"},
             {"run " + model() + " --ids 2,3 --top-p 7", "--top-p"},
             {"run -m /nonexistent --ids 2", "/nonexistent"},
             {"logits " + model() + " --ids 2", "-o"},
             {"frobnicate", "unknown command"},
             {"run " + model() + " --ids 2,3 --device cpu -tp 2", "use --device cuda"},
             {"run " + model() + " --ids 2,3 --tensor-parallel-size 0", "--tensor-parallel-size"},
             {"run " + model() + " --ids 2,3 --kv-cache-dtype fp8_e5m2",
              "--kv-cache-dtype: unknown KV cache type 'fp8_e5m2' (expected auto, bf16, f32 or fp8)"},
#ifdef MARKBASE_HAS_HTTP
             {"serve --device cpu --synthetic e2b", "draws its weights on the GPU"},
             {"serve --device cpu -tp 2", "--tensor-parallel-size needs --device cuda"},
             {"serve --device cpu -np 0", "-np"},
             {"serve --device cpu --gpu-memory-utilization 1.5",
              "serve: --gpu-memory-utilization must be in (0, 1], got 1.5"},
#endif
         }) {
        Result r = run(c.args);
        EXPECT_NE(r.code, 0) << c.args;
        EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.args << " printed: " << r.all();
        EXPECT_EQ(r.err.find("terminate"), std::string::npos) << c.args << " crashed: " << r.all();
    }
}

TEST_F(Cli, HelpIsASuccessOnlyForAKnownCommand) {
    for (const char* args : {"frobnicate --help", "frobnicate -h", "runn --help"}) {
        Result r = run(args);
        EXPECT_EQ(r.code, 2) << args << "\n" << r.all();
        const std::string name = std::string(args).substr(0, std::string(args).find(' '));
        EXPECT_NE(r.err.find("unknown command '" + name + "'"), std::string::npos) << args << "\n" << r.all();
        EXPECT_EQ(r.out, "") << args;
    }
    for (const char* args : {"--help", "-h", "help", "run --help", "bench load --help", "tokenize --help"}) {
        Result r = run(args);
        EXPECT_EQ(r.code, 0) << args << "\n" << r.all();
        EXPECT_NE(r.out.find("usage: markbase"), std::string::npos) << args << "\n" << r.all();
    }
}

TEST_F(Cli, WithoutModelFlagTheBundledModelRuns) {
    // models/default/goldens.json: "And God said" and transformers' greedy continuation
    const nlohmann::json g = nlohmann::json::parse(
        std::ifstream(std::string(MARKBASE_TEST_DATA) + "/../../models/default/goldens.json"));
    const auto& p = g.at("prompts").at(0);
    ASSERT_EQ(p.at("prompt_ids"), (std::vector<int>{2, 677, 540, 705}));
    const auto want = p.at("greedy_ids_full_recompute").get<std::vector<int>>();
    Result r = run("run --device cpu --ids 2,677,540,705 -n 4 --temp 0 --json");
    ASSERT_EQ(r.code, 0) << r.all();
    EXPECT_EQ(nlohmann::json::parse(r.out.substr(0, r.out.find('\n'))).at("ids"),
              std::vector<int>(want.begin(), want.begin() + 4))
        << r.out;
}

TEST_F(Cli, InspectPrintsThePlan) {
    Result r = run("inspect " + model());
    ASSERT_EQ(r.code, 0) << r.all();
    EXPECT_NE(r.out.find("MoE: 8 experts, top 3"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("k_eq_v"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("bytes/token"), std::string::npos) << r.out;
}

// A 12B checkpoint (gemma4_unified, as transformers saves it): named as such, its embedders listed as
// skipped; and the presets without any checkpoint.
TEST(CliInspect, TwelveBCheckpointAndPresets) {
    const std::string dir = std::string(MARKBASE_TEST_DATA) + "/models/12b-nested";
    Result r = run("inspect -m " + dir);
    ASSERT_EQ(r.code, 0) << r.all();
    for (const char* want : {"Gemma4UnifiedForConditionalGeneration", "Unified (12B-like)",
                             "encoder-free vision embedder", "encoder-free audio embedder", "k_eq_v"})
        EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
    r = run("inspect --synthetic 12b");
    ASSERT_EQ(r.code, 0) << r.all();
    EXPECT_NE(r.out.find("hidden 3840, layers 48, heads 16"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("23.8"), std::string::npos) << r.out;  // GB per token
    r = run("inspect --synthetic 26b-standard --layers 6");
    ASSERT_EQ(r.code, 0) << r.all();
    EXPECT_NE(r.out.find("mlp=7744"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("MoE"), std::string::npos) << r.out;
    r = run("inspect --synthetic 13b");
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.all().find("unknown variant '13b' (expected e2b, e4b, 12b, 26b-a4b, 26b-standard or 31b)"),
              std::string::npos)
        << r.all();
}

}  // namespace
}  // namespace markbase
