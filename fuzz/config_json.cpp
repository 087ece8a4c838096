// config.json: any text either parses into a config or throws markbase::Error; nothing else may escape. The
// same text's quantization_config too (loading/quantization_config.h), its targets and ignore patterns
// matched against module names of the kinds a checkpoint has.
#include "loading/config_json.h"

#include "fuzz/fuzz_input.h"
#include "loading/quantization_config.h"
#include "model/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(markbase::fuzz::as_text(data, size));
    try {
        markbase::parse_config_text(text, "config.json");
    } catch (const markbase::Error&) {
    }
    try {
        if (const auto qc = markbase::parse_quantization_config(text, "config.json")) {
            for (const char* m :
                 {"model.language_model.layers.0.self_attn.q_proj", "model.layers.29.experts.127.down_proj",
                  "model.layers.3.router.proj", "lm_head", ""})
                qc->quantizes(m);
        }
    } catch (const markbase::Error&) {
    }
    return 0;
}
