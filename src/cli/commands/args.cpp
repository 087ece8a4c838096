#include "cli/commands/args.h"

#include <cstdlib>

#include "model/error.h"

namespace markbase::cli {

ArgReader::ArgReader(std::string command, std::vector<std::string> args)
    : command_(std::move(command)), args_(std::move(args)), used_(args_.size(), false) {}

std::optional<std::string> ArgReader::value(std::initializer_list<const char*> names) {
    std::optional<std::string> found;
    for (size_t i = 0; i < args_.size(); ++i) {
        for (const char* n : names) {
            const std::string name = n;
            if (args_[i] == name) {
                if (i + 1 >= args_.size()) throw Error(command_ + ": " + name + " needs a value");
                used_[i] = used_[i + 1] = true;
                found = args_[i + 1];
                ++i;
                break;
            }
            if (args_[i].rfind(name + "=", 0) == 0) {
                used_[i] = true;
                found = args_[i].substr(name.size() + 1);
                break;
            }
        }
    }
    return found;  // the last occurrence wins, as in most CLIs
}

std::string ArgReader::value_or(std::initializer_list<const char*> names, const std::string& def) {
    auto v = value(names);
    return v ? *v : def;
}

int64_t ArgReader::integer(std::initializer_list<const char*> names, int64_t def) {
    auto v = value(names);
    if (!v) return def;
    char* end = nullptr;
    long long x = std::strtoll(v->c_str(), &end, 10);
    if (v->empty() || *end)
        throw Error(command_ + ": " + *names.begin() + " expects an integer, got '" + *v + "'");
    return x;
}

double ArgReader::number(std::initializer_list<const char*> names, double def) {
    auto v = value(names);
    if (!v) return def;
    char* end = nullptr;
    double x = std::strtod(v->c_str(), &end);
    if (v->empty() || *end)
        throw Error(command_ + ": " + *names.begin() + " expects a number, got '" + *v + "'");
    return x;
}

bool ArgReader::flag(std::initializer_list<const char*> names) {
    bool found = false;
    for (size_t i = 0; i < args_.size(); ++i)
        for (const char* n : names)
            if (args_[i] == n) used_[i] = found = true;
    return found;
}

std::string ArgReader::required(std::initializer_list<const char*> names, const char* what) {
    auto v = value(names);
    if (!v) throw Error(command_ + ": " + *names.begin() + " " + what + " is required");
    return *v;
}

void ArgReader::finish() {
    for (size_t i = 0; i < args_.size(); ++i)
        if (!used_[i])
            throw Error(command_ + ": unknown or misplaced argument '" + args_[i] + "' (see --help)");
}

std::vector<int> parse_id_list(const std::string& text, const char* flag) {
    std::vector<int> ids;
    std::string cur;
    auto push = [&]() {
        if (cur.empty()) return;
        char* end = nullptr;
        long v = std::strtol(cur.c_str(), &end, 10);
        if (*end || v < 0 || v > 0x7fffffff)
            throw Error(std::string(flag) + ": '" + cur + "' is not a token id");
        ids.push_back(static_cast<int>(v));
        cur.clear();
    };
    for (char ch : text) {
        if (ch == ',' || ch == ' ' || ch == '[' || ch == ']' || ch == '\n' || ch == '\t')
            push();
        else
            cur += ch;
    }
    push();
    if (ids.empty()) throw Error(std::string(flag) + ": no token ids given");
    return ids;
}

}  // namespace markbase::cli
