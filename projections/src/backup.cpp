// A backup: LMDB's compacting copy of one commit, checked before it is given its name.

#include <idem/projections/backup.hpp>

#include "store_internal.hpp"

#include <idem/projections/store.hpp>
#include <idem/storage/error.hpp>
#include <idem/storage/lmdb.hpp>
#include <idem/storage/page_check.hpp>
#include <idem/storage/store_dir.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <system_error>

namespace idem {

namespace {

[[noreturn]] void throw_errno(int err, const std::string& what) {
    throw std::system_error(err, std::system_category(), what);
}

/// Refuses an out that exists and is not an empty directory: a backup never replaces anything.
void check_out(const std::filesystem::path& out) {
    std::error_code ec;
    const auto st = std::filesystem::symlink_status(out, ec);
    if (!std::filesystem::exists(st)) return;
    if (!std::filesystem::is_directory(st) || !std::filesystem::is_empty(out, ec)) {
        throw_error(errc::invalid_argument,
                    out.string() + ": exists and is not an empty directory; a backup never replaces anything: "
                                   "give a new path");
    }
}

/// Writes the compacting copy of env's newest commit into file; returns nothing, throws naming db.
void copy_into(environment& env, const std::filesystem::path& db, const std::filesystem::path& file) {
    for (int attempt = 0;; ++attempt) {
        const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) throw_errno(errno, "cannot create " + file.string());
        int rc = 0;
        {
            // Held across the copy: this process never resizes the map under it (a writer of the
            // same store in this process waits); the copy begins a read transaction of its own.
            read_txn hold{env};
            rc = mdb_env_copyfd2(env.handle(), fd, MDB_CP_COMPACT);
        }
        if (rc == 0 && ::fsync(fd) != 0) rc = errno;
        ::close(fd);
        if (rc == 0) return;
        // Another process grew the map between the two transactions' begins: begin again.
        if (lmdb_error(rc) == errc::map_resized && attempt < 3) continue;
        throw_lmdb(rc, "cannot copy " + (db / "data.mdb").string() + " into " + file.string());
    }
}

}  // namespace

backup_result backup(const std::filesystem::path& db, const std::filesystem::path& out) {
    const auto started = std::chrono::steady_clock::now();
    const auto data = db / "data.mdb";
    std::error_code ec;
    if (!std::filesystem::is_regular_file(data, ec)) {
        throw_error(errc::invalid_argument, data.string() + ": no such file; " + db.string() + " is not a store");
    }
    check_out(out);
    auto parent = out.parent_path();
    if (parent.empty()) parent = ".";
    if (!std::filesystem::is_directory(parent, ec)) {
        throw_error(errc::invalid_argument, parent.string() + ": no such directory (the backup's place " + out.string() + ")");
    }
    const auto infix = std::string(".partial-");
    remove_leftovers(out, infix);  // of killed backups
    const auto partial = parent / (out.filename().string() + infix + std::to_string(::getpid()));
    std::filesystem::remove_all(partial, ec);

    backup_result result;
    result.path = out;
    try {
        std::filesystem::create_directory(partial);
        const auto copy = partial / "data.mdb";
        {
            // Opening checks data.mdb against its meta pages: a file cut short is refused here.
            environment_options eo;
            eo.read_only = true;
            auto env = environment::open(db, eo);
            copy_into(*env, db, copy);
        }
        {
            // The copy goes on as a store of its own: a new identity, and what it copies. Its next
            // commits are numbered after the copied commit, like commits the original may have
            // made since: a change feed reader (the relay) tells the two apart by the identity.
            const auto copied = snapshot::open(partial).commit();
            auto env = environment::open(partial, environment_options{});
            detail::mark_as_copy(*env, copied);
        }
        std::filesystem::remove(partial / writer_lock_file, ec);  // taken by that write
        // The check verify --store runs. The copy is rewritten page by page (compacted), so
        // damage the copy carries over from db shows here; no writer changes the copy.
        const auto report = check_environment(copy);
        if (!report.sound()) {
            throw_error(errc::store_damaged,
                        data.string() + ": its copy is damaged: " + std::to_string(report.problem_count) + " problem" +
                            (report.problem_count == 1 ? "" : "s") + ", first: " + report.first_problems() +
                            "; the store is damaged (verify --store describes it); no backup was written");
        }
        result.pages = report.pages;
        result.bytes = std::filesystem::file_size(copy);
        result.commit = snapshot::open(partial).commit();  // the copy opens as a store
        std::filesystem::remove(partial / "lock.mdb", ec);   // made by that open; holds no state
        sync_dir(partial);
        std::filesystem::rename(partial, out);
        sync_dir(parent);
    } catch (...) {
        std::filesystem::remove_all(partial, ec);
        throw;
    }
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    return result;
}

}  // namespace idem
