// markbase perplexity [-m DIR] -f FILE [--window N]
// Perplexity of a text file (llama.cpp's llama-perplexity): the text is tokenized without special tokens and
// scored in non-overlapping windows of N tokens, each starting with BOS.
#include "runtime/perplexity.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/commands/commands.h"
#include "cli/commands/model_options.h"
#include "loading/tokenizer_fit.h"
#include "model/error.h"
#include "tokenizer/tokenizer.h"

namespace markbase::cli {

int cmd_perplexity(const Args& args) {
    ArgReader a("perplexity", args);
    ModelOptions mo = ModelOptions::read(a);
    const std::string file = a.required({"-f", "--file"}, "FILE");
    const int window = a.integer({"--window", "--ctx"}, 512, 2, kIntMax);
    const int64_t max_tokens = a.integer<int64_t>({"--max-tokens"}, 0, 0, INT64_MAX);
    a.finish();
    std::ifstream f(file, std::ios::binary);
    if (!f) throw Error(file + ": cannot open");
    std::stringstream ss;
    ss << f.rdbuf();
    Tokenizer tok = Tokenizer::load(mo.model_dir);
    std::vector<int> ids = tok.encode(ss.str());
    if (max_tokens > 0 && static_cast<int64_t>(ids.size()) > max_tokens)
        ids.resize(static_cast<size_t>(max_tokens));
    mo.backend.ctx_size = std::max<int64_t>(mo.backend.ctx_size, window);
    LoadedModel lm = load_model(mo);
    check_tokenizer_fits(tok, *lm.checkpoint);
    const PerplexityResult r = perplexity(*lm.backend, ids, window, tok.bos_id() >= 0 ? tok.bos_id() : 2);
    std::printf("perplexity %.6f (mean NLL %.6f over %lld tokens, %d windows of <= %d)\n", r.ppl, r.mean_nll,
                static_cast<long long>(r.predicted), r.windows, window);
    return 0;
}

}  // namespace markbase::cli
