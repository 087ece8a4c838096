// The chat path on text from outside: messages (roles and contents split from the input at NUL bytes)
// rendered through the Gemma 4 template and encoded with the bundled model's tokenizer; the reply side
// (split_model_reply) and the streaming decoder on ids taken from the input.
#include <string>
#include <vector>

#include "fuzz/fuzz_input.h"
#include "model/error.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/tokenizer.h"

namespace {

const markbase::Tokenizer& tokenizer() {
    static const markbase::Tokenizer tok =
        markbase::Tokenizer::load(std::string(MARKBASE_SOURCE_DIR) + "/models/default/tokenizer.json");
    return tok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view text = markbase::fuzz::as_text(data, size);
    const markbase::Tokenizer& tok = tokenizer();
    std::vector<markbase::ChatMessage> messages;
    static const char* const kRoles[] = {"system", "user", "assistant", "model", "developer", "tool"};
    size_t start = 0;
    for (size_t i = 0; i <= text.size(); ++i) {
        if (i < text.size() && text[i] != '\0') continue;
        const std::string part(text.substr(start, i - start));
        messages.push_back({kRoles[(messages.size() + part.size()) % 6], part});
        start = i + 1;
    }
    try {
        for (bool thinking : {false, true}) {
            const std::string prompt = markbase::render_gemma4_chat(messages, true, thinking);
            (void)tok.encode(prompt);
        }
    } catch (const markbase::Error&) {
    }
    (void)markbase::split_model_reply(text);
    (void)markbase::strip_thinking(text);
    std::vector<int> ids;
    for (size_t i = 0; i + 1 < size; i += 2) ids.push_back((data[i] | data[i + 1] << 8) % tok.vocab_size());
    markbase::StreamDecoder stream(tok);
    std::string streamed;
    for (int id : ids) streamed += stream.push(id);
    streamed += stream.flush();
    if (streamed != tok.decode(ids)) __builtin_trap();  // the streaming contract
    return 0;
}
