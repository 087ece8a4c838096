#include "runtime/progress.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "runtime/timing.h"

namespace markbase {

ByteProgress::ByteProgress(std::string verb, uint64_t total, std::FILE* out, int force_bar)
    : verb_(std::move(verb)), total_(total), out_(out), t0_(now_s()) {
    bar_ = out_ && (force_bar >= 0 ? force_bar != 0 : ::isatty(::fileno(out_)) != 0);
}

std::string ByteProgress::bar_line(uint64_t done, uint64_t total, double seconds, int width) {
    const double frac = total ? std::min(1.0, static_cast<double>(done) / static_cast<double>(total)) : 1.0;
    const int filled = static_cast<int>(frac * width);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.append(static_cast<size_t>(width - filled), '.');
    const double gbs = seconds > 0 ? static_cast<double>(done) / seconds / 1e9 : 0.0;
    char tail[96];
    if (gbs > 0 && done < total) {
        const double eta = static_cast<double>(total - done) / (gbs * 1e9);
        std::snprintf(tail, sizeof tail, " %5.1f/%.1f GB %6.2f GB/s ETA %4.1f s", done / 1e9, total / 1e9,
                      gbs, eta);
    } else {
        std::snprintf(tail, sizeof tail, " %5.1f/%.1f GB %6.2f GB/s", done / 1e9, total / 1e9, gbs);
    }
    return "[" + bar + "]" + tail;
}

std::string ByteProgress::summary_line(const std::string& verb, uint64_t bytes, double seconds) {
    char s[128];
    const double gbs = seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0;
    std::snprintf(s, sizeof s, "%s %.1f GB in %.2f s, %.1f GB/s", verb.c_str(), bytes / 1e9, seconds, gbs);
    return s;
}

void ByteProgress::update(uint64_t done) {
    if (!bar_) return;
    const double t = now_s();
    if (last_draw_ >= 0 && t - last_draw_ < 0.1 && done < total_) return;
    last_draw_ = t;
    std::fprintf(out_, "\r%s %s", verb_.c_str(), bar_line(done, total_, t - t0_, 30).c_str());
    std::fflush(out_);
    drawn_ = true;
}

double ByteProgress::finish(uint64_t bytes) {
    const double s = now_s() - t0_;
    if (!out_) return s;
    if (drawn_) std::fputs("\r\033[K", out_);  // erase the bar line
    std::fprintf(out_, "%s\n", summary_line(verb_, bytes, s).c_str());
    std::fflush(out_);
    return s;
}

}  // namespace markbase
