// `markbase tokenize` and `markbase detokenize`: the tokenizer on the command line, for checking prompts and
// ids by hand and for scripts.
//   markbase tokenize   --tokenizer PATH [--file F] [--bos]   text of F (or stdin) -> one JSON array of ids
//   markbase tokenize   --tokenizer PATH --bench FILE          load time and encode/decode MB/s
//   markbase detokenize --tokenizer PATH [--skip-special]      JSON array of ids on stdin -> the exact text
// PATH is a tokenizer.json or a model folder that holds one. The text is taken byte for byte (a trailing
// newline from `echo` is part of it); ids are printed without BOS unless --bos is given.
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "cli/commands/commands.h"
#include "loading/json_excerpt.h"
#include "model/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_bench.h"

namespace markbase::cli {

namespace {

struct TokenizeOptions {
    std::string tokenizer;
    std::optional<std::string> file, bench;
    bool bos = false, skip_special = false, help = false;
};

const char* kTokenizeUsage =
    "usage: markbase tokenize --tokenizer PATH [--file F] [--bos]\n"
    "       markbase tokenize --tokenizer PATH --bench FILE\n"
    "Prints the token ids of F's text (or stdin's) as one JSON array. PATH is a tokenizer.json or a model "
    "folder.\n"
    "  --bos          prepend the <bos> id (the chat template writes <bos> itself; raw prompts need it)\n"
    "  --bench FILE   time loading PATH and encoding FILE (a .jsonl corpus contributes its \"text\" "
    "fields)\n";

const char* kDetokenizeUsage =
    "usage: markbase detokenize --tokenizer PATH [--skip-special]\n"
    "Reads a JSON array of token ids on stdin and prints their text exactly (special tokens included).\n"
    "  --skip-special   leave out special tokens such as <bos> and <turn|>\n";

TokenizeOptions parse(const Args& args, const std::string& command) {
    TokenizeOptions o;
    for (std::size_t i = 0; i < args.size(); ++i) {
        std::string flag = args[i], value;
        bool has_value = false;
        if (const auto eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
            value = flag.substr(eq + 1);
            flag = flag.substr(0, eq);
            has_value = true;
        }
        auto take = [&]() -> std::string {
            if (has_value) return value;
            if (i + 1 >= args.size()) throw Error(command + ": " + flag + " needs a value");
            return args[++i];
        };
        auto no_value = [&]() {
            if (has_value) throw Error(command + ": " + flag + " takes no value");
        };
        if (flag == "--tokenizer")
            o.tokenizer = take();
        else if (flag == "--file" && command == "tokenize")
            o.file = take();
        else if (flag == "--bench" && command == "tokenize")
            o.bench = take();
        else if (flag == "--bos" && command == "tokenize")
            no_value(), o.bos = true;
        else if (flag == "--skip-special" && command == "detokenize")
            no_value(), o.skip_special = true;
        else if (flag == "--help" || flag == "-h")
            o.help = true;
        else
            throw Error(command + ": unknown argument '" + args[i] + "' (see markbase " + command +
                        " --help)");
    }
    if (!o.help && o.tokenizer.empty())
        throw Error(command + ": --tokenizer PATH is required (a tokenizer.json or a model folder)");
    return o;
}

std::string read_all(std::istream& in) {
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

int cmd_tokenize(const Args& args) {
    const TokenizeOptions o = parse(args, "tokenize");
    if (o.help) {
        std::cout << kTokenizeUsage;
        return 0;
    }
    if (o.bench) {
        const std::string text = load_bench_text(*o.bench);
        std::cout << "tokenizer " << o.tokenizer << " | text " << *o.bench << "\n"
                  << format_bench(bench_tokenizer(o.tokenizer, text)) << "\n";
        return 0;
    }
    const Tokenizer tok = Tokenizer::load(o.tokenizer);
    std::string text;
    std::string source = "stdin";
    if (o.file) {
        std::ifstream in(*o.file, std::ios::binary);
        if (!in) throw Error("tokenize: cannot open " + *o.file);
        text = read_all(in);
        source = *o.file;
    } else {
        text = read_all(std::cin);
    }
    std::vector<int> ids;
    if (o.bos) {
        if (tok.bos_id() < 0) throw Error("tokenize: --bos given but " + o.tokenizer + " has no <bos> token");
        ids.push_back(tok.bos_id());
    }
    try {
        tok.encode_append(text, ids);
    } catch (const Error& e) {
        throw Error("tokenize: " + source + ": " + e.what());
    }
    std::string out = "[";
    for (std::size_t i = 0; i < ids.size(); ++i) {
        if (i) out += ',';
        out += std::to_string(ids[i]);
    }
    std::cout << out << "]\n";
    return 0;
}

int cmd_detokenize(const Args& args) {
    const TokenizeOptions o = parse(args, "detokenize");
    if (o.help) {
        std::cout << kDetokenizeUsage;
        return 0;
    }
    const Tokenizer tok = Tokenizer::load(o.tokenizer);
    const std::string input = read_all(std::cin);
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(input);
    } catch (const nlohmann::json::exception& e) {
        throw Error(
            std::string("detokenize: stdin is not JSON (expected an array of token ids like [2,9259]): ") +
            e.what());
    }
    if (!j.is_array()) throw Error("detokenize: expected a JSON array of token ids on stdin, like [2,9259]");
    std::vector<int> ids;
    ids.reserve(j.size());
    for (std::size_t i = 0; i < j.size(); ++i) {
        const auto& v = j[i];
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= tok.vocab_size())
            throw Error("detokenize: element " + std::to_string(i) + " (" + json_excerpt(v) +
                        ") is not a token id of this tokenizer (0.." + std::to_string(tok.vocab_size() - 1) +
                        ")");
        ids.push_back(static_cast<int>(v.get<int64_t>()));
    }
    std::cout << tok.decode(ids, o.skip_special);
    std::cout.flush();
    return 0;
}

}  // namespace markbase::cli
