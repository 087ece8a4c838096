#include "runtime/slot_backend.h"

#include <string>

#include "model/error.h"

namespace markbase {

void check_slot_work(const SlotBackend& be, const std::vector<SlotWork>& work) {
    std::vector<char> seen(static_cast<size_t>(be.slots()), 0);
    for (const SlotWork& w : work) {
        if (w.slot < 0 || w.slot >= be.slots())
            throw Error("slot " + std::to_string(w.slot) + " is outside [0, " + std::to_string(be.slots()) +
                        ")");
        if (seen[static_cast<size_t>(w.slot)])
            throw Error("slot " + std::to_string(w.slot) + " is listed twice");
        seen[static_cast<size_t>(w.slot)] = 1;
        if (w.ids.empty()) throw Error("slot " + std::to_string(w.slot) + ": no ids to append");
        const int64_t n = static_cast<int64_t>(w.ids.size());
        if (be.n_past(w.slot) + n > be.ctx_size())
            throw Error("context full: slot " + std::to_string(w.slot) + " holds " +
                        std::to_string(be.n_past(w.slot)) + " positions, " + std::to_string(n) +
                        " more exceed the context size " + std::to_string(be.ctx_size()));
        const int64_t V = be.config().vocab_size;
        for (int id : w.ids)
            if (id < 0 || id >= V)
                throw Error("slot " + std::to_string(w.slot) + ": id " + std::to_string(id) +
                            " is outside the vocabulary [0, " + std::to_string(V) + ")");
    }
}

}  // namespace markbase
