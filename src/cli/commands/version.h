// markbase --version (also `markbase version`): the version, commit and build settings this binary was built
// with (cmake/build_info.h.in, generated at configure time) and what it chooses on this machine at run time.
#pragma once

#include <string>

namespace markbase::cli {

// The project() version of CMakeLists.txt, e.g. "0.1.0".
const char* markbase_version();

// The report, one "name: value" line each after the first ("markbase 0.1.0"): commit, build type, compiler,
// cuda (and cublas, nccl), cpu build, cpu matmul, http server, default model.
std::string build_info_text();

}  // namespace markbase::cli
