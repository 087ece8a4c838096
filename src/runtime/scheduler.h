// Continuous batching as pure logic over plain data: which sequences run in a step and which tokens each one
// feeds. No threads and no model here; the serving engine (src/server/engine_impl.cpp) drives it:
//
//   Step s = sched.schedule();         // admissions, preemptions, this step's work
//   backend.eval_slots(s.work ...);    // one pass over every work item
//   for each item with wants_logits:   // the sequence's next token was sampled
//       sched.append(seq, token)  or  sched.finish(seq)
//
// A sequence holds every id it knows (prompt, then each sampled token) and how many of them its cache holds
// (n_cached); a step feeds ids[n_cached, n_cached + k). States:
//   Waiting     queued in arrival order (a preempted sequence goes back to the head); no slot, no blocks
//   Prefilling  admitted: owns a slot and KV blocks, its prompt is being fed in chunks
//   Decoding    its prompt is in the cache: feeds its last sampled id, one per step
//   Finished    retired by finish() or cancel(): its slot and blocks are free at once
//
// Each step, in order:
//   1. every running sequence returns the sliding-window blocks it no longer reads (KvBlockAllocator::trim);
//   2. every decoding sequence (oldest admission first) gets its 1 token, before any prompt;
//   3. waiting sequences are admitted in arrival order while a slot is free and the pool holds the blocks the
//      whole sequence would need (KvBlockAllocator::blocks_for), sequences preempted in this step excepted;
//   4. prefilling sequences (oldest first) get chunks of at most the token budget left (less the decodes,
//      with one_pass_steps), so a long prompt never stalls the decodes: it advances by what the budget
//      leaves each step.
//
// Preemption (the pool cannot grow a sequence): the most recently admitted running sequence gives up its
// slot and blocks and goes back to the head of the queue with every id it knows, prompt and generated ones;
// readmitted, it feeds them all again as a prompt (recompute, as vLLM does; no swap space). The newest is
// chosen because it has the least work to recompute and the oldest requests keep their latency: the oldest
// running sequence always makes progress, and since the pool holds at least one full context (checked at
// construction) nothing deadlocks. A decode that cannot grow preempts the newest (itself, when it is the
// newest). A prompt chunk is cut to what the free blocks hold; when nothing fits it preempts the newest
// prefilling sequence admitted after it, else it waits for the next step.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "runtime/kv_blocks.h"

namespace markbase {

struct SchedulerLimits {
    int max_sequences = 4;  // running at once; slots are 0 .. max_sequences - 1
    int max_queue = 64;     // waiting beyond the free slots; more are refused
    // Prompt ids one step feeds (chunked prefill), beside one decode id of every decoding sequence: a prompt
    // longer than this is fed in chunks of it, so a long prompt never holds the decodes up for more than
    // one chunk's pass.
    int step_token_budget = 512;
    // The backend runs a step's prompt chunks and decode tokens as one pass over the weights (the CUDA
    // backend's mixed steps, SlotBackend::one_pass_rows): the decodes count against the budget, so a step's
    // ids never exceed it (vLLM's max_num_batched_tokens; then at least max_sequences, else
    // markbase::Error), and every prompt may be cut to what is left. Otherwise each prompt chunk is a pass of
    // its own: the budget is the prompts', and only a step's first prompt is cut.
    bool one_pass_steps = false;
    int64_t ctx_size = 4096;  // positions one sequence may hold
};

enum class SeqState { Waiting, Prefilling, Decoding, Finished };
const char* seq_state_name(SeqState s);

// One sequence's share of a step: feed ids at positions pos0 ... into slot `slot` (pos0 == 0: the slot's
// cache must be emptied first). wants_logits: the last id is the sequence's newest, so its logits give the
// next token and the driver must append() or finish() it before the next schedule().
struct StepWork {
    uint64_t seq = 0;
    int slot = 0;
    int64_t pos0 = 0;
    std::vector<int> ids;
    bool wants_logits = false;
};

struct Step {
    std::vector<StepWork> work;       // decodes first, then prompt chunks
    std::vector<uint64_t> admitted;   // sequences admitted in this step
    std::vector<uint64_t> preempted;  // sequences sent back to the queue in this step
    int64_t tokens() const;           // ids fed in this step
};

class Scheduler {
  public:
    // kv: the pool's shape; it must hold one sequence of ctx_size positions (throws markbase::Error).
    Scheduler(const SchedulerLimits& limits, const KvBlockOptions& kv);

    // Whether a new request must be refused: waiting already fills the free slots plus max_queue.
    static bool queue_full(int64_t waiting, int64_t running, const SchedulerLimits& limits);
    // Queues a sequence (ids: its prompt, 1 <= size <= ctx_size, else markbase::Error). Returns false (and
    // queues nothing) when queue_full(); ids must be unique among live sequences (std::logic_error).
    bool add(uint64_t seq, std::vector<int> ids);

    Step schedule();
    // The token sampled from seq's logits; it is fed in the next step. A sequence already holding ctx_size
    // ids cannot take one more (std::logic_error): the driver finishes it ("length").
    void append(uint64_t seq, int id);
    // Retires seq (done, or failed): frees its slot and blocks now. Unknown ids are ignored.
    void finish(uint64_t seq);
    // Removes seq wherever it is (waiting or running), freeing its slot and blocks now. false when unknown.
    bool cancel(uint64_t seq);

    SeqState state(uint64_t seq) const;               // Finished for a retired or unknown id
    const std::vector<int>* ids(uint64_t seq) const;  // nullptr for a retired or unknown id
    int64_t n_cached(uint64_t seq) const;             // 0 for a waiting, retired or unknown id
    int64_t waiting() const { return static_cast<int64_t>(queue_.size()); }
    int64_t running() const { return static_cast<int64_t>(running_.size()); }
    bool idle() const { return queue_.empty() && running_.empty(); }
    const KvBlockAllocator& blocks() const { return kv_; }
    const SchedulerLimits& limits() const { return limits_; }

  private:
    struct Seq {
        uint64_t id = 0;
        std::vector<int> ids;
        int64_t n_cached = 0;
        SeqState state = SeqState::Waiting;
        int slot = -1;
        uint64_t admitted_at = 0;  // admission counter: larger is newer
    };
    Seq* find_running(uint64_t seq);
    std::vector<uint64_t> running_in_admission_order(SeqState state) const;
    // The newest running sequence (in `state` only when prefilling_only) admitted after `after`; 0 if none.
    bool newest_running(bool prefilling_only, uint64_t after, uint64_t* seq) const;
    void preempt(uint64_t seq, Step& step);
    void release(Seq& s);
    void schedule_decodes(Step& step);
    void admit(Step& step);
    void schedule_prompts(Step& step, int64_t& budget);
    void add_work(Seq& s, int64_t n, Step& step);

    SchedulerLimits limits_;
    KvBlockAllocator kv_;
    std::deque<Seq> queue_;            // waiting, head first
    std::map<uint64_t, Seq> running_;  // prefilling and decoding
    std::vector<int> free_slots_;      // a stack; the lowest slot is taken first
    uint64_t admissions_ = 0;
    std::vector<uint64_t> awaiting_;  // wants_logits sequences not yet appended or finished
};

}  // namespace markbase
