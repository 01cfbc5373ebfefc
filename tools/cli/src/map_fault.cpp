#include "map_fault.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>

namespace idem::cli::detail {

namespace {

// Two slots, so a store named while a fault is being reported never rewrites the text the
// handler reads; the handler reads only the published slot (async-signal-safe: write, _exit).
struct message {
    char text[2][4096];  // [0] SIGBUS, [1] SIGSEGV
    std::size_t size[2];
};
message slots[2];
std::atomic<int> published{-1};

struct sigaction old_segv{};
struct sigaction old_bus{};

extern "C" void on_map_fault(int sig) {
    const int slot = published.load();
    // Nothing named: return, and the faulting access repeats under the default action
    // (SA_RESETHAND restored it), which is the honest report of a fault that is not the store's.
    if (slot < 0) return;
    const int which = sig == SIGBUS ? 0 : 1;
    const char* p = slots[slot].text[which];
    std::size_t left = slots[slot].size[which];
    while (left > 0) {
        const auto n = ::write(STDERR_FILENO, p, left);
        if (n <= 0) break;
        p += n;
        left -= static_cast<std::size_t>(n);
    }
    ::_exit(2);
}

}  // namespace

map_fault_guard::map_fault_guard() {
    struct sigaction sa{};
    sa.sa_handler = on_map_fault;
    sa.sa_flags = static_cast<int>(SA_RESETHAND);
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGSEGV, &sa, &old_segv);
    ::sigaction(SIGBUS, &sa, &old_bus);
}

map_fault_guard::~map_fault_guard() {
    forget_store();
    ::sigaction(SIGSEGV, &old_segv, nullptr);
    ::sigaction(SIGBUS, &old_bus, nullptr);
}

void note_store(std::string_view tool, const std::filesystem::path& db) {
    const int slot = published.load() == 0 ? 1 : 0;
    const std::string dir = db.string();
    for (int which = 0; which < 2; ++which) {
        const std::string text = std::string(tool) + ": the store at " + dir +
                                 " is damaged or was truncated while in use (" + (which == 0 ? "SIGBUS" : "SIGSEGV") +
                                 " while reading it); run `" + std::string(tool) + " verify --store --db " + dir +
                                 "`; restore it from a backup or rebuild it from its logs\n";
        const auto n = std::min(text.size(), sizeof slots[slot].text[which]);
        std::memcpy(slots[slot].text[which], text.data(), n);
        slots[slot].size[which] = n;
    }
    published.store(slot);
}

void forget_store() noexcept { published.store(-1); }

}  // namespace idem::cli::detail
