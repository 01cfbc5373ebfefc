#pragma once

// One writer per store, across processes. LMDB serializes write transactions, but it lets
// any number of processes open an environment for writing and queue for its writer mutex
// without a word; a rebuild that swaps the directory under a live consumer then leaves
// that consumer committing into deleted files. So every writable open of an environment
// first takes an exclusive flock on `<dir>/idem.lock` and keeps it until the environment
// is closed. Readers never take it.
//
// The lock file holds the holder's pid and command line (written after locking), so a
// refused writer can say who holds the store. A lock file is never deleted while a store
// lives in its directory; a rebuild swaps whole directories, so after taking the lock a
// writer checks that the file it locked is still the one at the path (same inode), and
// starts over if not: a writer that waited through a rebuild ends up on the new store.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

namespace idem {

/// Who holds a store's writer lock, as the holder wrote it into the lock file.
struct lock_holder {
    std::int64_t pid = 0;   ///< 0 when the holder has not written itself in yet
    std::string command{};  ///< the holder's command line, shortened
};

/// Called about every 100 ms while another process holds the lock; returns whether to keep waiting.
using lock_wait = std::function<bool(const lock_holder&)>;

/// The name of the lock file inside an environment directory.
inline constexpr const char* writer_lock_file = "idem.lock";

/// An exclusive writer lock on an environment directory; released by the destructor.
class writer_lock {
public:
    /// Takes the lock of dir (which must exist). With wait empty, a lock held elsewhere is
    /// refused at once: std::system_error errc::store_locked naming the holder. Otherwise wait
    /// is called while it is held and the lock is taken as soon as it is free; wait returning
    /// false ends the wait with errc::store_locked too.
    writer_lock(const std::filesystem::path& dir, const lock_wait& wait = {});
    ~writer_lock();
    writer_lock(writer_lock&& other) noexcept;
    writer_lock& operator=(writer_lock&&) = delete;
    writer_lock(const writer_lock&) = delete;
    writer_lock& operator=(const writer_lock&) = delete;

    /// Returns whether the lock file at dir is still the one this lock holds: false once it was
    /// deleted or replaced, after which another process may take a lock of its own.
    bool still_held(const std::filesystem::path& dir) const;

    /// Returns whether some process holds the writer lock of dir (false if dir has no lock file).
    static bool held(const std::filesystem::path& dir);
    /// Returns what the lock file of dir says about its holder (pid 0 if nothing is written).
    static lock_holder holder(const std::filesystem::path& dir);

private:
    int fd_ = -1;
};

/// Describes a holder for a message: "pid 1234 (idem consume --db data ...)".
std::string describe(const lock_holder& holder);

}  // namespace idem
