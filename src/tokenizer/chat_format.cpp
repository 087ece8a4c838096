#include "tokenizer/chat_format.h"

#include "model/error.h"
#include "tokenizer/utf8.h"

namespace markbase {

namespace {

constexpr std::string_view kOpenChannel = "<|channel>";
constexpr std::string_view kCloseChannel = "<channel|>";

std::string trimmed(std::string_view s) {
    return std::string(tok::python_strip(s));
}

}  // namespace

std::string strip_thinking(std::string_view text) {
    // Jinja: for part in text.split('<channel|>'): keep part.split('<|channel>')[0] if '<|channel>' in part
    // else part
    std::string result;
    std::size_t start = 0;
    while (true) {
        const std::size_t close = text.find(kCloseChannel, start);
        const std::string_view part =
            text.substr(start, close == std::string_view::npos ? std::string_view::npos : close - start);
        result += part.substr(0, part.find(kOpenChannel));  // npos keeps the whole part
        if (close == std::string_view::npos) break;
        start = close + kCloseChannel.size();
    }
    return trimmed(result);
}

std::string render_gemma4_chat(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                               bool enable_thinking) {
    // Mirrors chat_template.jinja line by line for string contents; see the header for the rules.
    if (messages.empty())
        throw Error("cannot render an empty conversation: the Gemma 4 template needs at least one message");
    std::string out = "<bos>";
    std::size_t first = 0;
    const bool system_first = messages[0].role == "system" || messages[0].role == "developer";
    if (enable_thinking || system_first) {
        out += "<|turn>system\n";
        if (enable_thinking) out += "<|think|>";
        if (system_first) {
            out += trimmed(messages[0].content);
            first = 1;
        }
        out += "<turn|>\n";
    }
    for (std::size_t i = first; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        const std::string role = m.role == "assistant" ? "model" : m.role;
        out += "<|turn>" + role + "\n";
        out += role == "model" ? strip_thinking(m.content) : trimmed(m.content);
        out += "<turn|>\n";
    }
    if (add_generation_prompt) {
        out += "<|turn>model\n";
        if (!enable_thinking) out += "<|channel>thought\n<channel|>";
    }
    return out;
}

std::vector<int> default_stop_ids() {
    return {1, 106, 50};
}

ModelReply split_model_reply(std::string_view text) {
    ModelReply reply;
    std::string answer;
    std::size_t start = 0;
    while (true) {
        const std::size_t open = text.find(kOpenChannel, start);
        if (open == std::string_view::npos) {
            answer += text.substr(start);
            break;
        }
        answer += text.substr(start, open - start);
        std::size_t body = open + kOpenChannel.size();
        const std::size_t close = text.find(kCloseChannel, body);
        std::string_view inner =
            text.substr(body, close == std::string_view::npos ? std::string_view::npos : close - body);
        if (inner.substr(0, 8) == "thought\n") inner.remove_prefix(8);  // the channel's name line
        if (!reply.thinking.empty()) reply.thinking += "\n";
        reply.thinking += tok::python_strip(inner);
        if (close == std::string_view::npos) break;  // still thinking: no answer yet
        start = close + kCloseChannel.size();
    }
    reply.answer = trimmed(answer);
    return reply;
}

}  // namespace markbase
