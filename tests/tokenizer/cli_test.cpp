// `markbase tokenize` / `markbase detokenize` through their command functions, with stdin/stdout redirected.
#include <filesystem>
#include <iostream>

#include "cli/commands/commands.h"
#include "model/error.h"
#include "tokenizer_test_data.h"

namespace markbase::test {

namespace {

struct TempDir {
    std::filesystem::path path =
        std::filesystem::temp_directory_path() / ("markbase_tok_cli_" + std::to_string(getpid()));
    TempDir() { std::filesystem::create_directories(path); }
    ~TempDir() { std::filesystem::remove_all(path); }
};

// The Gemma 4 tokenizer.json unpacked once into a temp folder, as a model folder would hold it.
const std::filesystem::path& model_dir() {
    static TempDir dir;
    static const bool written = [] {
        std::ofstream(dir.path / "tokenizer.json", std::ios::binary)
            << read_xz(tokenizer_data("gemma4/tokenizer.json.xz"));
        return true;
    }();
    (void)written;
    return dir.path;
}

std::string run(int (*cmd)(const cli::Args&), const cli::Args& args, const std::string& stdin_text = "") {
    std::istringstream in(stdin_text);
    std::ostringstream out;
    auto* old_in = std::cin.rdbuf(in.rdbuf());
    auto* old_out = std::cout.rdbuf(out.rdbuf());
    try {
        const int rc = cmd(args);
        std::cin.rdbuf(old_in);
        std::cout.rdbuf(old_out);
        EXPECT_EQ(rc, 0);
    } catch (...) {
        std::cin.rdbuf(old_in);
        std::cout.rdbuf(old_out);
        throw;
    }
    return out.str();
}

std::string error_of(int (*cmd)(const cli::Args&), const cli::Args& args,
                     const std::string& stdin_text = "") {
    try {
        run(cmd, args, stdin_text);
    } catch (const Error& e) {
        return e.what();
    }
    ADD_FAILURE() << "expected markbase::Error";
    return "";
}

}  // namespace

TEST(TokenizerCli, TokenizeFileAndStdin) {
    const std::string dir = model_dir().string();
    const std::string file = (model_dir() / "prompt.txt").string();
    std::ofstream(file, std::ios::binary) << "Hello world";
    EXPECT_EQ(run(cli::cmd_tokenize, {"--tokenizer", dir, "--file", file}), "[9259,1902]\n");
    EXPECT_EQ(run(cli::cmd_tokenize, {"--tokenizer=" + dir + "/tokenizer.json", "--bos"}, "Hello world"),
              "[2,9259,1902]\n");
    EXPECT_EQ(run(cli::cmd_tokenize, {"--tokenizer", dir}, ""), "[]\n");
    EXPECT_EQ(run(cli::cmd_tokenize, {"--tokenizer", dir}, "<|turn>user\n"), "[105,2364,107]\n");
}

TEST(TokenizerCli, DetokenizePrintsExactText) {
    const std::string dir = model_dir().string();
    EXPECT_EQ(run(cli::cmd_detokenize, {"--tokenizer", dir}, "[2, 9259, 1902, 106]"),
              "<bos>Hello world<turn|>");
    EXPECT_EQ(run(cli::cmd_detokenize, {"--tokenizer", dir, "--skip-special"}, "[2,9259,1902,106]\n"),
              "Hello world");
    EXPECT_EQ(run(cli::cmd_detokenize, {"--tokenizer", dir}, "[]"), "");
}

TEST(TokenizerCli, ClearErrors) {
    const std::string dir = model_dir().string();
    const std::string bad = (model_dir() / "bad.txt").string();
    std::ofstream(bad, std::ios::binary) << "ok \xff\xfe";
    EXPECT_NE(error_of(cli::cmd_tokenize, {"--tokenizer", dir, "--file", bad}).find("not valid UTF-8"),
              std::string::npos);
    EXPECT_NE(error_of(cli::cmd_tokenize, {"--tokenizer", dir}, "\xc3").find("offset 0"), std::string::npos);
    EXPECT_NE(error_of(cli::cmd_tokenize, {}).find("--tokenizer"), std::string::npos);
    EXPECT_NE(error_of(cli::cmd_tokenize, {"--tokenizer", dir, "--frobnicate"}).find("unknown argument"),
              std::string::npos);
    EXPECT_NE(error_of(cli::cmd_tokenize, {"--tokenizer", "/nonexistent/tok.json"}).find("cannot open"),
              std::string::npos);
    EXPECT_NE(error_of(cli::cmd_detokenize, {"--tokenizer", dir}, "1 2 3").find("not JSON"),
              std::string::npos);
    EXPECT_NE(error_of(cli::cmd_detokenize, {"--tokenizer", dir}, "{\"a\": 1}").find("JSON array"),
              std::string::npos);
    EXPECT_NE(error_of(cli::cmd_detokenize, {"--tokenizer", dir}, "[1, 262144]").find("element 1"),
              std::string::npos);
    EXPECT_NE(error_of(cli::cmd_detokenize, {"--tokenizer", dir}, "[1.5]").find("not a token id"),
              std::string::npos);
    const std::string not_json = (model_dir() / "not.json").string();
    std::ofstream(not_json) << "<html>nope</html>";
    EXPECT_NE(error_of(cli::cmd_tokenize, {"--tokenizer", not_json}, "x").find("invalid JSON"),
              std::string::npos);
}

// An element nested 100,000 deep is quoted as a short excerpt (quoting it whole recursed off the stack).
TEST(TokenizerCli, DetokenizeQuotesADeepElementBriefly) {
    const std::string deep = std::string(100000, '[') + std::string(100000, ']');
    const std::string msg =
        error_of(cli::cmd_detokenize, {"--tokenizer", model_dir().string()}, "[" + deep + "]");
    EXPECT_NE(msg.find("element 0"), std::string::npos) << msg.substr(0, 300);
    EXPECT_LT(msg.size(), 300u);
}

TEST(TokenizerCli, Help) {
    EXPECT_NE(run(cli::cmd_tokenize, {"--help"}).find("usage: markbase tokenize"), std::string::npos);
    EXPECT_NE(run(cli::cmd_detokenize, {"-h"}).find("usage: markbase detokenize"), std::string::npos);
}

}  // namespace markbase::test
