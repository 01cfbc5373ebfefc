#include "map_fault.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

namespace idem::cli::detail {

namespace {

// Two slots, so a store named while a fault is being reported never rewrites the text the
// handler reads; the handler reads only the published slot (async-signal-safe: write, _exit).
struct message {
    char text[2][4096];  // [0] SIGBUS, [1] SIGSEGV
    std::size_t size[2];
    char files[4096];  // the store's path, absolute: a file mapped from under it is the store's
    std::size_t files_size;
};
message slots[2];
std::atomic<int> published{-1};

struct sigaction old_segv{};
struct sigaction old_bus{};

std::uintptr_t parse_hex(const char*& p, const char* end) {
    std::uintptr_t v = 0;
    for (; p < end; ++p) {
        const char c = *p;
        const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) break;
        v = v * 16 + static_cast<std::uintptr_t>(d);
    }
    return v;
}

// Whether one line of /proc/self/maps ("start-end perms offset dev inode path") maps addr from
// a file under the store's path.
bool maps_store_file(const char* line, const char* end, std::uintptr_t addr, const message& m) {
    const char* p = line;
    const auto start = parse_hex(p, end);
    if (p == end || *p != '-') return false;
    ++p;
    const auto stop = parse_hex(p, end);
    if (addr < start || addr >= stop) return false;
    for (int field = 0; field < 4; ++field) {  // perms, offset, dev, inode
        while (p < end && *p == ' ') ++p;
        while (p < end && *p != ' ') ++p;
    }
    while (p < end && *p == ' ') ++p;
    return static_cast<std::size_t>(end - p) >= m.files_size && std::memcmp(p, m.files, m.files_size) == 0;
}

// Whether addr lies in a mapping of a file under the store's path: LMDB's map. Reads
// /proc/self/maps with open and read only (async-signal-safe), a line at a time.
bool in_store_map(std::uintptr_t addr, const message& m) {
    if (m.files_size == 0) return false;
    const int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    static char buf[16384];
    std::size_t have = 0;
    bool found = false;
    for (;;) {
        const auto n = ::read(fd, buf + have, sizeof buf - have);
        if (n <= 0) break;
        have += static_cast<std::size_t>(n);
        std::size_t used = 0;
        for (;;) {
            const auto* nl = static_cast<const char*>(std::memchr(buf + used, '\n', have - used));
            if (nl == nullptr) break;
            if (maps_store_file(buf + used, nl, addr, m)) found = true;
            used = static_cast<std::size_t>(nl - buf) + 1;
        }
        if (found) break;
        if (used == 0) have = 0;  // a line longer than the buffer: skipped
        std::memmove(buf, buf + used, have - used);
        have -= used;
    }
    ::close(fd);
    return found;
}

extern "C" void on_map_fault(int sig, siginfo_t* info, void*) {
    const int slot = published.load();
    // Nothing named, or a fault outside the store's map: return, and the faulting access repeats
    // under the default action (SA_RESETHAND restored it), which is the honest report of a fault
    // that is not the store's (a fault elsewhere says nothing of the store).
    // A signal sent (kill, raise) has no faulting access to repeat: raised again, it ends the
    // process under the default action once this handler returns.
    const bool sent = info == nullptr || info->si_code <= 0;
    if (slot < 0 || sent || !in_store_map(reinterpret_cast<std::uintptr_t>(info->si_addr), slots[slot])) {
        if (sent) ::raise(sig);
        return;
    }
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
    sa.sa_sigaction = on_map_fault;
    sa.sa_flags = static_cast<int>(SA_RESETHAND | SA_SIGINFO);
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
    // The path as /proc/self/maps shows it: absolute, links resolved as far as it exists.
    std::error_code ec;
    auto files = std::filesystem::weakly_canonical(std::filesystem::absolute(db, ec), ec).string();
    if (ec) files = db.string();
    while (files.size() > 1 && files.back() == '/') files.pop_back();
    const auto n = std::min(files.size(), sizeof slots[slot].files);
    std::memcpy(slots[slot].files, files.data(), n);
    slots[slot].files_size = n;
    published.store(slot);
}

void forget_store() noexcept { published.store(-1); }

}  // namespace idem::cli::detail
