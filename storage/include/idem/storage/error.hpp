#pragma once

#include <string>
#include <system_error>

namespace idem {

/// Error codes of idem's own category; LMDB failures map onto these as error conditions.
enum class errc {
    storage_failed = 1,      ///< an LMDB call failed (I/O error, corruption, ...)
    map_full,                ///< the memory map is full; the batch is retried after growing it
    map_resized,             ///< another process grew the map; adopted and retried
    key_too_long,            ///< a key exceeds LMDB's key size limit (511 bytes)
    format_mismatch,         ///< the environment was written by an incompatible format version
    read_only,               ///< a write was attempted through a read-only environment
    environment_conflict,    ///< the path is already open in this process with incompatible options
    invalid_argument,        ///< a caller passed an argument that cannot be used
    unknown_projection,      ///< a reader asked for a projection that does not exist
    corrupt_record,          ///< a stored record could not be decoded
    state_version_mismatch,  ///< a row was written by a newer state version than the code knows
    panic,                   ///< LMDB reported MDB_PANIC; the environment must be reopened
    corrupt_log,             ///< an event log holds a corrupt record with valid data after it
    torn_record,             ///< an event log ends in an incomplete record (a crash mid-append)
    store_locked,            ///< another process holds the store's writer lock
    store_damaged,           ///< the environment's files are damaged (truncated, bad meta pages)
    log_changed,             ///< an event log is no longer the file its checkpoint was taken in
    broker_failed,           ///< a message broker refused or failed a request (connect, stream, consumer)
    stream_changed,          ///< a broker's stream went back behind its checkpoint (purged, recreated)
    delivery_exhausted,      ///< a message reached its delivery limit without a committed outcome
    lease_lost,              ///< the writer no longer holds the lease that fences its commits
    changes_pruned,          ///< a change feed reader asked for commits the feed no longer holds
};

/// Returns the category of idem's own error codes ("idem").
const std::error_category& category() noexcept;

/// Makes an error code of idem's category.
std::error_code make_error_code(errc e) noexcept;

/// Returns the category LMDB return codes live in; its conditions compare equal to idem::errc.
const std::error_category& lmdb_category() noexcept;

/// Maps an LMDB return code to an error code: the one place that does. Codes with an idem meaning
/// (MDB_MAP_FULL, MDB_PANIC, ...) become idem::errc, errnos the system category, the rest "lmdb".
std::error_code lmdb_error(int rc) noexcept;

/// Throws std::system_error for a failing LMDB return code, naming what was being done.
[[noreturn]] void throw_lmdb(int rc, const std::string& what);

/// Throws std::system_error for an idem error, naming what was being done.
[[noreturn]] void throw_error(errc e, const std::string& what);

}  // namespace idem

template <>
struct std::is_error_code_enum<idem::errc> : std::true_type {};
