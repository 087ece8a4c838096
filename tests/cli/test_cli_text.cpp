// Text in, text out through the CLI: a tiny random model with the real Gemma 4 vocabulary (262144) and its
// tokenizer.json in the folder, so `run -p`, `run --chat` and `chat` run end to end.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loading/checkpoint.h"
#include "loading/random_checkpoint.h"
#include "runtime/backend.h"
#include "runtime/generate.h"
#include "support/tiny_models.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/tokenizer.h"

namespace markbase {
namespace {

std::string sh(const std::string& cmd, int* code) {
    std::string out;
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return out;
    std::array<char, 4096> buf;
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
    const int status = pclose(p);
    *code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return out;
}

class CliText : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir = new testing::TempDir("clitext");
        nlohmann::json c = testing::tiny_config("31b");
        c["vocab_size"] = 262144;
        c["eos_token_id"] = nlohmann::json::array({1, 106});
        write_random_checkpoint(dir->path(), c, 5);
        int code = 0;
        sh("xz -dc '" + std::string(MARKBASE_TEST_DATA) + "/tokenizer/gemma4/tokenizer.json.xz' > '" +
               (dir->path() / "tokenizer.json").string() + "'",
           &code);
        ASSERT_EQ(code, 0) << "xz failed (scripts/install-deps.sh installs xz-utils)";
    }
    static void TearDownTestSuite() { delete dir; }
    static std::string bin() { return std::string(MARKBASE_BINARY) + " "; }
    static std::string model() { return "-m '" + dir->path().string() + "' "; }
    static testing::TempDir* dir;
};
testing::TempDir* CliText::dir = nullptr;

TEST_F(CliText, RunPromptStreamsTheSameTextAsJson) {
    int code = 0;
    const std::string streamed =
        sh(bin() + "run " + model() + "-p 'The capital of France' -n 8 --temp 0 --ignore-eos 2>/dev/null",
           &code);
    ASSERT_EQ(code, 0) << streamed;
    const std::string js = sh(
        bin() + "run " + model() + "-p 'The capital of France' -n 8 --temp 0 --ignore-eos --json 2>/dev/null",
        &code);
    ASSERT_EQ(code, 0) << js;
    nlohmann::json j = nlohmann::json::parse(js);
    // BOS + the prompt's own tokens, as the tokenizer encodes them, and the library's greedy continuation
    Tokenizer tok = Tokenizer::load(dir->path());
    std::vector<int> prompt{2};
    tok.encode_append("The capital of France", prompt);
    EXPECT_EQ(j["prompt_tokens"].get<size_t>(), prompt.size());
    auto ck = load_checkpoint(dir->path());
    auto be = make_cpu_backend(*ck, BackendOptions{});
    GenerateOptions go;
    go.max_new_tokens = 8;
    go.sampling.temperature = 0;
    go.ignore_eos = true;
    std::vector<int> want;
    generate(
        *be, prompt, go, [](int) { return true; }, &want);
    EXPECT_EQ(j["ids"].get<std::vector<int>>(), want);
    EXPECT_EQ(streamed, "The capital of France" + tok.decode(j["ids"].get<std::vector<int>>()) + "\n");
}

TEST_F(CliText, ChatKeepsHistoryAndPrintsAReceiptPerReply) {
    int code = 0;
    const std::string out = sh(
        "printf 'Hello there\\nAnd again\\n' | " + bin() + "chat " + model() + "-n 6 --temp 0 2>&1", &code);
    ASSERT_EQ(code, 0) << out;
    // one receipt per reply; "prompt N tok" there counts only what was fed to the model this turn
    std::vector<int> prompt_tokens;
    for (size_t p = out.find("[prompt "); p != std::string::npos; p = out.find("[prompt ", p + 1))
        prompt_tokens.push_back(std::stoi(out.substr(p + 8)));
    ASSERT_EQ(prompt_tokens.size(), 2u) << out;
    Tokenizer tok = Tokenizer::load(dir->path());
    // the second turn reuses the cache: only the re-rendered 6-token reply (+ a few for its turn markers),
    // the new user turn and the generation prompt are fed, not the first turn again
    const int new_turn = static_cast<int>(
        tok.encode("<turn|>\n<|turn>user\nAnd again<turn|>\n<|turn>model\n<|channel>thought\n<channel|>")
            .size());
    EXPECT_LE(prompt_tokens[1], 6 + 3 + new_turn) << out;
    EXPECT_EQ(prompt_tokens[0], static_cast<int>(tok.encode(render_gemma4_chat({{"user", "Hello there"}}, true)).size()))
        << out;
}

// A prompt refused after tokenizing (too long for the context, ids past the model's vocabulary) or by the
// tokenizer (invalid UTF-8) leaves stdout empty: the prompt's text is echoed only once it will be run.
TEST_F(CliText, RunPrintsNothingBeforeAPromptIsRefused) {
    testing::TempDir small("clitextsmall");  // the same tokenizer beside a model of vocabulary 256
    write_random_checkpoint(small.path(), testing::tiny_config("31b"), 5);
    std::filesystem::copy_file(dir->path() / "tokenizer.json", small.path() / "tokenizer.json");
    struct Case {
        std::string args, expect;
    };
    for (const Case& c : std::vector<Case>{
             {model() + "-p 'The capital of France is a city' -c 4", "context holds 4 more"},
             {"-m '" + small.path().string() + "' -p 'The capital of France'",
              "tokenizer.json: the tokenizer has ids up to 262143"},  // refused at load, naming both
             {model() + "-p \"$(printf 'ab\\377')\"", "not valid UTF-8"},
         }) {
        int code = 0;
        const std::string err_file = (small.path() / "err").string();
        const std::string out =
            sh(bin() + "run --device cpu -n 2 " + c.args + " 2>'" + err_file + "'", &code);
        std::ifstream ef(err_file);
        const std::string err((std::istreambuf_iterator<char>(ef)), std::istreambuf_iterator<char>());
        EXPECT_EQ(code, 1) << c.args << "\n" << err;
        EXPECT_EQ(out, "") << c.args;
        EXPECT_NE(err.find(c.expect), std::string::npos) << c.args << "\n" << err;
    }
}

// One bad line (invalid UTF-8, too long for the context) is refused with a message; the session, and the
// history the next line is answered with, go on.
TEST_F(CliText, ChatRefusesABadLineAndKeepsTheSession) {
    std::string long_line;
    for (int i = 0; i < 60; ++i) long_line += "word ";
    const std::string input_file = (dir->path() / "chat_input.txt").string();
    std::ofstream(input_file, std::ios::binary) << "Hello there\n\xff\xfe\n" << long_line << "\nAnd again\n";
    int code = 0;
    const std::string out =
        sh(bin() + "chat " + model() + "--device cpu -n 4 --temp 0 -c 48 <'" + input_file + "' 2>&1", &code);
    ASSERT_EQ(code, 0) << out;
    size_t receipts = 0, refused = 0;
    for (size_t p = out.find("[prompt "); p != std::string::npos; p = out.find("[prompt ", p + 1)) ++receipts;
    for (size_t p = out.find("[line not accepted: "); p != std::string::npos;
         p = out.find("[line not accepted: ", p + 1))
        ++refused;
    EXPECT_EQ(receipts, 2u) << out;
    EXPECT_EQ(refused, 2u) << out;
    EXPECT_NE(out.find("not valid UTF-8"), std::string::npos) << out;
    EXPECT_NE(out.find("(set --ctx-size)"), std::string::npos) << out;
    EXPECT_EQ(out.find("starting a new conversation"), std::string::npos) << out;
    // the second reply continues the first conversation from the cache: what is fed is the re-rendered
    // 4-token reply (+ its turn markers) and the new turn, as in ChatKeepsHistoryAndPrintsAReceiptPerReply
    Tokenizer tok = Tokenizer::load(dir->path());
    const int new_turn = static_cast<int>(
        tok.encode("<turn|>\n<|turn>user\nAnd again<turn|>\n<|turn>model\n<|channel>thought\n<channel|>")
            .size());
    EXPECT_LE(std::stoi(out.substr(out.rfind("[prompt ") + 8)), 4 + 3 + new_turn) << out;
}

TEST_F(CliText, PromptWithoutTokenizerIsAClearError) {
    testing::TempDir bare("bare");
    write_random_checkpoint(bare.path(), testing::tiny_config("31b"), 5);
    int code = 0;
    const std::string out = sh(bin() + "run -m '" + bare.path().string() + "' -p hi 2>&1", &code);
    EXPECT_EQ(code, 1);
    EXPECT_NE(out.find("tokenizer.json"), std::string::npos) << out;
}

}  // namespace
}  // namespace markbase
