#pragma once

// A damaged or truncated LMDB file makes a reader fault inside the map (LMDB keeps no page
// checksums and follows the page numbers it reads): SIGSEGV for a page number far out,
// SIGBUS for a page past the end of a file cut short. The command line turns such a fault
// into a message naming the store and what to do, and exit status 2, instead of dying
// silently by the signal.

#include <filesystem>
#include <string_view>

namespace idem::cli::detail {

/// Installs SIGSEGV and SIGBUS handlers for its lifetime and restores the previous ones after.
/// A fault at an address inside the map of the store named (note_store: a file under its path,
/// as /proc/self/maps shows) writes that store's message and exits with 2; any other fault is
/// left to the default action (it is not the store's doing, and blaming the store would send
/// the operator to restore a sound one).
class map_fault_guard {
public:
    map_fault_guard();
    ~map_fault_guard();
    map_fault_guard(const map_fault_guard&) = delete;
    map_fault_guard& operator=(const map_fault_guard&) = delete;
};

/// Prepares the message a fault prints: the tool's name and the store at db. Call it before
/// the store is opened; the handler itself only writes what was prepared.
void note_store(std::string_view tool, const std::filesystem::path& db);

/// Forgets the store named last: a fault is no longer blamed on it.
void forget_store() noexcept;

}  // namespace idem::cli::detail
