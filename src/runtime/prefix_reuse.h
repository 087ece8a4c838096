// Feeding a prompt that repeats most of what the cache already holds (a chat's next turn re-renders the whole
// conversation): keep the longest cached prefix the prompt shares and feed only the rest.
#pragma once

#include <vector>

#include "runtime/backend.h"

namespace markbase {

// cached: the ids whose K/V the backend holds, in order. Rolls the backend back to the longest prefix of
// `cached` that `ids` starts with, keeping at least one id of `ids` unfed (its logits are needed), or resets
// it when its cache cannot roll back that far. On return `cached` is that kept prefix; the result is the part
// of `ids` still to feed.
std::vector<int> reuse_cached_prefix(Backend& be, std::vector<int>& cached, const std::vector<int>& ids);

}  // namespace markbase
