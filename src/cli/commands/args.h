// A small command-line reader shared by the subcommands: `--flag value`, `--flag=value`, short aliases,
// boolean switches; anything left unread is an error naming it, so a typo never passes silently.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

namespace markbase::cli {

class ArgReader {
  public:
    ArgReader(std::string command, std::vector<std::string> args);

    std::optional<std::string> value(std::initializer_list<const char*> names);
    std::string value_or(std::initializer_list<const char*> names, const std::string& def);
    int64_t integer(std::initializer_list<const char*> names, int64_t def);
    double number(std::initializer_list<const char*> names, double def);
    bool flag(std::initializer_list<const char*> names);  // present or not; takes no value
    std::string required(std::initializer_list<const char*> names, const char* what);
    void finish();  // throws markbase::Error for any argument nothing read

  private:
    std::string command_;
    std::vector<std::string> args_;
    std::vector<bool> used_;
};

// "2,17,300" or "[2, 17, 300]" -> ids; throws naming the bad element.
std::vector<int> parse_id_list(const std::string& text, const char* flag);

}  // namespace markbase::cli
