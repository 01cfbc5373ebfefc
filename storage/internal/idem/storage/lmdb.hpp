#pragma once

// Move-only RAII owners over the LMDB C API. Read and write transactions are
// distinct types, so writing through a read transaction does not compile.
// Values returned by get() and cursors are views into the map: valid only until
// the transaction that produced them ends. Never store one.

#include <idem/storage/durability.hpp>
#include <idem/storage/error.hpp>
#include <idem/storage/writer_lock.hpp>

#include <lmdb.h>

#include <cstddef>
#include <cstdint>
#include <atomic>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>

namespace idem {

/// Options for opening an LMDB environment.
struct environment_options {
    std::size_t map_size = std::size_t{1} << 30;   ///< initial map size (address space, not disk); doubles on MDB_MAP_FULL
    std::size_t max_map_size = std::size_t{1} << 40; ///< the map never grows past this: then errc::map_full
    unsigned max_tables = 512;                     ///< named databases (3 per projection, 6 per consumer)
    unsigned max_readers = 512;                    ///< concurrent read transactions (all processes)
    bool read_only = false;                        ///< open with MDB_RDONLY (another process writes)
    durability sync = durability::full;            ///< fsync policy for commits
    /// A writable open takes the store's writer lock (one writer per store, across processes).
    /// Empty: a lock held by another process is refused at once (errc::store_locked naming the
    /// holder); otherwise called while it is held, and returning false gives up.
    lock_wait wait_for_writer{};
};

class read_txn;
class write_txn;

/// One LMDB environment. Open it with environment::open: there is one per path per process.
///
/// Thread safety: read transactions may be begun from any thread (MDB_NOTLS). Write
/// transactions are serialized by LMDB. grow() waits until no transaction of this
/// process is live; a thread that holds a transaction itself gets errc::map_full at once
/// instead of waiting for itself.
class environment {
public:
    /// Opens (or returns the already open) environment at path; creates the directory when writable.
    /// A writable open holds the store's writer lock until the environment is destroyed, and
    /// creates a new data file atomically; every open checks an existing data file against its
    /// meta pages first (errc::store_damaged). Throws std::system_error naming the path on failure.
    static std::shared_ptr<environment> open(const std::filesystem::path& path,
                                             const environment_options& options = {});

    environment(const environment&) = delete;
    environment& operator=(const environment&) = delete;
    ~environment();

    /// Returns the raw LMDB handle.
    MDB_env* handle() const noexcept { return env_; }
    /// Returns the directory the environment lives in.
    const std::filesystem::path& path() const noexcept { return path_; }
    /// Returns whether the environment was opened read-only.
    bool read_only() const noexcept { return options_.read_only; }
    /// Returns the options the environment was opened with.
    const environment_options& options() const noexcept { return options_; }

    /// Opens (creating if writable and create is true) a named database and caches its handle.
    /// Must not be called by a thread that holds a write transaction of this environment.
    MDB_dbi table(const std::string& name, unsigned flags = 0);
    /// Returns the handle of a named database opened so far (by table() or refresh_tables()).
    std::optional<MDB_dbi> try_table(std::string_view name);
    /// Opens every named database that exists but has no handle yet. A transaction can only use
    /// handles opened before it began, so snapshots call this before they begin.
    void refresh_tables();

    /// Doubles the map size (up to max_map_size); waits until no transaction of this process is live.
    /// Throws errc::map_full at the limit, or if the calling thread holds a transaction of this environment.
    void grow();
    /// Runs fn(write_txn&) and commits; on MDB_MAP_FULL aborts, grows the map and runs it again.
    void write(const std::function<void(write_txn&)>& fn);
    /// Returns the current map size in bytes.
    std::size_t map_size() const;
    /// Flushes buffered commits to disk (meaningful with durability::periodic and none).
    void sync(bool force = true);
    /// Closes and reopens the LMDB handle (after MDB_PANIC); waits until no transaction of this
    /// process is live. Table handles are reopened by name; their numbers may change.
    void reopen();
    /// Returns how many times the handle was reopened (snapshots begun across a reopen retry).
    std::uint64_t generation() const noexcept { return generation_.load(); }
    /// Returns the largest key (and dupsort value) LMDB accepts, 511 bytes by default.
    std::size_t max_key_size() const noexcept { return max_key_size_; }
    /// Throws errc::store_locked if this writable environment's lock file was deleted or
    /// replaced since it was taken: another process may then hold a lock of its own.
    void check_writer_lock() const;
    /// Returns what another layer keeps with this environment under name, made by make() on
    /// first use: state shared by every user of the environment in this process (caches).
    std::shared_ptr<void> attachment(const std::string& name, const std::function<std::shared_ptr<void>()>& make);

private:
    friend class txn_base;
    environment(std::filesystem::path path, const environment_options& options);
    void open_handle(std::size_t map_size);
    MDB_txn* begin(unsigned flags, std::shared_lock<std::shared_mutex>& gate, bool adopt_resize);
    void adopt_resize();
    template <class Txn, class F>
    auto with_open_lock(F&& fn);
    void end(std::thread::id owner) noexcept;
    bool held_by_this_thread();

    std::filesystem::path path_;
    environment_options options_;
    std::optional<writer_lock> writer_lock_;  // held by a writable environment for its lifetime
    MDB_env* env_ = nullptr;
    std::size_t max_key_size_ = 511;
    std::shared_mutex gate_;  // shared by every live transaction; exclusive to resize the map
    std::mutex live_mutex_;
    std::unordered_map<std::thread::id, unsigned> live_;  // live transactions by the thread that began them
    std::mutex open_mutex_;    // held by a handle-opening transaction from its begin to its end
    std::mutex tables_mutex_;  // guards tables_ only; never held while waiting for anything
    std::map<std::string, MDB_dbi, std::less<>> tables_;
    std::atomic<std::uint64_t> generation_{0};  // bumped by reopen(): handles from before are void
    std::atomic<std::int64_t> readers_checked_at_{0};
    std::mutex attachments_mutex_;
    std::map<std::string, std::shared_ptr<void>, std::less<>> attachments_;  // steady-clock ns of the writer's last mdb_reader_check
};

/// Common read access of both transaction kinds.
class txn_base {
public:
    txn_base(const txn_base&) = delete;
    txn_base& operator=(const txn_base&) = delete;

    /// Returns the value stored under key, or nullopt; the view lives until the transaction ends.
    std::optional<std::string_view> get(MDB_dbi table, std::string_view key) const;
    /// Returns the raw LMDB handle (null after commit or abort).
    MDB_txn* handle() const noexcept { return txn_; }
    /// Returns the environment this transaction belongs to.
    environment& env() const noexcept { return *env_; }
    /// Returns the number of entries in a table as seen by this transaction.
    std::size_t entries(MDB_dbi table) const;

protected:
    txn_base(environment& env, unsigned flags);
    txn_base(environment& env, unsigned flags, std::shared_lock<std::shared_mutex> held_gate);
    txn_base(txn_base&& other) noexcept;
    txn_base& operator=(txn_base&& other) noexcept;
    ~txn_base();
    void abort_now() noexcept;

    void release_gate() noexcept;

    environment* env_;
    MDB_txn* txn_ = nullptr;
    std::shared_lock<std::shared_mutex> gate_;
    std::thread::id owner_;
};

/// A read-only snapshot; usable from the thread that began it, or handed to another (MDB_NOTLS).
class read_txn : public txn_base {
public:
    /// Begins a snapshot of env.
    explicit read_txn(environment& env);
    /// Begins a snapshot on an already held share of env's gate; a map grown by another
    /// process is reported (errc::map_resized) instead of adopted.
    read_txn(environment& env, std::shared_lock<std::shared_mutex> held_gate);
    read_txn(read_txn&&) noexcept = default;
    read_txn& operator=(read_txn&&) noexcept = default;
    ~read_txn() = default;

    /// Ends the snapshot, keeping table handles opened inside it for later transactions.
    void commit();
    /// Ends the snapshot (also done by the destructor).
    void abort() noexcept { abort_now(); }
};

/// A write transaction; aborted on destruction unless committed.
class write_txn : public txn_base {
public:
    /// Begins a write transaction (waits for LMDB's writer lock).
    explicit write_txn(environment& env);
    /// As above, on an already held share of env's gate; a map grown by another process is
    /// reported (errc::map_resized) instead of adopted.
    write_txn(environment& env, std::shared_lock<std::shared_mutex> held_gate);
    write_txn(write_txn&&) noexcept = default;
    write_txn& operator=(write_txn&&) noexcept = default;
    ~write_txn() = default;

    /// Stores value under key; returns false if flags has MDB_NOOVERWRITE/MDB_NODUPDATA and it exists.
    /// Throws std::system_error (MDB_MAP_FULL among others); keys over the limit throw key_too_long.
    bool put(MDB_dbi table, std::string_view key, std::string_view value, unsigned flags = 0);
    /// Deletes key (or one duplicate of it); returns false if it was absent.
    bool del(MDB_dbi table, std::string_view key);
    /// Commits; the handle is forgotten first because LMDB frees it even when the commit fails.
    void commit();
    /// Aborts (also done by the destructor).
    void abort() noexcept { abort_now(); }
};

/// A cursor over one table inside a transaction; views it returns live until the transaction ends.
class cursor {
public:
    using entry = std::pair<std::string_view, std::string_view>;

    /// Opens a cursor on table inside txn.
    cursor(const txn_base& txn, MDB_dbi table);
    cursor(cursor&& other) noexcept : cursor_(std::exchange(other.cursor_, nullptr)) {}
    cursor& operator=(cursor&& other) noexcept;
    cursor(const cursor&) = delete;
    cursor& operator=(const cursor&) = delete;
    ~cursor();

    /// Positions on the first entry.
    std::optional<entry> first() { return step(MDB_FIRST); }
    /// Positions on the last entry.
    std::optional<entry> last() { return step(MDB_LAST); }
    /// Moves to the next entry.
    std::optional<entry> next() { return step(MDB_NEXT); }
    /// Positions on the first entry whose key is >= key.
    std::optional<entry> seek(std::string_view key);
    /// Deletes the entry under the cursor (only inside a write transaction).
    void del();
    /// Writes key -> value through the cursor (only inside a write transaction). Appends
    /// (MDB_APPEND) through one cursor skip the search from the root that mdb_put does each time.
    void put(std::string_view key, std::string_view value, unsigned flags = 0);

private:
    std::optional<entry> step(MDB_cursor_op op);
    MDB_cursor* cursor_ = nullptr;
};

/// Wraps a byte view as an MDB_val (LMDB does not write through it for reads).
inline MDB_val to_val(std::string_view s) noexcept {
    return MDB_val{s.size(), const_cast<char*>(s.data())};  // NOLINT: LMDB's C API is not const-correct
}

/// Views an MDB_val as bytes.
inline std::string_view from_val(const MDB_val& v) noexcept {
    return {static_cast<const char*>(v.mv_data), v.mv_size};
}

}  // namespace idem
