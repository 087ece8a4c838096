#include "loading/tokenizer_fit.h"

#include "loading/checkpoint.h"
#include "loading/json_excerpt.h"
#include "model/error.h"
#include "tokenizer/tokenizer.h"

namespace markbase {

void check_tokenizer_fits(const Tokenizer& tokenizer, const ModelConfig& config,
                          const std::string& config_name) {
    const int ids = tokenizer.vocab_size();
    if (ids <= config.vocab_size) return;
    const int largest = ids - 1;
    throw Error(tokenizer.origin() + ": the tokenizer has ids up to " + std::to_string(largest) + " (\"" +
                text_excerpt(tokenizer.token_text(largest), 40) + "\") but " + config_name +
                " says vocab_size " + std::to_string(config.vocab_size) + " (ids 0.." +
                std::to_string(config.vocab_size - 1) + "): this tokenizer does not belong to this model");
}

void check_tokenizer_fits(const Tokenizer& tokenizer, const Checkpoint& checkpoint) {
    check_tokenizer_fits(tokenizer, checkpoint.config, (checkpoint.dir / "config.json").string());
}

}  // namespace markbase
