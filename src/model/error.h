// The one exception type MarkBase throws for anything a user can act on (bad file, bad flag, bad tensor).
// Messages name the file, the tensor or field, what was expected and what was found.
#pragma once

#include <stdexcept>
#include <string>

namespace markbase {

class Error : public std::runtime_error {
  public:
    explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace markbase
