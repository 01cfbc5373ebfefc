#pragma once

// An offline rebuild of a store from its event logs, replacing the environment atomically.
//
//   idem::rebuild_options o;
//   o.store.path = "data";
//   o.store.consumer = "positions-projector";
//   o.logs = {"fills.jsonl"};
//   o.setup = [](idem::store& s) { s.add(positions()); };
//   auto result = idem::rebuild(o);   // "data" now holds exactly what the logs say
//
// The rebuild writes into a fresh environment beside the target without syncing per batch,
// syncs once, then swaps directories with one rename, so the target is always either the old
// or the new complete state.

#include <idem/sources/log_source.hpp>

#include <cstddef>
#include <filesystem>

namespace idem {

/// Options of an offline rebuild.
struct rebuild_options : log_run_options {
    rebuild_options() { batch = 10'000; }
    /// Rows are aggregated in memory up to about this many bytes, then written in key order.
    std::size_t memory_budget = std::size_t{1} << 30;
    /// Operator actions recorded in the target (release, redrive: `idem audit`) are decisions no
    /// log holds, which a rebuild would undo: it refuses such a target unless this is set.
    bool discard_operator_actions = false;
    /// The store a build succeeds (store::succeed): its id, and the last commit it made. rebuild()
    /// sets it from the target it replaces, so the target's change feed readers find the reset
    /// entries after their position; empty: a store of its own.
    std::string succeeds_store;
    std::uint64_t succeeds_after_commit = 0;
};

/// Returns dir absolute and normalized, without a trailing separator ("data/" -> "/cwd/data").
std::filesystem::path normalized_dir(const std::filesystem::path& dir);

/// Rebuilds options.store.path from the logs: builds a fresh environment beside it
/// ("<path>.rebuild"), syncs it once, and swaps the two directories with one atomic rename.
/// A rebuild killed at any point leaves the target untouched; rerunning it starts over. Holds
/// the target's writer lock throughout, so a store another process writes (a consumer, another
/// rebuild) is refused with errc::store_locked (or waited for: store.wait_for_writer). Refuses
/// a target that holds anything but a store's files (a rebuild replaces the whole directory),
/// and one whose consumer holds operator actions (see discard_operator_actions). Throws std::system_error naming the file and the cause on an I/O or storage failure.
log_run_result rebuild(const rebuild_options& options);

/// Builds an environment at options.store.path (which must not exist yet or be empty) from
/// the logs in one bulk build (store::begin_bulk), synced once at the end; no swap.
/// rebuild() and verify use it.
log_run_result build(const rebuild_options& options);

}  // namespace idem
