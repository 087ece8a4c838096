// How `run` and `chat` end, run as a user would on the bundled model (models/default) and on copies of it
// whose config.json or generation_config.json name other eos ids: the stop ids each file contributes, the
// chat's end-of-turn ids, --ignore-eos, and a full context. Expected ids are transformers' (goldens.json).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "support/cli_run.h"
#include "support/tiny_models.h"
#include "tokenizer/tokenizer.h"

namespace markbase {
namespace {

namespace fs = std::filesystem;
using testing::run_cli;

const fs::path kModel = fs::path(MARKBASE_TEST_DATA) / ".." / ".." / "models" / "default";

nlohmann::json read_json(const fs::path& p) {
    return nlohmann::json::parse(std::ifstream(p));
}

const nlohmann::json& golden_prompt(const std::string& text) {
    static const nlohmann::json g = read_json(kModel / "goldens.json");
    for (const auto& p : g.at("prompts"))
        if (p.at("text") == text) return p;
    throw std::runtime_error("no golden prompt '" + text + "'");
}

std::string ids_arg(const std::vector<int>& ids) {
    std::string s;
    for (int id : ids) s += (s.empty() ? "" : ",") + std::to_string(id);
    return s;
}

// The first line of stdout as JSON (run --json), or a failure naming what was printed.
nlohmann::json json_line(const testing::CliResult& r) {
    EXPECT_EQ(r.code, 0) << r.all();
    return nlohmann::json::parse(r.out.substr(0, r.out.find('\n')));
}

// A copy of the bundled model whose config.json / generation_config.json eos_token_id are replaced (null:
// the key removed).
class ModelCopy {
  public:
    ModelCopy(const nlohmann::json& config_eos, const nlohmann::json& generation_eos) : dir_("stopcopy") {
        for (const char* f : {"model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"})
            fs::copy_file(kModel / f, dir_.path() / f);
        edit("config.json", config_eos);
        edit("generation_config.json", generation_eos);
    }
    std::string arg() const { return "-m '" + dir_.path().string() + "'"; }

  private:
    void edit(const char* file, const nlohmann::json& eos) {
        nlohmann::json j = read_json(kModel / file);
        if (eos.is_null())
            j.erase("eos_token_id");
        else
            j["eos_token_id"] = eos;
        std::ofstream(dir_.path() / file) << j.dump(2);
    }
    testing::TempDir dir_;
};

// The chat's own end-of-turn ids, on a copy whose files name only eos 1: the bundled generation_config.json
// lists them too, and would hide a chat that forgot its own.
TEST(CliStop, RunChatStopsAtEndOfTurnAsTransformersDoes) {
    const nlohmann::json p = golden_prompt("Who are you?");
    const auto want = p.at("generate_ids_stop").get<std::vector<int>>();
    ModelCopy plain(1, nullptr);
    const auto r = run_cli("run --device cpu " + plain.arg() + " --chat -p 'Who are you?' -n 64 --temp 0 --json");
    const nlohmann::json j = json_line(r);
    EXPECT_EQ(j.at("prompt_tokens").get<size_t>(), p.at("prompt_ids").size());
    EXPECT_EQ(j.at("ids").get<std::vector<int>>(), want);
    EXPECT_EQ(j.at("stop_reason"), "stop id");
    EXPECT_NE(r.err.find("stop: stop id"), std::string::npos) << r.err;
}

TEST(CliStop, ChatPrintsTheReplyWithoutItsStopIdAndKeepsTheSession) {
    const nlohmann::json p = golden_prompt("Who are you?");
    auto want = p.at("generate_ids_stop").get<std::vector<int>>();
    want.pop_back();  // the stop id is not printed
    const Tokenizer tok = Tokenizer::load(kModel);
    ModelCopy plain(1, nullptr);
    const auto r = run_cli("chat --device cpu " + plain.arg() + " -n 64 --temp 0", "Who are you?\nWho are you?\n");
    ASSERT_EQ(r.code, 0) << r.all();
    const std::string reply = "> " + tok.decode(want) + "\n";
    EXPECT_EQ(r.out.substr(0, reply.size()), reply) << r.out;
    // a second turn followed in the same session, and both turns ended at a stop id
    EXPECT_NE(r.out.find("\n> ", reply.size() - 1), std::string::npos) << r.out;
    size_t receipts = 0;
    for (size_t at = r.err.find("decode "); at != std::string::npos; at = r.err.find("decode ", at + 1)) ++receipts;
    EXPECT_EQ(receipts, 2u) << r.err;
}

TEST(CliStop, GenerationConfigEosStopsPlainRuns) {
    const nlohmann::json p = golden_prompt("And God said");
    const auto want = p.at("greedy_ids_full_recompute").get<std::vector<int>>();
    const std::string prompt = " --ids " + ids_arg(p.at("prompt_ids").get<std::vector<int>>());
    // the bundled model's stop ids never come up in this continuation
    EXPECT_EQ(json_line(run_cli("run --device cpu -n 32 --temp 0 --json" + prompt)).at("ids"), want);

    ModelCopy gen(1, nlohmann::json::array({50, want[5]}));  // generation_config.json: [50, id at step 5]
    nlohmann::json j = json_line(run_cli("run --device cpu " + gen.arg() + " -n 32 --temp 0 --json" + prompt));
    EXPECT_EQ(j.at("ids"), std::vector<int>(want.begin(), want.begin() + 6));
    EXPECT_EQ(j.at("stop_reason"), "stop id");
    j = json_line(run_cli("run --device cpu " + gen.arg() + " -n 32 --temp 0 --json --ignore-eos" + prompt));
    EXPECT_EQ(j.at("ids"), want);
    EXPECT_EQ(j.at("stop_reason"), "length");
}

TEST(CliStop, ConfigEosStopsPlainRunsWithoutGenerationConfigEos) {
    const nlohmann::json p = golden_prompt("And God said");
    const auto want = p.at("greedy_ids_full_recompute").get<std::vector<int>>();
    ASSERT_EQ(std::find(want.begin(), want.end(), want[8]) - want.begin(), 8);
    ModelCopy cfg(want[8], nullptr);  // config.json: the id at step 8; generation_config.json: no eos
    const nlohmann::json j = json_line(run_cli("run --device cpu " + cfg.arg() + " -n 32 --temp 0 --json --ids " +
                                               ids_arg(p.at("prompt_ids").get<std::vector<int>>())));
    EXPECT_EQ(j.at("ids"), std::vector<int>(want.begin(), want.begin() + 9));
    EXPECT_EQ(j.at("stop_reason"), "stop id");
}

TEST(CliStop, FullContextEndsTheRunWithItsReason) {
    const nlohmann::json p = golden_prompt("In the beginning");
    const auto want = p.at("greedy_ids_full_recompute").get<std::vector<int>>();
    const auto prompt = p.at("prompt_ids").get<std::vector<int>>();
    const int ctx = static_cast<int>(prompt.size()) + 6;
    const auto r = run_cli("run --device cpu -c " + std::to_string(ctx) + " -n 100 --temp 0 --json --ids " +
                           ids_arg(prompt));
    const nlohmann::json j = json_line(r);
    EXPECT_EQ(j.at("ids"), std::vector<int>(want.begin(), want.begin() + 7));  // ctx - prompt + 1
    EXPECT_EQ(j.at("stop_reason"), "context full");
    EXPECT_NE(r.err.find("stop: context full"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace markbase
