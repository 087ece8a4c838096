// `markbase COMMAND --help`: the flags the command reads, each with its default, listed by ArgReader from the
// reads themselves. Every flag of the CLI's sources that a command accepts (given on its own, with the
// command's required arguments) must appear in its --help.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "support/cli_run.h"

namespace markbase {
namespace {

namespace fs = std::filesystem;

// The quoted names of a {"-x", "--xx"} list starting at text[i] ('{'); empty when it is not such a list.
// (A hand scan: std::regex here trips GCC 12's -Wmaybe-uninitialized inside libstdc++ in the sanitizer
// build.)
std::vector<std::string> flag_list_at(const std::string& text, size_t i) {
    std::vector<std::string> names;
    auto skip = [&] {
        while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    };
    ++i;
    for (;;) {
        skip();
        if (i + 1 >= text.size() || text[i] != '"' || text[i + 1] != '-') return {};
        const size_t end = text.find('"', i + 1);
        if (end == std::string::npos) return {};
        names.push_back(text.substr(i + 1, end - i - 1));
        i = end + 1;
        skip();
        if (i < text.size() && text[i] == '}') return names;
        if (i >= text.size() || text[i] != ',') return {};
        ++i;
    }
}

// The names of every {"-x", "--xx"} list in src/cli/commands/*.cpp: what ArgReader's reads are given.
std::set<std::string> source_flags() {
    std::set<std::string> flags;
    for (const auto& e : fs::directory_iterator(fs::path(MARKBASE_SOURCE_DIR) / "src" / "cli" / "commands")) {
        if (e.path().extension() != ".cpp") continue;
        std::ifstream f(e.path());
        const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
        for (size_t i = text.find('{'); i != std::string::npos; i = text.find('{', i + 1))
            for (const std::string& n : flag_list_at(text, i)) flags.insert(n);
    }
    flags.erase("-h");
    flags.erase("--help");
    return flags;
}

struct Command {
    const char* name;
    const char* required;  // the arguments it cannot run without
};
const Command kCommands[] = {
    {"run", ""},        {"chat", ""},  {"logits", "--ids 1 -o x.npy"}, {"inspect", ""}, {"bench", ""},
    {"bench load", ""}, {"serve", ""}, {"perplexity", "-f x.txt"},     {"version", ""},
};

// Whether `command` takes `flag` when given alone: every command reads all its flags before finish() refuses
// the first unread argument, so the probe's last argument makes it stop there, having run nothing.
bool accepts(const Command& c, const std::string& flag) {
    const testing::CliResult r =
        testing::run_cli(std::string(c.name) + " " + c.required + " " + flag + " 1 --markbase-help-probe");
    EXPECT_NE(r.code, 0) << c.name << " " << flag << " ran: " << r.all();
    return r.err.find("unknown or misplaced argument '" + flag + "'") == std::string::npos;
}

bool lists(const std::string& help, const std::string& flag) {
    for (const char* after : {", ", " ", "\n"})
        if (help.find(" " + flag + after) != std::string::npos) return true;
    return false;
}

TEST(CliHelp, EachCommandListsItsFlags) {
    for (const Command& c : kCommands) {
        const testing::CliResult r = testing::run_cli(std::string(c.name) + " --help");
        ASSERT_EQ(r.code, 0) << c.name << ": " << r.all();
        EXPECT_EQ(r.out.rfind(std::string("usage: markbase ") + c.name + " [options]", 0), 0u) << r.out;
    }
    const std::string run = testing::run_cli("run --help").out;
    EXPECT_NE(run.find("-n, --n-predict N"), std::string::npos) << run;
    EXPECT_NE(run.find("default 128"), std::string::npos) << run;
    EXPECT_NE(run.find("  --json\n"), std::string::npos) << run;
    EXPECT_NE(testing::run_cli("logits --help").out.find("required"), std::string::npos);
}

TEST(CliHelp, EveryAcceptedFlagIsListed) {
    const std::set<std::string> flags = source_flags();
    ASSERT_GT(flags.size(), 30u);
    for (const Command& c : kCommands) {
        const std::string help = testing::run_cli(std::string(c.name) + " --help").out;
        int accepted = 0;
        for (const std::string& f : flags) {
            if (!accepts(c, f)) continue;
            ++accepted;
            EXPECT_TRUE(lists(help, f)) << c.name << " accepts " << f << " but its --help omits it:\n"
                                        << help;
        }
        if (std::string(c.name) != "version") {  // version takes none
            EXPECT_GT(accepted, 0) << c.name;
        }
    }
}

}  // namespace
}  // namespace markbase
