// markbase run -m DIR (-p TEXT | --ids 2,17,300) [-n N] [--temp T ...] [--chat] [--json]
// Prefills the prompt in batched passes, then decodes; streams text as it is generated (or prints one JSON
// object with --json); ends with a receipt on stderr. -p prepends BOS (id 2) as llama.cpp does; --chat wraps
// the text as one user turn of the Gemma 4 chat template instead.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "cli/commands/commands.h"
#include "cli/commands/model_options.h"
#include "cli/commands/output.h"
#include "model/error.h"
#include "runtime/generate.h"
#include "loading/tokenizer_fit.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/tokenizer.h"

namespace markbase::cli {

int cmd_run(const Args& args) {
    ArgReader a("run", args);
    ModelOptions mo = ModelOptions::read(a);
    auto ids_arg = a.value({"--ids"});
    auto prompt_arg = a.value({"-p", "--prompt"});
    GenerateOptions go;
    go.max_new_tokens = a.integer({"-n", "--n-predict"}, 128, -1, kIntMax);
    go.sampling = read_sampling(a, mo.model_dir);
    go.ignore_eos = a.flag({"--ignore-eos"});
    const bool as_json = a.flag({"--json"});
    const bool chat = a.flag({"--chat", "-cnv"});
    const bool think = a.flag({"--think"});
    a.finish();
    if (!ids_arg && !prompt_arg) throw Error("run: give a prompt with -p TEXT or --ids 2,17,300");
    if (ids_arg && prompt_arg) throw Error("run: give either -p or --ids, not both");
    if ((chat || think) && !prompt_arg) throw Error("run: --chat/--think need a text prompt (-p)");

    // The tokenizer is needed for text in or text out; --ids with a folder lacking tokenizer.json prints ids.
    std::optional<Tokenizer> tok;
    std::error_code no_tokenizer;  // a folder without one (or unreadable) prints ids; Tokenizer::load says why
    if (prompt_arg || std::filesystem::exists(std::filesystem::path(mo.model_dir) / "tokenizer.json", no_tokenizer))
        tok = Tokenizer::load(mo.model_dir);
    std::vector<int> prompt;
    if (prompt_arg && chat) {
        prompt = tok->encode(render_gemma4_chat({{"user", *prompt_arg}}, true, think));
    } else if (prompt_arg) {
        prompt = {tok->bos_id() >= 0 ? tok->bos_id() : 2};
        tok->encode_append(*prompt_arg, prompt);
    } else {
        prompt = parse_id_list(*ids_arg, "--ids");
    }

    LoadedModel lm = load_model(mo);
    if (tok) check_tokenizer_fits(*tok, *lm.checkpoint);
    // before the prompt's text is echoed: a refused prompt leaves stdout empty
    check_prompt(*lm.backend, prompt, lm.backend->n_past());
    go.stop_ids = stop_ids_for(lm);
    if (chat)
        for (int id : default_stop_ids()) go.stop_ids.push_back(id);

    std::vector<int> out;
    std::optional<StreamDecoder> stream;
    if (tok) stream.emplace(*tok);
    if (!as_json && tok && prompt_arg && !chat) std::fputs(prompt_arg->c_str(), stdout);
    GenerateStats st = generate(
        *lm.backend, prompt, go,
        [&](int id) {
            if (as_json) return true;
            const bool is_stop = std::find(go.stop_ids.begin(), go.stop_ids.end(), id) != go.stop_ids.end();
            if (stream) {
                if (!is_stop || go.ignore_eos) std::fputs(stream->push(id).c_str(), stdout);
            } else {
                std::printf("%d ", id);
            }
            flush_stdout();  // stops the run at once when the text cannot be written
            return true;
        },
        &out);
    if (as_json) {
        nlohmann::json j;
        j["ids"] = out;
        j["prompt_tokens"] = st.prompt_tokens;
        j["stop_reason"] = st.stop_reason;
        if (tok) j["text"] = tok->decode(out);
        // invalid UTF-8 (a sampled half character) is replaced rather than aborting the dump
        std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
        if (stream) std::fputs(stream->flush().c_str(), stdout);
        std::printf("\n");
    }
    flush_stdout();  // the text ends before the receipt starts, also when both go to one pipe
    const ModelCounts counts = count_params(lm.backend->config());
    std::fprintf(stderr, "[%s] load %.2f s | %s | stop: %s\n", lm.backend->name().c_str(), lm.load_s,
                 format_receipt(st, counts.bytes_per_token).c_str(), st.stop_reason.c_str());
    return 0;
}

}  // namespace markbase::cli
