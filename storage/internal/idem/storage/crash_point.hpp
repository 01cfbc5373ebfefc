#pragma once

// Named crash points: places in the apply path where a test can have the process killed
// (SIGKILL, as a power cut or the OOM killer would) on the Nth time it passes there.
//
// A point is armed by the environment variable IDEM_CRASH_AT=<name>:<N> (for example
// IDEM_CRASH_AT=before_commit:3), read once per process, or by arm_crash_point() in a
// forked child (the chaos test kit); unarmed, a point costs
// one predictable branch. Every build has them, so a crash test drives the binaries a
// user runs, not a special build.
//
// The points (docs/RUNTIME.md, "Crash points"):
//   after_decode       a batch is parsed and decoded, nothing of it is applied yet
//   mid_batch          half of a batch's deliveries are applied in the open transaction
//   before_commit      the transaction is complete and not yet committed
//   after_commit       committed (and synced) but not yet acknowledged or reported
//   during_prune       an inbox/contributor prune transaction has deleted some entries
//   during_map_resize  the map is being grown (before mdb_env_set_mapsize)
//   during_swap        a rebuild (or a partition's replay) is complete beside its target, about to be swapped in
//   after_swap         the rebuild was swapped in, the previous environment not yet removed
//   after_lock         a writer holds the store's lock and has not opened the data file yet
//   during_create      a new data file is complete beside the store, not yet renamed in
//   after_rotated_log  a rotated log's old file is committed as finished, its new file not yet begun
//   during_replay      a partition's replay has applied a batch into its bulk build, not yet committed

#include <cstdint>
#include <string_view>

namespace idem {

namespace detail {
/// Whether IDEM_CRASH_AT is set in this process (read once).
bool crash_points_armed() noexcept;
/// Counts a hit of name and kills the process if it is the armed point's Nth.
void crash_point_hit(std::string_view name) noexcept;
/// Arms name at its Nth hit from now on, replacing what IDEM_CRASH_AT armed (a forked child
/// that is to die at a point: <idem/testing.hpp>). Not thread-safe: call it before other threads pass points.
void arm_crash_point(std::string_view name, std::uint64_t nth);
}  // namespace detail

/// Passes the named crash point: kills the process with SIGKILL if IDEM_CRASH_AT names it
/// and this is its Nth hit; does nothing otherwise.
inline void crash_point(std::string_view name) noexcept {
    if (detail::crash_points_armed()) detail::crash_point_hit(name);
}

}  // namespace idem
