// Whether a tokenizer belongs to a model: every id it can produce or decode must have an embedding row.
// Checked where both are loaded, so a mismatched tokenizer.json is reported at load and not when the first
// out-of-range id reaches the embedding or the sampler.
#pragma once

#include <string>

#include "model/config.h"

namespace markbase {

class Tokenizer;
struct Checkpoint;

// Throws markbase::Error naming the tokenizer's file, its largest id (and that token) and the model's
// vocab_size (named as `config_name` says) when the tokenizer's ids do not all fit the vocabulary.
void check_tokenizer_fits(const Tokenizer& tokenizer, const ModelConfig& config,
                          const std::string& config_name = "config.json");
// The same against a loaded checkpoint (its dir/config.json).
void check_tokenizer_fits(const Tokenizer& tokenizer, const Checkpoint& checkpoint);

}  // namespace markbase
