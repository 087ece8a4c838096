// config.json: any text either parses into a config or throws markbase::Error; nothing else may escape.
#include "fuzz/fuzz_input.h"
#include "loading/config_json.h"
#include "model/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        markbase::parse_config_text(std::string(markbase::fuzz::as_text(data, size)), "config.json");
    } catch (const markbase::Error&) {
    }
    return 0;
}
