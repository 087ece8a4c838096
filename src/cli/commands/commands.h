// The CLI's subcommands. Each takes the arguments after the subcommand name and returns the process exit
// code; a markbase::Error escaping one is printed as "error: ..." by main with exit code 1.
#pragma once

#include <string>
#include <vector>

namespace markbase::cli {

using Args = std::vector<std::string>;

int cmd_run(const Args& args);         // run.cpp: one prompt (ids or text), streamed
int cmd_chat(const Args& args);        // chat.cpp: interactive multi-turn session
int cmd_logits(const Args& args);      // logits.cpp: full forward over ids, logits to .npy
int cmd_inspect(const Args& args);     // inspect.cpp: variant, layer plan, parameters, bytes per token
int cmd_bench(const Args& args);       // bench.cpp: prefill / decode receipt
int cmd_bench_load(const Args& args);  // bench_load.cpp: checkpoint load speed vs raw read speed
int cmd_perplexity(const Args& args);  // perplexity.cpp: perplexity of a text file
int cmd_serve(const Args& args);       // serve.cpp: OpenAI-compatible HTTP server
int cmd_tokenize(const Args& args);    // tokenize.cpp: text -> JSON array of ids
int cmd_detokenize(const Args& args);  // tokenize.cpp: JSON array of ids -> text
int cmd_version(const Args& args);     // version.cpp: version, commit and build settings

}  // namespace markbase::cli
