// generation_config.json, read from a model folder as the CLI reads it.
#include "fuzz/fuzz_input.h"
#include "loading/generation_config.h"
#include "model/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    markbase::fuzz::write_input("generation_config.json", data, size);
    try {
        markbase::read_generation_config(markbase::fuzz::scratch_dir());
    } catch (const markbase::Error&) {
    }
    return 0;
}
