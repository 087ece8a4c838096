// Standard output that loses what is written to it (a full disk, /dev/full, a file-size limit) is an error,
// never a silent exit 0. glibc drops a buffer it could not write and keeps no errno for it, so the CLI's
// stdout is a stream over fd 1 that records the first failed write's errno itself; flush_stdout() reports it.
#pragma once

namespace markbase::cli {

// Makes `stdout` the recording stream (line-buffered on a terminal, fully buffered otherwise) and points
// std::cout at it too. Call once, at the start of main, before anything is written; every write to stdout
// (printf, fputs, FILE* sinks, std::cout) then goes through it, in order.
void install_checked_stdout();

// Flushes std::cout and stdout and throws markbase::Error("writing standard output: <strerror>") when any
// write to it has failed, now or earlier. The streaming commands call it after each piece so that they stop
// at once; main calls it before a command's success becomes exit code 0.
void flush_stdout();

}  // namespace markbase::cli
