// The serving engine of server/engine.h over a SlotBackend: one scheduler thread that owns the Scheduler,
// the backend and every running request; submit(), cancel() and metrics() only touch a mutex-protected
// inbox and a metrics snapshot, so no HTTP thread ever waits for a model step.
//
// Each step: drain the inbox (new requests, cancellations), Scheduler::schedule(), one eval_slots() over the
// step's work, then for each sequence whose logits came back: sample with its own Sampler (seeded by the
// request: same seed, same ids), report the token (server/reply_text.h: UTF-8 and stop-string hold-back;
// server/logprobs.h: what logprob means), and finish it or append the token for the next step.
//
// Endings: a stop id (unless ignore_eos) ends with "stop" and is not shown; a stop string ends with "stop",
// the text up to it shown; max_tokens, or a token that no longer fits the context (it is shown, but the
// context cannot take it), end with "length" exactly where generate() stops. A backend error fails every
// request of that step; a sampler or sink error fails its own request.
#pragma once

#include <memory>

#include "model/config.h"
#include "runtime/slot_backend.h"
#include "server/engine.h"
#include "tokenizer/tokenizer.h"

namespace markbase::server {

// `be` and `tok` must outlive the engine. limits.max_sequences <= be.slots() and limits.ctx_size <=
// be.ctx_size(), else markbase::Error; the scheduler thread starts here.
std::unique_ptr<Engine> make_engine(SlotBackend& be, const Tokenizer& tok, const ModelConfig& config,
                                    EngineLimits limits);

}  // namespace markbase::server
