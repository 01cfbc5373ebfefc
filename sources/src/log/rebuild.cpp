// An offline rebuild: a bulk build of the logs into a fresh environment beside the target,
// one sync, then one atomic swap of the two directories.

#include <idem/sources/rebuild.hpp>
#include <idem/projections/store.hpp>
#include <idem/projections/store_hooks.hpp>

#include "log_run.hpp"

#include <idem/storage/crash_point.hpp>
#include <idem/storage/error.hpp>
#include <idem/storage/store_dir.hpp>
#include <idem/storage/writer_lock.hpp>

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

namespace idem {

namespace {

// Whether path starts with an LMDB meta page: a 16-byte page header, then the magic 0xBEEFC0DE
// (in the writing machine's byte order). An empty file is an environment never written yet.
bool lmdb_file(const std::filesystem::path& path) {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) return false;
    unsigned char head[20] = {};
    const auto n = std::fread(head, 1, sizeof head, f);
    std::fclose(f);
    if (n == 0) return true;
    if (n < sizeof head) return false;
    const bool little = head[16] == 0xde && head[17] == 0xc0 && head[18] == 0xef && head[19] == 0xbe;
    const bool big = head[16] == 0xbe && head[17] == 0xef && head[18] == 0xc0 && head[19] == 0xde;
    return little || big;
}

// Refuses a target that is not a store's directory: the rebuild replaces it and deletes the old one.
void check_rebuild_target(const std::filesystem::path& target) {
    if (!std::filesystem::exists(target)) return;
    if (!std::filesystem::is_directory(target)) {
        throw_error(errc::invalid_argument, target.string() + ": exists and is not a directory");
    }
    if (auto other = foreign_files(target); !other.empty()) {
        std::string names;
        for (std::size_t i = 0; i < other.size() && i < 5; ++i) names += (i ? ", " : "") + other[i];
        if (other.size() > 5) names += ", ...";
        throw_error(errc::invalid_argument,
                    target.string() + ": holds files that are not part of an idem store (" + names +
                        "); a rebuild replaces the whole directory, so it is refused: give the store a "
                        "directory of its own");
    }
    if (std::filesystem::exists(target / "data.mdb") && !lmdb_file(target / "data.mdb")) {
        throw_error(errc::invalid_argument, target.string() +
                                                ": its data.mdb is not an LMDB file (no LMDB meta page); "
                                                "not replacing it");
    }
}

// Refuses to undo what operators did (release, redrive): those decisions are in the store's
// audit, not in the logs. A store that cannot be read is rebuilt: that is how it is repaired.
void check_operator_actions(const std::filesystem::path& target, const rebuild_options& options) {
    if (options.discard_operator_actions || detail::file_size_or_zero(target / "data.mdb") == 0) return;
    std::vector<operator_action> actions;
    try {
        actions = snapshot::open(target).consumer(options.store.consumer).operator_actions();
    } catch (const std::exception&) {
        return;
    }
    std::erase_if(actions, [](const operator_action& a) { return !a.changes_state(); });  // pauses, resumes
    if (actions.empty()) return;
    std::string listed;
    for (std::size_t i = 0; i < actions.size() && i < 3; ++i) {
        const auto& a = actions[i];
        listed += (i ? "; " : "") + a.action + (a.stream.empty() ? "" : " of stream '" + a.stream + "'") +
                  " in commit " + std::to_string(a.commit) + (a.note.empty() ? "" : " ('" + a.note + "')");
    }
    if (actions.size() > 3) listed += "; ...";
    throw_error(errc::invalid_argument,
                target.string() + ": holds " + std::to_string(actions.size()) + " operator action" +
                    (actions.size() == 1 ? "" : "s") + " (" + listed +
                    ") that no log holds; a rebuild from the logs would undo " +
                    (actions.size() == 1 ? "it" : "them") +
                    " (released streams would wait for their gaps again). Rebuild with "
                    "--discard-operator-actions, then repeat what is still needed (idem audit lists them)");
}

}  // namespace

std::filesystem::path normalized_dir(const std::filesystem::path& dir) {
    auto p = std::filesystem::absolute(dir).lexically_normal();
    if (!p.has_filename()) p = p.parent_path();  // "data/" names "data"
    return p;
}

log_run_result build(const rebuild_options& options) {
    const auto& dir = options.store.path;
    if (std::filesystem::exists(dir) && !std::filesystem::is_empty(dir)) {
        throw_error(errc::invalid_argument, dir.string() + ": a build needs a new, empty directory");
    }
    for (const auto& log : options.logs) {
        if (!std::filesystem::exists(log)) {
            throw std::system_error(ENOENT, std::system_category(), log.string() + ": cannot read the log");
        }
    }
    auto so = options.store;
    so.sync = durability::none;  // one sync at the end instead of one per batch
    // A bulk build cannot grow the map half way: reserve address space for the logs' content
    // several times over (the file only grows as it is written).
    std::uint64_t log_bytes = 0;
    for (const auto& log : options.logs) log_bytes += detail::file_size_or_zero(log);
    so.tuning.map_size = std::min<std::size_t>(so.tuning.max_map_size, std::max<std::size_t>(so.tuning.map_size, 8 * log_bytes));
    log_run_result result;
    {
        store s{so};
        if (options.setup) options.setup(s);
        if (!options.succeeds_store.empty()) s.succeed(options.succeeds_store, options.succeeds_after_commit);
        s.begin_bulk(options.memory_budget);
        detail::log_run run{s, options};
        result = run.run(false, false, {}, options.stop);
        if (options.stop != nullptr && options.stop->load()) {
            throw std::system_error(std::make_error_code(std::errc::operation_canceled),
                                    "stopped before the build was complete; nothing was replaced");
        }
        s.end_bulk();
        result.stats = s.read().consumer(so.consumer).stats();
        result.run = result.stats;  // a build starts from nothing
        detail::store_env(s)->sync(true);
    }
    sync_dir(normalized_dir(dir).parent_path());
    return result;
}

namespace {

// The directory a rebuild replaces: dir itself, or the store a symbolic link at dir points to.
// The swap renames directories, and a rename replaces a link rather than what it points to: a
// build swapped in at the link would leave the store behind it as it was, and the link gone.
std::filesystem::path rebuild_target(const std::filesystem::path& dir) {
    auto target = normalized_dir(dir);
    if (target == target.root_path()) throw_error(errc::invalid_argument, "rebuild: no target directory given");
    if (!std::filesystem::is_symlink(target)) return target;
    std::error_code ec;
    auto resolved = std::filesystem::canonical(target, ec);
    if (ec) {
        throw_error(errc::invalid_argument, target.string() + ": is a symbolic link to " +
                                                std::filesystem::read_symlink(target, ec).string() +
                                                ", which does not exist; give the store's directory itself");
    }
    if (resolved == resolved.root_path()) throw_error(errc::invalid_argument, target.string() + ": links to /");
    return resolved;
}

}  // namespace

log_run_result rebuild(const rebuild_options& options) {
    const auto target = rebuild_target(options.store.path);
    check_rebuild_target(target);
    std::error_code ec;
    const bool created = !std::filesystem::exists(target);
    std::filesystem::create_directories(target, ec);
    if (ec) throw std::system_error(ec, "cannot create " + target.string());
    // The target's writer lock for the whole rebuild: no consumer writes into the store being
    // replaced, and no other rebuild deletes this one's half-built environment. It is held
    // through the swap; a writer that waited for it then finds the new store at the path.
    writer_lock lock{target, options.store.wait_for_writer};
    check_rebuild_target(target);  // again, now that nobody else writes there
    check_operator_actions(target, options);
    auto fresh = target;
    fresh += ".rebuild";
    remove_store_dir(fresh);  // left by a rebuild that was killed: start over
    auto legacy_lock = target;
    legacy_lock += ".rebuild.lock";  // the rebuild lock of earlier versions
    std::filesystem::remove(legacy_lock, ec);

    auto o = options;
    o.store.path = fresh;
    // The new store succeeds the one it replaces: same id, commits numbered on, so that a reader of
    // the change feed finds the reset entries after its position. A store that cannot be read has
    // no feed to continue (a rebuild is how it is repaired).
    if (detail::file_size_or_zero(target / "data.mdb") > 0) {
        try {
            auto old = snapshot::open(target);
            o.succeeds_store = old.store_id();
            o.succeeds_after_commit = old.commit();
        } catch (const std::exception&) {
            o.succeeds_store.clear();
        }
    }
    log_run_result result;
    try {
        result = build(o);
    } catch (...) {
        std::filesystem::remove_all(fresh, ec);  // the target was not touched; leave nothing beside it
        if (created) std::filesystem::remove_all(target, ec);  // holds just the lock this run made
        throw;
    }

    // An operator's pause (idem pause, DIR/idem.pause) holds for the new store too.
    if (std::filesystem::exists(target / "idem.pause")) {
        std::filesystem::copy_file(target / "idem.pause", fresh / "idem.pause",
                                   std::filesystem::copy_options::overwrite_existing);
    }
    // Swap in one rename: the target is the old or the new environment, never a mix.
    crash_point("during_swap");
    if (::renameat2(AT_FDCWD, fresh.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) != 0) {
        const int e = errno;
        std::filesystem::remove_all(fresh, ec);
        throw std::system_error(e, std::system_category(), "cannot swap " + fresh.string() + " into " + target.string());
    }
    sync_dir(target.parent_path());
    crash_point("after_swap");
    remove_store_dir(fresh);  // now the previous environment
    return result;
}

}  // namespace idem
