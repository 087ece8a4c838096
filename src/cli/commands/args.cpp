#include "cli/commands/args.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "model/error.h"

namespace markbase::cli {

ArgReader::ArgReader(std::string command, std::vector<std::string> args)
    : command_(std::move(command)), args_(std::move(args)), used_(args_.size(), false) {
    for (size_t i = 0; i < args_.size(); ++i)
        if (args_[i] == "-h" || args_[i] == "--help") used_[i] = help_ = true;
}

// A flag read twice (bench reads --device to choose its path, then again) is listed once, with the default
// of the read that gave one.
void ArgReader::note(std::initializer_list<const char*> names, std::string placeholder, std::string def) {
    std::string joined;
    for (const char* n : names) joined += (joined.empty() ? "" : ", ") + std::string(n);
    for (FlagDoc& d : docs_)
        if (d.names == joined) {
            if (!def.empty()) d = {joined, std::move(placeholder), std::move(def)};
            return;
        }
    docs_.push_back({joined, std::move(placeholder), std::move(def)});
}

std::string ArgReader::help_text() const {
    std::string out = "usage: markbase " + command_ + " [options]  (markbase --help lists the commands)\n";
    for (const FlagDoc& d : docs_) {
        std::string line = "  " + d.names + (d.placeholder.empty() ? "" : " " + d.placeholder);
        if (!d.def.empty()) line += std::string(line.size() < 40 ? 40 - line.size() : 1, ' ') + d.def;
        out += line + "\n";
    }
    return out;
}

std::optional<std::pair<std::string, std::string>> ArgReader::find(std::initializer_list<const char*> names) {
    std::optional<std::pair<std::string, std::string>> found;
    for (size_t i = 0; i < args_.size(); ++i) {
        for (const char* n : names) {
            const std::string name = n;
            if (args_[i] == name) {
                if (i + 1 >= args_.size()) throw UsageError(command_ + ": " + name + " needs a value");
                used_[i] = used_[i + 1] = true;
                found.emplace(name, args_[i + 1]);
                ++i;
                break;
            }
            if (args_[i].rfind(name + "=", 0) == 0) {
                used_[i] = true;
                found.emplace(name, args_[i].substr(name.size() + 1));
                break;
            }
        }
    }
    return found;  // the last occurrence wins, as in most CLIs
}

std::optional<std::string> ArgReader::value(std::initializer_list<const char*> names) {
    note(names, "VALUE", "");
    auto f = find(names);
    if (!f) return std::nullopt;
    return std::move(f->second);
}

std::string ArgReader::value_or(std::initializer_list<const char*> names, const std::string& def) {
    auto v = value(names);
    note(names, "VALUE", "default " + (def.empty() ? std::string("\"\"") : def));
    return v ? *v : def;
}

int64_t ArgReader::integer_in(std::initializer_list<const char*> names, int64_t def, int64_t lo, int64_t hi) {
    note(names, "N", "default " + std::to_string(def));
    auto f = find(names);
    if (!f) return def;
    const auto& [name, text] = *f;
    int64_t x = 0;
    // from_chars takes no sign but '-', no spaces and no base prefix; a leading '+' is allowed here
    const char* first = text.data() + (text.size() > 1 && text[0] == '+' && text[1] != '-' ? 1 : 0);
    const char* last = text.data() + text.size();
    const auto [end, ec] = std::from_chars(first, last, x);
    if (ec == std::errc::result_out_of_range || (ec == std::errc() && end == last && (x < lo || x > hi)))
        throw UsageError(command_ + ": " + name + " must be in [" + std::to_string(lo) + ", " +
                         std::to_string(hi) + "], got " + text);
    if (ec != std::errc() || end != last || first == last)
        throw UsageError(command_ + ": " + name + " expects an integer, got '" + text + "'");
    return x;
}

double ArgReader::number(std::initializer_list<const char*> names, double def) {
    char shown[32];
    std::snprintf(shown, sizeof shown, "default %g", def);
    note(names, "X", shown);
    auto f = find(names);
    if (!f) return def;
    const auto& [name, text] = *f;
    // strtod also reads leading spaces and hex floats: neither passes; "nan", "inf" and 1e999 (an overflow
    // to inf) parse but are not finite
    char* end = nullptr;
    const double x = std::strtod(text.c_str(), &end);
    if (text.empty() || std::isspace(static_cast<unsigned char>(text[0])) || *end != '\0' ||
        text.find_first_of("xX") != std::string::npos)
        throw UsageError(command_ + ": " + name + " expects a number, got '" + text + "'");
    if (!std::isfinite(x)) throw UsageError(command_ + ": " + name + " must be a finite number, got " + text);
    return x;
}

bool ArgReader::flag(std::initializer_list<const char*> names) {
    note(names, "", "");
    bool found = false;
    for (size_t i = 0; i < args_.size(); ++i)
        for (const char* n : names)
            if (args_[i] == n) used_[i] = found = true;
    return found;
}

std::string ArgReader::required(std::initializer_list<const char*> names, const char* what) {
    auto v = value(names);
    note(names, what, "required");
    if (!v && help_) return "";
    if (!v) throw UsageError(command_ + ": " + *names.begin() + " " + what + " is required");
    return *v;
}

void ArgReader::finish() {
    if (help_) throw HelpRequested{help_text()};
    for (size_t i = 0; i < args_.size(); ++i)
        if (!used_[i])
            throw UsageError(command_ + ": unknown or misplaced argument '" + args_[i] + "' (see --help)");
}

std::vector<int> parse_id_list(const std::string& text, const char* flag) {
    std::vector<int> ids;
    std::string cur;
    auto push = [&]() {
        if (cur.empty()) return;
        char* end = nullptr;
        long v = std::strtol(cur.c_str(), &end, 10);
        if (*end || v < 0 || v > 0x7fffffff)
            throw UsageError(std::string(flag) + ": '" + cur + "' is not a token id");
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
    if (ids.empty()) throw UsageError(std::string(flag) + ": no token ids given");
    return ids;
}

}  // namespace markbase::cli
