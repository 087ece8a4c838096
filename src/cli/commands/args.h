// A small command-line reader shared by the subcommands: `--flag value`, `--flag=value`, short aliases,
// boolean switches; anything left unread is an error naming it, so a typo never passes silently. Numbers are
// checked where they are read: an integer outside the range its setting allows, or a number that is not
// finite, is an error naming the flag as it was given, never a silently wrapped or saturated value.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "model/error.h"

namespace markbase::cli {

// Upper bounds of the integer flags that have none of their own.
inline constexpr int kIntMax = std::numeric_limits<int>::max();
inline constexpr int kMaxTokens = kIntMax;  // -c and token counts
inline constexpr int kMaxThreads = 4096;    // -t
inline constexpr int kMaxGpus = 1024;       // -tp

// What finish() throws when the arguments held -h/--help: the command's usage, listing every flag it read on
// the way there with its default (main prints it, exit 0). The list comes from the reads themselves, so it
// cannot drift from what the command accepts.
struct HelpRequested {
    std::string text;
};

// A command line the command cannot take (an unknown flag, a missing or malformed value, a number out of
// range): main exits 2 for it, 1 for an error while running, as the README's exit codes say.
class UsageError : public Error {
  public:
    using Error::Error;
};

class ArgReader {
  public:
    // -h/--help anywhere in args turns on help mode: every read still returns what was given (else its
    // default; required() returns "" instead of throwing), and finish() throws HelpRequested.
    ArgReader(std::string command, std::vector<std::string> args);
    bool help() const { return help_; }

    std::optional<std::string> value(std::initializer_list<const char*> names);
    std::string value_or(std::initializer_list<const char*> names, const std::string& def);

    // The flag's integer value, or `def` when it is absent. Throws markbase::Error naming the flag when the
    // value is not an integer or lies outside [lo, hi] ("run: -n must be in [-1, 2147483647], got
    // 4294967296"). T is the type the caller keeps the value in, so [lo, hi] always lies within its range.
    template <class T>
    T integer(std::initializer_list<const char*> names, T def, T lo, T hi) {
        static_assert(std::is_integral_v<T> && std::is_signed_v<T> && sizeof(T) <= sizeof(int64_t),
                      "read into a signed integer type of at most 64 bits");
        return static_cast<T>(integer_in(names, def, lo, hi));
    }

    // The flag's value as a finite number, or `def` when it is absent; "nan", "inf", an overflow such as
    // 1e999 and trailing characters ("0.5x") are errors naming the flag.
    double number(std::initializer_list<const char*> names, double def);
    bool flag(std::initializer_list<const char*> names);  // present or not; takes no value
    std::string required(std::initializer_list<const char*> names, const char* what);
    // throws markbase::Error for any argument nothing read; in help mode HelpRequested instead
    void finish();

  private:
    // The last occurrence of any of `names`: the name as given and its value.
    std::optional<std::pair<std::string, std::string>> find(std::initializer_list<const char*> names);
    int64_t integer_in(std::initializer_list<const char*> names, int64_t def, int64_t lo, int64_t hi);

    // one flag as the help lists it: "-n, --n-predict", "N", "128"
    struct FlagDoc {
        std::string names, placeholder, def;
    };
    void note(std::initializer_list<const char*> names, std::string placeholder, std::string def);
    std::string help_text() const;

    std::string command_;
    std::vector<std::string> args_;
    std::vector<bool> used_;
    bool help_ = false;
    std::vector<FlagDoc> docs_;  // in the order read
};

// "2,17,300" or "[2, 17, 300]" -> ids; throws naming the bad element.
std::vector<int> parse_id_list(const std::string& text, const char* flag);

}  // namespace markbase::cli
