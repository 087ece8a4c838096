#include "server/reply_text.h"

#include <algorithm>

namespace markbase::server {

ReplyText::ReplyText(const Tokenizer& tok, std::vector<std::string> stop)
    : dec_(tok, /*skip_special=*/true), stop_(std::move(stop)) {
    stop_.erase(std::remove(stop_.begin(), stop_.end(), std::string()), stop_.end());
}

std::string ReplyText::push(int id, bool* stopped) {
    *stopped = false;
    if (stopped_) return {};
    held_ += dec_.push(id);
    return release(false, stopped);
}

std::string ReplyText::finish(bool* stopped) {
    bool s = false;
    std::string out;
    if (!stopped_) {
        held_ += dec_.flush();
        out = release(true, &s);
    }
    if (stopped) *stopped = s;
    return out;
}

std::string ReplyText::release(bool final, bool* stopped) {
    size_t first = std::string::npos;
    for (const std::string& s : stop_) first = std::min(first, held_.find(s));
    if (first != std::string::npos) {
        std::string out = held_.substr(0, first);
        held_.clear();
        stopped_ = *stopped = true;
        return out;
    }
    size_t keep = 0;  // the longest tail of held_ that a stop string starts with
    if (!final)
        for (const std::string& s : stop_)
            for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k)
                if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
                    keep = k;
                    break;
                }
    std::string out = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return out;
}

}  // namespace markbase::server
