// A checkpoint truncated while its mapping is in use: reading a page past the new end raises SIGBUS. The
// process must still end with a message naming the file (exit code 1), not a bare "Bus error"; a SIGBUS
// elsewhere keeps its default meaning. Each case runs in a child process (a gtest death test).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <vector>

#include "loading/safetensors.h"
#include "support/tiny_models.h"

namespace markbase {
namespace {

namespace fs = std::filesystem;

// One BF16 tensor "w" of 64 Ki elements (128 KiB: many pages past the header).
fs::path write_file(const fs::path& dir) {
    std::vector<uint16_t> w(65536, 0x3f80);
    const fs::path p = dir / "model.safetensors";
    write_safetensors(p, {{"w", DType::BF16, {65536}, w.data()}});
    return p;
}

TEST(SafetensorsTruncated, ReadingPastTheNewEndNamesTheFile) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    testing::TempDir dir("sigbus");
    const fs::path p = write_file(dir.path());
    EXPECT_EXIT(
        {
            const SafetensorsSet set = SafetensorsSet::open(p);
            const TensorInfo& t = set.get("w");
            if (::truncate(p.c_str(), 4096) != 0) std::_Exit(3);
            volatile uint8_t last = t.data[t.nbytes - 1];
            (void)last;
            std::_Exit(0);
        },
        // (the child re-runs the test from the start: its temporary folder has its own name)
        ::testing::ExitedWithCode(1),
        "error: /.*/model\\.safetensors changed size while mapped \\(truncated\\?\\)");
}

// A mapping the loader did not make: the handler leaves the signal to the one before it (the default action).
TEST(SafetensorsTruncated, OtherBusErrorsStayBusErrors) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    testing::TempDir dir("sigbus2");
    const fs::path p = write_file(dir.path());
#if defined(__SANITIZE_ADDRESS__)
    const auto died = ::testing::ExitedWithCode(1);  // ASan's own SIGBUS handler was there before ours
    const char* says = "AddressSanitizer";
#else
    const auto died = ::testing::KilledBySignal(SIGBUS);
    const char* says = "";
#endif
    EXPECT_EXIT(
        {
            const SafetensorsSet set = SafetensorsSet::open(p);  // installs the handler
            const int fd = ::open(p.c_str(), O_RDONLY);
            auto* m = static_cast<const uint8_t*>(::mmap(nullptr, 131072, PROT_READ, MAP_PRIVATE, fd, 0));
            if (::ftruncate(::open(p.c_str(), O_WRONLY), 0) != 0) std::_Exit(3);
            volatile uint8_t x = m[131071];
            (void)x;
            std::_Exit(0);
        },
        died, says);
}

}  // namespace
}  // namespace markbase
