// markbase run -m DIR (--ids 2,17,300 | -p TEXT) -n 12 [--temp 0] [--json]
// Prefills the prompt in batched passes, then decodes; streams text as it is generated (or prints one JSON
// object with --json); ends with a receipt on stderr.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "cli/commands/commands.h"
#include "cli/commands/model_options.h"
#include "model/error.h"
#include "runtime/generate.h"

namespace markbase::cli {

int cmd_run(const Args& args) {
    ArgReader a("run", args);
    ModelOptions mo = ModelOptions::read(a);
    auto ids_arg = a.value({"--ids"});
    auto prompt_arg = a.value({"-p", "--prompt"});
    GenerateOptions go;
    go.max_new_tokens = static_cast<int>(a.integer({"-n", "--n-predict"}, 128));
    go.sampling = read_sampling(a);
    go.ignore_eos = a.flag({"--ignore-eos"});
    const bool as_json = a.flag({"--json"});
    a.finish();
    if (!ids_arg && !prompt_arg) throw Error("run: give a prompt with -p TEXT or --ids 2,17,300");
    if (ids_arg && prompt_arg) throw Error("run: give either -p or --ids, not both");
    if (prompt_arg) throw Error("run: -p needs the tokenizer, which this build does not have yet; use --ids");
    std::vector<int> prompt = parse_id_list(*ids_arg, "--ids");

    LoadedModel lm = load_model(mo);
    go.stop_ids = lm.backend->config().stop_ids;
    std::vector<int> out;
    GenerateStats st = generate(*lm.backend, prompt, go, [&](int id) {
        if (!as_json) {
            std::printf("%d ", id);
            std::fflush(stdout);
        }
        return true;
    }, &out);
    if (as_json) {
        nlohmann::json j;
        j["ids"] = out;
        j["prompt_tokens"] = st.prompt_tokens;
        j["stop_reason"] = st.stop_reason;
        std::printf("%s\n", j.dump().c_str());
    } else {
        std::printf("\n");
    }
    const ModelCounts counts = count_params(lm.backend->config());
    std::fprintf(stderr, "[%s] load %.2f s | %s\n", lm.backend->name().c_str(), lm.load_s,
                 format_receipt(st, counts.bytes_per_token).c_str());
    return 0;
}

}  // namespace markbase::cli
