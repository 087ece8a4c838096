// Reading a mapped file that has been truncated since it was mapped raises SIGBUS, which by default kills
// the process with a bare "Bus error". The safetensors mappings are registered here; a SIGBUS handler
// (installed with the first registration) that finds the faulting address in one of them writes
//   error: <file> changed size while mapped (truncated?)
// to stderr and exits with status 1. A SIGBUS anywhere else goes to the handler that was there before (the
// default action when there was none).
#pragma once

#include <cstddef>
#include <string>

namespace markbase {

// Registers [begin, begin + bytes) as a mapping of `file`. Returns a handle for unregister_mapping, or -1
// when the registry is full (the mapping then simply goes unguarded).
int register_mapping(const void* begin, size_t bytes, const std::string& file);
// Before the range is unmapped. -1 is ignored.
void unregister_mapping(int handle);

}  // namespace markbase
