// `markbase bench` on the CUDA backend: a loaded checkpoint (-m DIR --device cuda) or random weights built in
// GPU memory (--synthetic VARIANT [--layers N]). See bench_cuda.cpp.
#pragma once

#include "cli/commands/args.h"

namespace markbase::cli {

// True when the bench arguments ask for the CUDA path (--synthetic, or --device resolving to cuda).
bool bench_wants_cuda(ArgReader& a);
int cmd_bench_cuda(ArgReader& a);

}  // namespace markbase::cli
