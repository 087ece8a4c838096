// markbase logits -m DIR --ids 2,17,300 -o out.npy : one full forward over the ids, float32 [n_ids, vocab].
#include <cmath>
#include <cstdio>
#include <vector>

#include "cli/commands/commands.h"
#include "cli/commands/model_options.h"
#include "loading/npy.h"
#include "model/error.h"

namespace markbase::cli {

int cmd_logits(const Args& args) {
    ArgReader a("logits", args);
    ModelOptions mo = ModelOptions::read(a);
    const std::string ids_text = a.required({"--ids"}, "ID,ID,...");
    std::string out = a.required({"-o", "--output"}, "FILE.npy");
    a.finish();  // before the ids are parsed: with --help they may be absent
    std::vector<int> ids = parse_id_list(ids_text, "--ids");
    if (mo.backend.ctx_size < static_cast<int64_t>(ids.size()))
        mo.backend.ctx_size = static_cast<int64_t>(ids.size());
    LoadedModel lm = load_model(mo);
    const int64_t V = lm.backend->config().vocab_size;
    std::vector<float> logits(ids.size() * V);
    lm.backend->eval(ids.data(), static_cast<int64_t>(ids.size()), logits.data(), true);
    for (size_t i = 0; i < logits.size(); ++i)
        if (!std::isfinite(logits[i]))
            throw Error("logits: non-finite value at token " + std::to_string(i / V) + ", id " +
                        std::to_string(i % V));
    write_npy_f32(out, logits.data(), {static_cast<int64_t>(ids.size()), V});
    std::fprintf(stderr, "wrote %s: [%zu, %lld] float32\n", out.c_str(), ids.size(),
                 static_cast<long long>(V));
    return 0;
}

}  // namespace markbase::cli
