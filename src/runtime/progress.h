// Progress for long byte-moving jobs (loading a checkpoint): a bar on a terminal (bytes, GB/s, ETA), redrawn
// at most ten times a second and quiet when the stream is not a TTY (logs and pipes get no carriage-return
// noise), plus a one-line summary that is always printed ("loaded 50.5 GB in 2.3 s, 22.0 GB/s").
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace markbase {

class ByteProgress {
  public:
    // out: where to draw (stderr by default; nullptr silences everything). The bar shows only when
    // isatty(fileno(out)); `force_bar` overrides for tests.
    ByteProgress(std::string verb, uint64_t total, std::FILE* out = stderr, int force_bar = -1);
    void update(uint64_t done);
    // Clears the bar and prints the summary line; returns the seconds since construction.
    double finish(uint64_t bytes);

    // The pieces, pure so tests can pin them.
    static std::string bar_line(uint64_t done, uint64_t total, double seconds, int width);
    static std::string summary_line(const std::string& verb, uint64_t bytes, double seconds);

  private:
    std::string verb_;
    uint64_t total_;
    std::FILE* out_;
    bool bar_;
    double t0_, last_draw_ = -1;
    bool drawn_ = false;
};

}  // namespace markbase
