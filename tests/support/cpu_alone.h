// One sequence alone on the CPU backend: the reference the slot and batch tests hold every interleaved or
// batched row to.
#pragma once

#include <vector>

#include "loading/checkpoint.h"
#include "runtime/backend.h"

namespace markbase::testing {

struct AloneRun {
    std::vector<int> next;                 // the greedy token after the prompt and after each decode
    std::vector<std::vector<float>> rows;  // the logits that chose each
};

// The prompt through make_cpu_backend(ck, o), then `decodes` greedy tokens fed back one at a time.
AloneRun run_alone_on_cpu(const Checkpoint& ck, const BackendOptions& o, const std::vector<int>& prompt,
                          int decodes);

}  // namespace markbase::testing
