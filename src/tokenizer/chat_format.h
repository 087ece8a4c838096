// Gemma 4 chat prompts, rendered exactly as the shipped chat_template.jinja (tests/data/tokenizer/gemma4/)
// renders text-only conversations through HF apply_chat_template. No Jinja interpreter: the template's
// text-only paths are written out in chat_format.cpp and checked against transformers' output
// (tests/tokenizer/goldens_test.cpp, ChatGoldens). Tool declarations, tool calls and images/audio are not rendered
// here.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace markbase {

struct ChatMessage {
    std::string
        role;  // "system" / "developer" (first message only), "user", "assistant" (written as "model")
    std::string content;
};

// The full prompt text, beginning with "<bos>". Encode it with Tokenizer::encode (which turns "<bos>",
// "<|turn>" and the other special strings into their ids); do not prepend BOS again.
//   - a first message with role system/developer, or enable_thinking, opens a system turn; thinking puts
//   "<|think|>"
//     at its very start;
//   - contents are trimmed as Python's str.strip(); assistant/model contents also lose every
//     "<|channel>...<channel|>" block (the model's earlier thinking is not fed back);
//   - add_generation_prompt appends "<|turn>model\n", and, when thinking is off, an empty thought channel
//     "<|channel>thought\n<channel|>" so the model answers directly.
// Throws markbase::Error for an empty conversation (the template fails on it too).
std::string render_gemma4_chat(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                               bool enable_thinking = false);

// Ids that end a Gemma 4 reply: <eos>=1, <turn|>=106, <|tool_response>=50 (generation_config's eos list).
std::vector<int> default_stop_ids();

// The template's strip_thinking macro: drops each "<|channel>...<channel|>" block, then trims.
std::string strip_thinking(std::string_view text);

// A finished model reply split into its thinking and its answer, for display:
// "<|channel>thought\nT<channel|>A" gives {T, A}. Without a channel block the whole text is the answer. Both
// parts are trimmed.
struct ModelReply {
    std::string thinking;
    std::string answer;
};
ModelReply split_model_reply(std::string_view text);

}  // namespace markbase
