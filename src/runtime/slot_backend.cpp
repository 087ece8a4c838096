#include "runtime/slot_backend.h"

#include <string>

#include "model/error.h"

namespace markbase {

namespace {

void check_select(const SlotBackend& be, const SlotWork& w) {
    const std::string where = "slot " + std::to_string(w.slot) + ": device selection ";
    if (!w.logits || w.argmax_only || !w.selection)
        throw Error(where +
                    "needs a logits row that is not argmax-only, and somewhere to put the candidates");
    const DeviceSelect& s = *w.select;
    if (s.k < 1 || s.k > be.max_select_k())
        throw Error(where + "of k = " + std::to_string(s.k) + "; this backend selects 1 to " +
                    std::to_string(be.max_select_k()));
    if (s.pen_ids.size() != s.pen_counts.size() ||
        static_cast<int64_t>(s.pen_ids.size()) > be.max_select_penalty_ids())
        throw Error(where + "with " + std::to_string(s.pen_ids.size()) + " penalty ids and " +
                    std::to_string(s.pen_counts.size()) + " counts; at most " +
                    std::to_string(be.max_select_penalty_ids()) + ", one count each");
    const int64_t V = be.config().vocab_size;
    for (int id : s.pen_ids)
        if (id < 0 || id >= V)
            throw Error(where + "penalty id " + std::to_string(id) + " is outside the vocabulary [0, " +
                        std::to_string(V) + ")");
}

}  // namespace

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
        if (w.select) check_select(be, w);
    }
}

}  // namespace markbase
