#pragma once

// What idem checks and prepares in an environment directory before LMDB maps its files.
//
// LMDB trusts its data file: a data.mdb cut short is mapped anyway and the first read past
// its end is a SIGBUS; an empty data.mdb is taken for a new environment. And it maps its
// lock file shared and writes to it, which on a full disk is a SIGBUS too. So, before
// mdb_env_open:
// - a new environment's data.mdb is made aside and renamed in once both meta pages are on
//   disk: a data.mdb at the path was always complete once, and is never created again;
// - an existing data.mdb is checked against its own meta pages (both readable and valid,
//   the newest commit's tree roots inside the file, and a file shorter than its last page
//   walked whole to see that the missing pages are free): a damaged one is errc::store_damaged;
// - the lock file's space is reserved (posix_fallocate), so a full disk is ENOSPC here.

#include <cstdint>
#include <filesystem>

namespace idem::detail {

/// The newest valid meta page of a data file.
struct data_file_meta {
    std::uint32_t page_size = 0;
    std::uint64_t last_page = 0;  ///< the last page the newest commit uses
    std::uint64_t txn = 0;        ///< the newest commit's transaction id (0: nothing committed)
    std::uint64_t file_size = 0;
};

/// Returns whether two valid meta pages can hold the last two commits: consecutive
/// transactions (equal in a new file), the newer using no fewer pages. If not, one of them is
/// damaged: a flipped bit in the older's transaction id would make LMDB take it for the newer
/// and silently drop the last commit.
inline bool meta_pages_agree(std::uint64_t newer_txn, std::uint64_t newer_last_page, std::uint64_t older_txn,
                             std::uint64_t older_last_page) noexcept {
    return newer_txn - older_txn <= 1 && newer_last_page >= older_last_page;
}

/// Creates dir/data.mdb as an empty, complete LMDB environment if there is none: written in a
/// private directory beside it, synced, renamed in. Leftovers of creations that were killed
/// are removed. The caller holds the writer lock. Throws std::system_error naming the file.
void create_data_file(const std::filesystem::path& dir);

/// Checks dir/data.mdb against its meta pages; throws errc::store_damaged naming the file and
/// what is wrong, or the system error of reading it.
data_file_meta check_data_file(const std::filesystem::path& dir);

/// Reserves disk space for LMDB's lock file of max_readers reader slots (dir/lock.mdb).
void reserve_lock_file(const std::filesystem::path& dir, unsigned max_readers);

}  // namespace idem::detail
