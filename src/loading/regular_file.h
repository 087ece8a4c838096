// Opening what the user named only when it is what we expect. A FIFO given as config.json blocks the open
// forever, /dev/zero reads until memory runs out, a symlink loop or a directory reads as "missing" or
// "empty": each is refused by looking at the path first (std::filesystem::status, which follows symlinks),
// with a message that says what is there instead.
#pragma once

#include <filesystem>
#include <string>

namespace markbase {

// "" when `p` is a regular file (want_dir false) or a directory (want_dir true), else what is there instead:
// "does not exist", "is a directory", "is a FIFO (named pipe), not a regular file", "is a character device,
// not a regular file", "is a symlink loop (too many levels of symbolic links)", "is a file, not a folder", or
// the system's reason it cannot be looked at.
std::string path_problem(const std::filesystem::path& p, bool want_dir = false);

// Whether `p` is missing (nothing there, or a dangling symlink); false for anything that exists.
bool path_missing(const std::filesystem::path& p);

// The whole of the regular file `p`. Throws markbase::Error "<p>: <problem>" (path_problem's words, with
// `missing_hint` after them when it does not exist) for anything else, before opening it, and for read errors
// and files over `max_bytes`.
std::string read_regular_file(const std::filesystem::path& p, const std::string& missing_hint = "",
                              uint64_t max_bytes = uint64_t{1} << 30);

}  // namespace markbase
