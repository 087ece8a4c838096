// The rollback rule of a sliding-window layer's KV ring, shared by every backend's cache.
#pragma once

#include <cstdint>

namespace markbase {

// A ring of `capacity` slots keeps position p in slot p % capacity, so once positions [0, n_past) have been
// written, every position below n_past - capacity is gone. Continuing the sequence from position n_keep (the
// positions >= n_keep dropped) needs what a query at n_keep reads: positions n_keep - window + 1 .. n_keep - 1
// (the window counts the query itself). Rolling back to 0 needs nothing. Positions still to be written are
// not a concern: each is written before any query reads it.
inline bool ring_can_roll_back(int64_t n_past, int64_t n_keep, int64_t capacity, int64_t window) {
    if (n_keep == 0 || n_past <= capacity) return true;
    return n_keep - window + 1 >= n_past - capacity;
}

}  // namespace markbase
