// markbase chat -m DIR : interactive multi-turn chat (needs the tokenizer).
#include "cli/commands/commands.h"
#include "model/error.h"

namespace markbase::cli {

int cmd_chat(const Args&) { throw Error("chat: needs the tokenizer, which this build does not have yet"); }

}  // namespace markbase::cli
