// The text a client sees of one reply, token by token: the tokenizer's streaming decoder (UTF-8 safe: a
// character split over byte-fallback tokens is held until complete) followed by the stop strings' hold-back.
//
// Hold-back rule: after each token, the longest tail of the undelivered text that is a proper prefix of some
// stop string is kept back, everything before it is delivered. A stop string therefore can only begin in
// text not yet delivered, so it is found however the tokens split it, and it is never delivered: the text
// up to its first byte is, and nothing after it. The tail kept back starts where a stop string starts, so
// it never splits a UTF-8 character. At the end (no stop string found) everything held is delivered.
#pragma once

#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace markbase::server {

class ReplyText {
  public:
    // Empty stop strings are ignored. Special tokens (eos, <turn|>) are not shown (skip_special).
    ReplyText(const Tokenizer& tok, std::vector<std::string> stop);

    // The text this token makes safe to deliver. *stopped: a stop string completed; the text returned ends
    // where it starts, and every later push() and finish() gives "".
    std::string push(int id, bool* stopped);
    // The reply ends: what is still held, cut at a stop string should one complete with the decoder's last
    // bytes (then *stopped, when given, is set).
    std::string finish(bool* stopped = nullptr);
    bool stopped() const { return stopped_; }

  private:
    std::string release(bool final, bool* stopped);

    StreamDecoder dec_;
    std::vector<std::string> stop_;
    std::string held_;  // decoded, not yet delivered
    bool stopped_ = false;
};

}  // namespace markbase::server
