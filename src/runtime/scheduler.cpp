#include "runtime/scheduler.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "model/error.h"

namespace markbase {

const char* seq_state_name(SeqState s) {
    switch (s) {
        case SeqState::Waiting:
            return "waiting";
        case SeqState::Prefilling:
            return "prefilling";
        case SeqState::Decoding:
            return "decoding";
        case SeqState::Finished:
            return "finished";
    }
    return "unknown";
}

int64_t Step::tokens() const {
    int64_t n = 0;
    for (const StepWork& w : work) n += static_cast<int64_t>(w.ids.size());
    return n;
}

Scheduler::Scheduler(const SchedulerLimits& limits, const KvBlockOptions& kv) : limits_(limits), kv_(kv) {
    if (limits.max_sequences < 1)
        throw Error("scheduler: max_sequences must be at least 1, found " +
                    std::to_string(limits.max_sequences));
    if (limits.max_queue < 0)
        throw Error("scheduler: max_queue must not be negative, found " + std::to_string(limits.max_queue));
    if (limits.ctx_size < 1)
        throw Error("scheduler: ctx_size must be positive, found " + std::to_string(limits.ctx_size));
    if (limits.step_token_budget < 1)
        throw Error("scheduler: the step's token budget must be positive, found " +
                    std::to_string(limits.step_token_budget));
    if (limits.one_pass_steps && limits.step_token_budget < limits.max_sequences)
        throw Error("scheduler: the step's token budget (-b, " + std::to_string(limits.step_token_budget) +
                    ") must be at least max_sequences (-np, " + std::to_string(limits.max_sequences) +
                    "): a step runs one decode token of every sequence and its prompt chunks as one pass");
    const int64_t one = kv_.blocks_for(limits.ctx_size, limits.step_token_budget);
    if (one > kv_.total())
        throw Error("scheduler: a KV pool of " + std::to_string(kv_.total()) +
                    " blocks cannot hold one sequence of " + std::to_string(limits.ctx_size) +
                    " positions (it needs " + std::to_string(one) + ")");
    for (int s = limits.max_sequences - 1; s >= 0; --s) free_slots_.push_back(s);
}

bool Scheduler::queue_full(int64_t waiting, int64_t running, const SchedulerLimits& limits) {
    return waiting >= limits.max_queue + std::max<int64_t>(0, limits.max_sequences - running);
}

bool Scheduler::add(uint64_t seq, std::vector<int> ids) {
    if (ids.empty() || static_cast<int64_t>(ids.size()) > limits_.ctx_size)
        throw Error("scheduler: a prompt of " + std::to_string(ids.size()) +
                    " tokens does not fit a context of " + std::to_string(limits_.ctx_size));
    if (running_.count(seq) ||
        std::any_of(queue_.begin(), queue_.end(), [&](const Seq& s) { return s.id == seq; }))
        throw std::logic_error("scheduler: sequence " + std::to_string(seq) + " is already live");
    if (queue_full(waiting(), running(), limits_)) return false;
    Seq s;
    s.id = seq;
    s.ids = std::move(ids);
    queue_.push_back(std::move(s));
    return true;
}

Scheduler::Seq* Scheduler::find_running(uint64_t seq) {
    auto it = running_.find(seq);
    return it == running_.end() ? nullptr : &it->second;
}

std::vector<uint64_t> Scheduler::running_in_admission_order(SeqState state) const {
    std::vector<std::pair<uint64_t, uint64_t>> v;  // (admitted_at, id)
    for (const auto& [id, s] : running_)
        if (s.state == state) v.emplace_back(s.admitted_at, id);
    std::sort(v.begin(), v.end());
    std::vector<uint64_t> ids;
    for (const auto& p : v) ids.push_back(p.second);
    return ids;
}

bool Scheduler::newest_running(bool prefilling_only, uint64_t after, uint64_t* seq) const {
    const Seq* best = nullptr;
    for (const auto& [id, s] : running_) {
        if (prefilling_only && s.state != SeqState::Prefilling) continue;
        if (s.admitted_at <= after) continue;
        if (best == nullptr || s.admitted_at > best->admitted_at) best = &s;
    }
    if (best) *seq = best->id;
    return best != nullptr;
}

void Scheduler::release(Seq& s) {
    kv_.free(s.id);
    if (s.slot >= 0) free_slots_.push_back(s.slot);
    s.slot = -1;
    awaiting_.erase(std::remove(awaiting_.begin(), awaiting_.end(), s.id), awaiting_.end());
}

void Scheduler::preempt(uint64_t seq, Step& step) {
    auto it = running_.find(seq);
    Seq s = std::move(it->second);
    running_.erase(it);
    release(s);
    s.n_cached = 0;
    s.state = SeqState::Waiting;
    queue_.push_front(std::move(s));
    step.preempted.push_back(seq);
}

void Scheduler::add_work(Seq& s, int64_t n, Step& step) {
    StepWork w;
    w.seq = s.id;
    w.slot = s.slot;
    w.pos0 = s.n_cached;
    w.ids.assign(s.ids.begin() + s.n_cached, s.ids.begin() + s.n_cached + n);
    s.n_cached += n;
    w.wants_logits = s.n_cached == static_cast<int64_t>(s.ids.size());
    if (w.wants_logits) awaiting_.push_back(s.id);
    step.work.push_back(std::move(w));
}

void Scheduler::schedule_decodes(Step& step) {
    for (uint64_t id : running_in_admission_order(SeqState::Decoding)) {
        Seq* s = find_running(id);
        if (s == nullptr) continue;  // preempted by an older decode of this step
        bool preempted_self = false;
        while (!preempted_self && !kv_.grow(id, s->n_cached + 1)) {
            uint64_t victim = 0;
            newest_running(false, 0, &victim);  // s itself is running, so there is one
            preempted_self = victim == id;
            preempt(victim, step);
            if (!preempted_self) s = find_running(id);
        }
        if (preempted_self) continue;
        add_work(*s, 1, step);
    }
}

void Scheduler::admit(Step& step) {
    while (!queue_.empty() && !free_slots_.empty()) {
        Seq& head = queue_.front();
        // a sequence preempted in this step waits for the next one (its blocks were just needed elsewhere)
        if (std::find(step.preempted.begin(), step.preempted.end(), head.id) != step.preempted.end()) break;
        if (kv_.blocks_for(static_cast<int64_t>(head.ids.size()), limits_.step_token_budget) >
            kv_.free_blocks())
            break;
        Seq s = std::move(head);
        queue_.pop_front();
        auto lowest = std::min_element(free_slots_.begin(), free_slots_.end());
        s.slot = *lowest;
        free_slots_.erase(lowest);
        s.state = SeqState::Prefilling;
        s.n_cached = 0;
        s.admitted_at = ++admissions_;
        step.admitted.push_back(s.id);
        running_.emplace(s.id, std::move(s));
    }
}

void Scheduler::schedule_prompts(Step& step, int64_t& budget) {
    bool first = true;
    for (uint64_t id : running_in_admission_order(SeqState::Prefilling)) {
        if (budget <= 0) break;
        Seq* s = find_running(id);
        if (s == nullptr) continue;  // preempted for an older prompt of this step
        const int64_t left = static_cast<int64_t>(s->ids.size()) - s->n_cached;
        // Where each prompt chunk is a pass over the weights of its own (on the MoE nearly every expert's
        // at ~100 tokens), only the step's first prompt is cut to the budget: a second one that does not fit
        // whole waits for the next step instead of starting with a sliver. One-pass steps fill the budget.
        if (!first && !limits_.one_pass_steps && left > budget) break;
        const int64_t want = std::min<int64_t>(left, budget);
        int64_t n = kv_.max_growable(id, s->n_cached + want) - s->n_cached;
        uint64_t victim = 0;
        while (n == 0 && newest_running(true, s->admitted_at, &victim)) {
            preempt(victim, step);
            n = kv_.max_growable(id, s->n_cached + want) - s->n_cached;
        }
        if (n == 0) continue;  // waits for blocks: decodes finish or preempt
        kv_.grow(id, s->n_cached + n);
        add_work(*s, n, step);
        budget -= n;
        first = false;
    }
}

Step Scheduler::schedule() {
    if (!awaiting_.empty())
        throw std::logic_error("scheduler: sequence " + std::to_string(awaiting_.front()) +
                               " got logits in the last step but was neither appended to nor finished");
    Step step;
    for (const auto& [id, s] : running_) kv_.trim(id);
    schedule_decodes(step);
    // one-pass steps: the decode tokens count against the budget, so a step's ids never exceed it; the
    // constructor's budget >= max_sequences leaves a prompt at least one id whenever a slot is free to hold
    // it
    int64_t budget = limits_.step_token_budget;
    if (limits_.one_pass_steps) budget -= static_cast<int64_t>(step.work.size());
    admit(step);
    schedule_prompts(step, budget);
    return step;
}

void Scheduler::append(uint64_t seq, int id) {
    Seq* s = find_running(seq);
    auto waiting = std::find(awaiting_.begin(), awaiting_.end(), seq);
    if (s == nullptr || waiting == awaiting_.end())
        throw std::logic_error("scheduler: append() to sequence " + std::to_string(seq) +
                               ", which got no logits in the last step");
    if (static_cast<int64_t>(s->ids.size()) >= limits_.ctx_size)
        throw std::logic_error("scheduler: sequence " + std::to_string(seq) + " already fills the context");
    s->ids.push_back(id);
    s->state = SeqState::Decoding;
    awaiting_.erase(waiting);
}

void Scheduler::finish(uint64_t seq) {
    cancel(seq);
}

bool Scheduler::cancel(uint64_t seq) {
    if (Seq* s = find_running(seq)) {
        release(*s);
        running_.erase(seq);
        return true;
    }
    auto it = std::find_if(queue_.begin(), queue_.end(), [&](const Seq& s) { return s.id == seq; });
    if (it == queue_.end()) return false;
    queue_.erase(it);
    return true;
}

SeqState Scheduler::state(uint64_t seq) const {
    auto it = running_.find(seq);
    if (it != running_.end()) return it->second.state;
    for (const Seq& s : queue_)
        if (s.id == seq) return SeqState::Waiting;
    return SeqState::Finished;
}

const std::vector<int>* Scheduler::ids(uint64_t seq) const {
    auto it = running_.find(seq);
    if (it != running_.end()) return &it->second.ids;
    for (const Seq& s : queue_)
        if (s.id == seq) return &s.ids;
    return nullptr;
}

int64_t Scheduler::n_cached(uint64_t seq) const {
    auto it = running_.find(seq);
    return it == running_.end() ? 0 : it->second.n_cached;
}

}  // namespace markbase
