#pragma once

// A backup of a store while its consumer writes. Everything a consumer resumes from lives in
// the store's data file (data.mdb): rows and their journals, the consumer's checkpoints (its
// feed positions), inbox, parked events, dead letters, counters and effect keys, all of one
// commit. The other files of a store directory hold no state: lock.mdb (LMDB's reader table)
// and idem.lock (the writer lock) are made again by whoever opens the store.
//
// backup() takes LMDB's compacting copy of data.mdb from one read transaction: the copy is
// that one commit, whatever the writer commits meanwhile, and holds no free pages. It writes
// into "<out>.partial-<pid>" beside out, checks the copy's structure (the check `verify
// --store` runs) and opens it, and only then renames it to out: a failed backup leaves
// nothing that looks like a backup. A backup is a store directory: open it (point --db at
// it, or move it into place) and its consumer resumes from the checkpoints it holds.

#include <cstdint>
#include <filesystem>

namespace idem {

/// What backup() wrote.
struct backup_result {
    std::filesystem::path path;  ///< the backup: a store directory holding data.mdb
    std::uint64_t commit = 0;    ///< the commit number the copy holds (snapshot::commit())
    std::uint64_t bytes = 0;     ///< the size of the copy's data.mdb
    std::uint64_t pages = 0;     ///< the pages the copy uses
    double seconds = 0;          ///< the time the copy and its check took
};

/// Copies the store at db into the new store directory out, consistent with one commit while a
/// writer (another process, or this one) goes on committing. Throws std::system_error naming the
/// file and the cause: errc::invalid_argument if db holds no data.mdb or out exists and is not
/// an empty directory; errc::store_damaged if db's data file, or the copy made of it, is damaged
/// (nothing is left at out then); the system error of a failed write (a full disk).
backup_result backup(const std::filesystem::path& db, const std::filesystem::path& out);

}  // namespace idem
