#include <idem/storage/lmdb.hpp>

#include <idem/storage/crash_point.hpp>

#include "data_file.hpp"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <system_error>
#include <vector>

namespace idem {
namespace {

// One environment per path per process: LMDB forbids opening the same environment
// twice in one process (closing either would drop the other's file locks). Entries
// from a parent process are ignored after fork(); the child opens its own.
struct registry {
    std::mutex mutex;
    pid_t pid = 0;
    std::map<std::string, std::weak_ptr<environment>> open;
};

registry& environments() {
    static registry instance;
    return instance;
}

std::string describe(const std::filesystem::path& path) { return "LMDB environment '" + path.string() + "'"; }

// LMDB reports a short write as EIO ("filesystem full?"), which is what a full disk gives a
// write of several pages. Name the cause when the file system is indeed (nearly) full.
int with_cause(int rc, const std::filesystem::path& dir) {
    if (rc != EIO) return rc;
    struct statvfs fs{};
    if (::statvfs(dir.c_str(), &fs) != 0) return rc;
    const auto free_bytes = static_cast<std::uint64_t>(fs.f_bavail) * fs.f_frsize;
    return free_bytes < (std::uint64_t{1} << 20) ? ENOSPC : rc;
}

}  // namespace

std::shared_ptr<environment> environment::open(const std::filesystem::path& path,
                                               const environment_options& options) {
    std::error_code ec;
    if (!options.read_only) {
        std::filesystem::create_directories(path, ec);
        if (ec) {
            throw std::system_error(ec, "cannot create " + describe(path));
        }
    }
    auto canonical = std::filesystem::weakly_canonical(path, ec);
    if (ec) {
        canonical = std::filesystem::absolute(path);
    }

    auto& reg = environments();
    std::scoped_lock lock{reg.mutex};
    if (reg.pid != ::getpid()) {
        // A fork copied the parent's registry; those handles must not be used here.
        for (auto& [key, weak] : reg.open) {
            if (auto env = weak.lock()) {
                env->env_ = nullptr;  // leaks the parent's handle on purpose: closing it here is unsafe
            }
        }
        reg.open.clear();
        reg.pid = ::getpid();
    }
    if (auto it = reg.open.find(canonical.string()); it != reg.open.end()) {
        if (auto env = it->second.lock()) {
            if (env->read_only() && !options.read_only) {
                throw_error(errc::environment_conflict,
                            describe(canonical) + " is already open read-only in this process");
            }
            return env;
        }
    }
    auto env = std::shared_ptr<environment>(new environment(canonical, options));
    reg.open[canonical.string()] = env;
    return env;
}

environment::environment(std::filesystem::path path, const environment_options& options)
    : path_(std::move(path)), options_(options) {
    if (!options_.read_only) {
        writer_lock_.emplace(path_, options_.wait_for_writer);
        detail::create_data_file(path_);
    }
    open_handle(options_.map_size);
}

void environment::open_handle(std::size_t map_size) {
    if (int rc = mdb_env_create(&env_); rc != 0) {
        throw_lmdb(rc, "cannot create " + describe(path_));
    }
    auto fail = [&](int rc, const char* what) {
        mdb_env_close(env_);
        env_ = nullptr;
        throw_lmdb(rc, std::string(what) + " " + describe(path_));
    };
    if (int rc = mdb_env_set_maxdbs(env_, options_.max_tables); rc != 0) fail(rc, "cannot set max tables of");
    if (int rc = mdb_env_set_maxreaders(env_, options_.max_readers); rc != 0) fail(rc, "cannot set max readers of");
    if (!options_.read_only) {
        if (int rc = mdb_env_set_mapsize(env_, map_size); rc != 0) fail(rc, "cannot set map size of");
    }
    // LMDB maps the data file and trusts it: a file cut short is a SIGBUS at the first read past
    // its end. And it writes to its lock file through a shared map: a SIGBUS on a full disk.
    try {
        for (int attempt = 0;; ++attempt) {
            try {
                detail::check_data_file(path_);
                break;
            } catch (const std::system_error& e) {
                // A reader may catch a writer mid-way through a meta page: look again before
                // calling the store damaged. A writer holds the lock: nobody else writes.
                if (!options_.read_only || e.code() != errc::store_damaged || attempt == 4) throw;
                std::this_thread::sleep_for(std::chrono::milliseconds(20));
            }
        }
        detail::reserve_lock_file(path_, options_.max_readers);
    } catch (...) {
        mdb_env_close(env_);
        env_ = nullptr;
        throw;
    }
    unsigned flags = MDB_NOTLS | MDB_NORDAHEAD;
    if (options_.read_only) flags |= MDB_RDONLY;
    // periodic keeps LMDB's sync per commit: under MDB_NOSYNC a system crash can corrupt the
    // file, not just lose commits. Its pacing (fewer, larger commits) is the engine's job.
    if (options_.sync == durability::none) flags |= MDB_NOSYNC;
    const int opened = mdb_env_open(env_, path_.c_str(), flags, 0644);
    if (opened != 0) fail(opened, "cannot open");
    // Reader slots of crashed processes would pin old pages forever (and grow the file).
    int dead = 0;
    if (int rc = mdb_reader_check(env_, &dead); rc != 0) fail(rc, "cannot check readers of");
    max_key_size_ = static_cast<std::size_t>(mdb_env_get_maxkeysize(env_));
}

void environment::reopen() {
    if (held_by_this_thread()) {
        throw_error(errc::panic, "cannot reopen " + describe(path_) + " while this thread holds a transaction of it");
    }
    // Only the gate: with it held exclusively no transaction, handle-opening ones included,
    // is live. Taking open_mutex_ too would deadlock with a thread that holds a snapshot and
    // waits for that mutex to begin another.
    std::unique_lock gate{gate_};
    auto size = map_size();
    mdb_env_close(env_);
    env_ = nullptr;
    {
        std::scoped_lock lock{tables_mutex_};
        tables_.clear();
    }
    ++generation_;
    open_handle(size);
}

environment::~environment() {
    if (env_ != nullptr) {
        mdb_env_close(env_);
    }
}

// LMDB gives a new handle the next free slot of the opening transaction's view at its
// begin, so a handle-opening transaction must not overlap any other (its begin to its end):
// open_mutex_ is held for that whole span. Beginning inside the mutex must not wait for a
// map resize (which waits for every live transaction, and one of those may be waiting for
// this mutex), so a resize is reported, adopted outside the mutex, and the whole step retried.
template <class Txn, class F>
auto environment::with_open_lock(F&& fn) {
    for (;;) {
        try {
            // The gate first, as every transaction takes it, then the mutex: one lock order.
            std::shared_lock gate{gate_};
            std::unique_lock lock{open_mutex_};
            Txn txn{*this, std::move(gate)};
            try {
                return fn(txn);
            } catch (...) {
                txn.abort();  // while the mutex is still held
                throw;
            }
        } catch (const std::system_error& e) {
            if (e.code() == errc::map_resized) {
                adopt_resize();
            } else if (e.code() == errc::map_full && !read_only()) {
                grow();
            } else {
                throw;
            }
        }
    }
}

MDB_dbi environment::table(const std::string& name, unsigned flags) {
    if (auto dbi = try_table(name)) {
        return *dbi;
    }
    auto open_in = [&](auto& txn) {
        if (auto dbi = try_table(name)) {
            return *dbi;  // another thread opened it meanwhile
        }
        MDB_dbi dbi = 0;
        unsigned open_flags = read_only() ? flags : flags | MDB_CREATE;
        if (int rc = mdb_dbi_open(txn.handle(), name.c_str(), open_flags, &dbi); rc != 0) {
            throw_lmdb(rc, "cannot open table '" + name + "' of " + describe(path_));
        }
        txn.commit();  // publishes the handle (aborting would close it)
        std::scoped_lock lock{tables_mutex_};
        tables_.emplace(name, dbi);
        return dbi;
    };
    if (read_only()) {
        return with_open_lock<read_txn>(open_in);
    }
    return with_open_lock<write_txn>(open_in);
}

std::optional<MDB_dbi> environment::try_table(std::string_view name) {
    std::scoped_lock lock{tables_mutex_};
    if (auto it = tables_.find(name); it != tables_.end()) {
        return it->second;
    }
    return std::nullopt;
}

void environment::refresh_tables() {
    with_open_lock<read_txn>([&](read_txn& txn) {
        MDB_dbi main = 0;
        if (int rc = mdb_dbi_open(txn.handle(), nullptr, 0, &main); rc != 0) {
            throw_lmdb(rc, "cannot open the table list of " + describe(path_));
        }
        std::vector<std::pair<std::string, MDB_dbi>> opened;
        {
            cursor c{txn, main};
            for (auto e = c.first(); e; e = c.next()) {
                std::string name(e->first);
                if (try_table(name)) continue;
                MDB_dbi dbi = 0;
                if (mdb_dbi_open(txn.handle(), name.c_str(), 0, &dbi) == 0) {  // skips non-table keys
                    opened.emplace_back(std::move(name), dbi);
                }
            }
        }
        txn.commit();  // publishes the handles
        std::scoped_lock lock{tables_mutex_};
        for (auto& [name, dbi] : opened) tables_.emplace(std::move(name), dbi);
        return 0;
    });
}

void environment::grow() {
    auto size = map_size();
    if (size >= options_.max_map_size) {
        throw_error(errc::map_full, "the map of " + describe(path_) + " is full at its limit of " +
                                        std::to_string(options_.max_map_size) + " bytes");
    }
    if (held_by_this_thread()) {
        throw_error(errc::map_full, "the map of " + describe(path_) +
                                        " is full and cannot grow while this thread holds a transaction "
                                        "(a snapshot) of it; release it before writing");
    }
    std::unique_lock lock{gate_};
    if (map_size() != size) {
        return;  // another thread grew it meanwhile
    }
    crash_point("during_map_resize");
    if (int rc = mdb_env_set_mapsize(env_, std::min(size * 2, options_.max_map_size)); rc != 0) {
        throw_lmdb(rc, "cannot grow the map of " + describe(path_));
    }
}

void environment::write(const std::function<void(write_txn&)>& fn) {
    for (;;) {
        try {
            write_txn txn{*this};
            fn(txn);
            txn.commit();
            return;
        } catch (const std::system_error& e) {
            if (e.code() != errc::map_full) throw;
        }
        grow();  // the transaction is gone: none of ours is live here
    }
}

bool environment::held_by_this_thread() {
    std::scoped_lock lock{live_mutex_};
    return live_.contains(std::this_thread::get_id());
}

void environment::end(std::thread::id owner) noexcept {
    std::scoped_lock lock{live_mutex_};
    if (auto it = live_.find(owner); it != live_.end() && --it->second == 0) {
        live_.erase(it);
    }
}

std::shared_ptr<void> environment::attachment(const std::string& name,
                                              const std::function<std::shared_ptr<void>()>& make) {
    std::scoped_lock lock{attachments_mutex_};
    auto& slot = attachments_[name];
    if (!slot) slot = make();
    return slot;
}

std::size_t environment::map_size() const {
    MDB_envinfo info{};
    mdb_env_info(env_, &info);
    return info.me_mapsize;
}

void environment::sync(bool force) {
    if (int rc = mdb_env_sync(env_, force ? 1 : 0); rc != 0) {
        throw_lmdb(with_cause(rc, path_), "cannot sync " + describe(path_));
    }
}

void environment::adopt_resize() {
    if (held_by_this_thread()) {
        throw_error(errc::map_resized, "cannot adopt the map size another process set for " + describe(path_) +
                                           " while this thread holds a transaction of it");
    }
    std::unique_lock exclusive{gate_};
    if (int rc = mdb_env_set_mapsize(env_, 0); rc != 0) {
        throw_lmdb(rc, "cannot adopt the new map size of " + describe(path_));
    }
}

MDB_txn* environment::begin(unsigned flags, std::shared_lock<std::shared_mutex>& gate, bool adopt) {
    if ((flags & MDB_RDONLY) == 0) {
        // A reader process killed inside a snapshot leaves its slot pinning that snapshot's
        // pages: no page freed after it could be reused and the file would grow until some
        // process opened the environment again. The writer clears dead slots itself, at most
        // once a second (it only walks the used slots).
        const std::int64_t now =
            std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
                .count();
        auto last = readers_checked_at_.load(std::memory_order_relaxed);
        if (now - last >= 1'000'000'000 && readers_checked_at_.compare_exchange_strong(last, now)) {
            int dead = 0;
            mdb_reader_check(env_, &dead);  // best effort: a failure here leaves the slots for the next check
        }
    }
    for (;;) {
        if (!gate.owns_lock()) gate = std::shared_lock{gate_};
        MDB_txn* txn = nullptr;
        int rc = mdb_txn_begin(env_, nullptr, flags, &txn);
        if (rc == 0) {
            std::scoped_lock lock{live_mutex_};
            ++live_[std::this_thread::get_id()];
            return txn;
        }
        gate.unlock();
        if (rc != MDB_MAP_RESIZED || !adopt) {
            throw_lmdb(rc, "cannot begin a transaction on " + describe(path_));
        }
        // Another process grew the map: adopt its size, with no transaction of ours live.
        adopt_resize();
    }
}

txn_base::txn_base(environment& env, unsigned flags) : env_(&env), owner_(std::this_thread::get_id()) {
    txn_ = env.begin(flags, gate_, true);
}

txn_base::txn_base(environment& env, unsigned flags, std::shared_lock<std::shared_mutex> held_gate)
    : env_(&env), gate_(std::move(held_gate)), owner_(std::this_thread::get_id()) {
    txn_ = env.begin(flags, gate_, false);
}

txn_base::txn_base(txn_base&& other) noexcept
    : env_(other.env_), txn_(std::exchange(other.txn_, nullptr)), gate_(std::move(other.gate_)), owner_(other.owner_) {}

txn_base& txn_base::operator=(txn_base&& other) noexcept {
    if (this != &other) {
        abort_now();
        env_ = other.env_;
        txn_ = std::exchange(other.txn_, nullptr);
        gate_ = std::move(other.gate_);
        owner_ = other.owner_;
    }
    return *this;
}

txn_base::~txn_base() { abort_now(); }

void txn_base::abort_now() noexcept {
    if (txn_ != nullptr) {
        mdb_txn_abort(std::exchange(txn_, nullptr));
    }
    release_gate();
}

void txn_base::release_gate() noexcept {
    if (gate_.owns_lock()) {
        gate_.unlock();
        env_->end(owner_);
    }
}

std::optional<std::string_view> txn_base::get(MDB_dbi table, std::string_view key) const {
    MDB_val k = to_val(key);
    MDB_val v{};
    int rc = mdb_get(txn_, table, &k, &v);
    if (rc == MDB_NOTFOUND) {
        return std::nullopt;
    }
    if (rc != 0) {
        throw_lmdb(rc, "cannot read from " + describe(env_->path()));
    }
    return from_val(v);
}

std::size_t txn_base::entries(MDB_dbi table) const {
    MDB_stat stat{};
    if (int rc = mdb_stat(txn_, table, &stat); rc != 0) {
        throw_lmdb(rc, "cannot stat a table of " + describe(env_->path()));
    }
    return stat.ms_entries;
}

read_txn::read_txn(environment& env) : txn_base(env, MDB_RDONLY) {}

read_txn::read_txn(environment& env, std::shared_lock<std::shared_mutex> held_gate)
    : txn_base(env, MDB_RDONLY, std::move(held_gate)) {}

void read_txn::commit() {
    // Committing a read transaction is what makes table handles opened in it visible to later ones.
    int rc = mdb_txn_commit(std::exchange(txn_, nullptr));
    release_gate();
    if (rc != 0) {
        throw_lmdb(rc, "cannot end a read transaction on " + describe(env_->path()));
    }
}

namespace {
environment& writable(environment& env) {
    if (env.read_only()) {
        throw_error(errc::read_only, "cannot write to " + describe(env.path()) + ": it was opened read-only");
    }
    return env;
}
}  // namespace

write_txn::write_txn(environment& env) : txn_base(writable(env), 0) {}

write_txn::write_txn(environment& env, std::shared_lock<std::shared_mutex> held_gate)
    : txn_base(writable(env), 0, std::move(held_gate)) {}

bool write_txn::put(MDB_dbi table, std::string_view key, std::string_view value, unsigned flags) {
    if (key.empty() || key.size() > env_->max_key_size()) {
        throw_error(errc::key_too_long, "key of " + std::to_string(key.size()) + " bytes refused by " +
                                            describe(env_->path()));
    }
    MDB_val k = to_val(key);
    MDB_val v = to_val(value);
    int rc = mdb_put(txn_, table, &k, &v, flags);
    if (rc == MDB_KEYEXIST) {
        return false;
    }
    if (rc != 0) {
        throw_lmdb(rc, "cannot write to " + describe(env_->path()));
    }
    return true;
}

bool write_txn::del(MDB_dbi table, std::string_view key) {
    MDB_val k = to_val(key);
    int rc = mdb_del(txn_, table, &k, nullptr);
    if (rc == MDB_NOTFOUND) {
        return false;
    }
    if (rc != 0) {
        throw_lmdb(rc, "cannot delete from " + describe(env_->path()));
    }
    return true;
}

void environment::check_writer_lock() const {
    if (writer_lock_ && !writer_lock_->still_held(path_)) {
        throw_error(errc::store_locked,
                    (path_ / writer_lock_file).string() +
                        " was deleted or replaced while this process held it, so another writer may be writing "
                        "the store: nothing more is committed here (restart this writer; it takes the lock again)");
    }
}

void write_txn::commit() {
    // One writer per store: a lock file deleted under a writer would let a second one in.
    try {
        env_->check_writer_lock();
    } catch (...) {
        abort_now();
        throw;
    }
    MDB_txn* txn = std::exchange(txn_, nullptr);
    int rc = mdb_txn_commit(txn);
    release_gate();
    if (rc != 0) {
        throw_lmdb(with_cause(rc, env_->path()), "cannot commit to " + describe(env_->path()));
    }
}

cursor::cursor(const txn_base& txn, MDB_dbi table) {
    if (int rc = mdb_cursor_open(txn.handle(), table, &cursor_); rc != 0) {
        throw_lmdb(rc, "cannot open a cursor on " + describe(txn.env().path()));
    }
}

cursor& cursor::operator=(cursor&& other) noexcept {
    if (this != &other) {
        if (cursor_ != nullptr) mdb_cursor_close(cursor_);
        cursor_ = std::exchange(other.cursor_, nullptr);
    }
    return *this;
}

cursor::~cursor() {
    if (cursor_ != nullptr) {
        mdb_cursor_close(cursor_);
    }
}

std::optional<cursor::entry> cursor::step(MDB_cursor_op op) {
    MDB_val k{};
    MDB_val v{};
    int rc = mdb_cursor_get(cursor_, &k, &v, op);
    if (rc == MDB_NOTFOUND) {
        return std::nullopt;
    }
    if (rc != 0) {
        throw_lmdb(rc, "cursor step failed");
    }
    return entry{from_val(k), from_val(v)};
}

void cursor::put(std::string_view key, std::string_view value, unsigned flags) {
    MDB_val k = to_val(key);
    MDB_val v = to_val(value);
    if (int rc = mdb_cursor_put(cursor_, &k, &v, flags); rc != 0) throw_lmdb(rc, "cursor put failed");
}

std::optional<cursor::entry> cursor::seek(std::string_view key) {
    MDB_val k = to_val(key);
    MDB_val v{};
    int rc = mdb_cursor_get(cursor_, &k, &v, MDB_SET_RANGE);
    if (rc == MDB_NOTFOUND) {
        return std::nullopt;
    }
    if (rc != 0) {
        throw_lmdb(rc, "cursor seek failed");
    }
    return entry{from_val(k), from_val(v)};
}

void cursor::del() {
    if (int rc = mdb_cursor_del(cursor_, 0); rc != 0) {
        throw_lmdb(rc, "cursor delete failed");
    }
}

}  // namespace idem
