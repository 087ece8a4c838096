#include "loading/mapping_guard.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>

namespace markbase {

namespace {

// Fixed storage: the handler may read it at any moment, so nothing here is allocated or freed.
constexpr int kSlots = 256;
constexpr size_t kNameBytes = 512;

enum SlotState : int { kFree = 0, kBusy = 1, kLive = 2 };

struct Slot {
    std::atomic<int> state{kFree};
    uintptr_t begin = 0, end = 0;
    char name[kNameBytes] = {};
};

Slot g_slots[kSlots];
struct sigaction g_previous {};
std::once_flag g_installed;

void write_all(const char* s, size_t n) {
    while (n > 0) {
        const ssize_t w = ::write(STDERR_FILENO, s, n);
        if (w <= 0) return;
        s += w;
        n -= size_t(w);
    }
}

void on_sigbus(int sig, siginfo_t* info, void* context) {
    const auto addr = reinterpret_cast<uintptr_t>(info ? info->si_addr : nullptr);
    for (Slot& s : g_slots) {
        if (s.state.load(std::memory_order_acquire) != kLive || addr < s.begin || addr >= s.end) continue;
        static const char head[] = "error: ";
        static const char tail[] = " changed size while mapped (truncated?)\n";
        write_all(head, sizeof head - 1);
        write_all(s.name, std::strlen(s.name));
        write_all(tail, sizeof tail - 1);
        _exit(1);
    }
    // Not one of ours: whoever handled SIGBUS before, or the default action (the faulting access runs again
    // on return and is delivered to it).
    if ((g_previous.sa_flags & SA_SIGINFO) && g_previous.sa_sigaction) {
        g_previous.sa_sigaction(sig, info, context);
    } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
        g_previous.sa_handler(sig);
    } else {
        struct sigaction dfl {};
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        ::sigaction(SIGBUS, &dfl, nullptr);
    }
}

void install() {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, &g_previous);
}

}  // namespace

int register_mapping(const void* begin, size_t bytes, const std::string& file) {
    std::call_once(g_installed, install);
    const long page = ::sysconf(_SC_PAGESIZE);
    const size_t round = page > 0 ? size_t(page) : 4096;
    for (int i = 0; i < kSlots; ++i) {
        Slot& s = g_slots[i];
        int expect = kFree;
        if (!s.state.compare_exchange_strong(expect, kBusy, std::memory_order_acquire)) continue;
        s.begin = reinterpret_cast<uintptr_t>(begin);
        s.end = s.begin + (bytes + round - 1) / round * round;  // the mapping's whole last page
        const size_t n = std::min(file.size(), kNameBytes - 1);
        std::memcpy(s.name, file.data(), n);
        s.name[n] = '\0';
        if (n < file.size()) std::memcpy(s.name + kNameBytes - 4, "...", 4);
        s.state.store(kLive, std::memory_order_release);
        return i;
    }
    return -1;
}

void unregister_mapping(int handle) {
    if (handle < 0 || handle >= kSlots) return;
    Slot& s = g_slots[handle];
    s.state.store(kBusy, std::memory_order_release);
    s.begin = s.end = 0;
    s.state.store(kFree, std::memory_order_release);
}

}  // namespace markbase
