#pragma once

// Ctrl-C and SIGTERM during a command: the first one asks the command to stop (a consume
// stops after the batch in hand, a rebuild or a wait for the writer lock gives up); a second
// one ends the process the default way.

#include <idem/cli/tool.hpp>
#include <idem/storage/writer_lock.hpp>

#include <atomic>
#include <filesystem>
#include <string>

#include <signal.h>

namespace idem::cli::detail {

/// Set by the first Ctrl-C or SIGTERM while a stop_signals lives.
extern std::atomic<bool> stop_requested;

/// For its lifetime, the first Ctrl-C or SIGTERM sets stop_requested; the caller's handlers
/// are restored afterwards.
class stop_signals {
public:
    stop_signals();
    ~stop_signals();
    stop_signals(const stop_signals&) = delete;
    stop_signals& operator=(const stop_signals&) = delete;

private:
    struct sigaction old_int_{};
    struct sigaction old_term_{};
};

/// With --wait, returns a lock_wait that says once on stderr who holds db and gives up on
/// Ctrl-C; without it, none (a store another process writes is refused at once).
lock_wait writer_wait(const std::string& tool, const arguments& a, const std::filesystem::path& db);

}  // namespace idem::cli::detail
