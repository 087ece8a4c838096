// markbase chat -m DIR [-sys TEXT] [--think] [sampling flags]
// An interactive multi-turn session on the Gemma 4 chat template. Each turn re-renders the whole conversation
// (as the template defines it), keeps the longest cached prefix it shares and feeds only the rest; when the
// cache cannot roll back that far it prefills from scratch.
// Ctrl-D or /exit ends; /reset starts a new conversation. A tok/s line follows each reply on stderr. A line
// that cannot be taken (invalid UTF-8, too long for the context even alone) is refused on stderr, "[line not
// accepted: ...]", and the session goes on with its history as it was.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands/commands.h"
#include "cli/commands/model_options.h"
#include "cli/commands/output.h"
#include "loading/tokenizer_fit.h"
#include "model/error.h"
#include "runtime/generate.h"
#include "runtime/prefix_reuse.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/tokenizer.h"

namespace markbase::cli {

namespace {

// What a user line becomes once it is accepted: the conversation with it, its rendered ids, and whether it
// starts the conversation over (the whole history no longer fits the context).
struct Turn {
    std::vector<ChatMessage> history;
    std::vector<int> ids;
    bool restarts = false;
};

// Renders the conversation with `line` added and checks it against the model, touching neither the
// conversation nor the backend. Throws markbase::Error when the line cannot be taken: text the tokenizer
// refuses (invalid UTF-8), ids past the model's vocabulary, or a line too long for the context on its own.
Turn plan_turn(const std::vector<ChatMessage>& history, const std::string& system, const std::string& line,
               bool think, const Tokenizer& tok, const Backend& be) {
    Turn t;
    t.history = history;
    t.history.push_back({"user", line});
    t.ids = tok.encode(render_gemma4_chat(t.history, true, think));
    // room for the prompt and at least one generated token
    if (static_cast<int64_t>(t.ids.size()) + 1 >= be.ctx_size()) {
        t.history = {t.history.back()};
        if (!system.empty()) t.history.insert(t.history.begin(), {"system", system});
        t.ids = tok.encode(render_gemma4_chat(t.history, true, think));
        t.restarts = true;
        if (static_cast<int64_t>(t.ids.size()) + 1 >= be.ctx_size())
            throw Error("it needs " + std::to_string(t.ids.size()) +
                        " tokens in a new conversation, the context holds " + std::to_string(be.ctx_size()) +
                        " (set --ctx-size)");
    }
    check_prompt(be, t.ids, 0);
    return t;
}

}  // namespace

int cmd_chat(const Args& args) {
    ArgReader a("chat", args);
    ModelOptions mo = ModelOptions::read(a);
    GenerateOptions go;
    go.max_new_tokens = a.integer({"-n", "--n-predict"}, 1024, -1, kIntMax);
    go.sampling = read_sampling(a, mo.model_dir);
    const std::string system = a.value_or({"-sys", "--system-prompt"}, "");
    const bool think = a.flag({"--think"});
    a.finish();

    Tokenizer tok = Tokenizer::load(mo.model_dir);
    LoadedModel lm = load_model(mo);
    check_tokenizer_fits(tok, *lm.checkpoint);
    Backend& be = *lm.backend;
    go.stop_ids = stop_ids_for(lm);
    for (int id : default_stop_ids()) go.stop_ids.push_back(id);

    std::vector<ChatMessage> history;
    if (!system.empty()) history.push_back({"system", system});
    std::vector<int> cached;  // the ids whose K/V the backend holds, in order
    std::fprintf(stderr, "markbase chat: %s on %s. Ctrl-D or /exit ends, /reset clears the conversation.\n",
                 mo.model_dir.c_str(), be.name().c_str());
    std::string line;
    while (true) {
        std::fputs("> ", stdout);
        flush_stdout();
        if (!std::getline(std::cin, line) || line == "/exit") break;
        if (line == "/reset") {
            history.resize(system.empty() ? 0 : 1);
            be.reset();
            cached.clear();
            continue;
        }
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        Turn turn;
        try {
            turn = plan_turn(history, system, line, think, tok, be);
        } catch (const Error& e) {  // the session and its history go on without the line
            std::fprintf(stderr, "[line not accepted: %s]\n", e.what());
            continue;
        }
        if (turn.restarts) {
            std::fprintf(stderr, "[context full (%lld tokens): starting a new conversation]\n",
                         static_cast<long long>(be.ctx_size()));
            be.reset();
            cached.clear();
        }
        history = std::move(turn.history);
        // Reuse the cached prefix the new prompt shares (the template re-renders earlier replies, e.g.
        // without their thought channel, so the shared part usually ends where the last reply began).
        const std::vector<int> fresh = reuse_cached_prefix(be, cached, turn.ids);

        StreamDecoder stream(tok);
        std::vector<int> reply;
        GenerateStats st = generate(
            be, fresh, go,
            [&](int id) {
                if (std::find(go.stop_ids.begin(), go.stop_ids.end(), id) == go.stop_ids.end())
                    std::fputs(stream.push(id).c_str(), stdout);
                flush_stdout();
                return true;
            },
            &reply);
        std::fputs(stream.flush().c_str(), stdout);
        std::fputs("\n", stdout);

        cached = turn.ids;
        cached.insert(cached.end(), reply.begin(),
                      reply.end() - (reply.empty() ? 0 : 1));  // last id not evaluated
        if (!reply.empty() &&
            std::find(go.stop_ids.begin(), go.stop_ids.end(), reply.back()) != go.stop_ids.end())
            reply.pop_back();
        history.push_back({"assistant", tok.decode(reply)});
        flush_stdout();
        std::fprintf(stderr, "[%s]\n", format_receipt(st).c_str());
    }
    std::fputs("\n", stdout);
    return 0;
}

}  // namespace markbase::cli
