// tokenizer.json: load it, then encode a fixed text and decode every id it claims to have.
#include "fuzz/fuzz_input.h"
#include "model/error.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        const markbase::Tokenizer tok = markbase::Tokenizer::from_json(markbase::fuzz::as_text(data, size));
        const std::vector<int> ids = tok.encode("Hello world, <start_of_turn>user\n\xc3\xa9t\xc3\xa9 12345 \t\n");
        std::vector<int> all;
        for (int id = 0; id < tok.vocab_size() && id < 512; ++id) all.push_back(id);
        markbase::StreamDecoder stream(tok);
        for (int id : all) stream.push(id);
        stream.flush();
        (void)tok.decode(ids);
        (void)tok.decode(all, true);
    } catch (const markbase::Error&) {
    }
    return 0;
}
