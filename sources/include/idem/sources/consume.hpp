#pragma once

// A live, resumable consumer of event-log files.
//
//   idem::consume_options o;
//   o.store.path = "data";
//   o.store.consumer = "positions-projector";
//   o.logs = {"fills.jsonl"};
//   o.follow = true;
//   o.setup = [](idem::store& s) { s.add(positions()); };
//   auto result = idem::consume(o);   // resumes after the last commit of an earlier run

#include <idem/sources/log_source.hpp>

#include <chrono>

namespace idem {

/// Options of a live, resumable consumer of log files.
struct consume_options : log_run_options {
    /// At most 25,000 records per commit: a log read as fast as the disk gives it gets large
    /// commits (on the orders defect mix 15% faster than 10,000: each commit rewrites most of
    /// the streams table's leaves whatever its size); a followed log commits what it has
    /// whenever it reaches its end.
    consume_options() { batch = 25'000; }
    bool follow = false;                            ///< keep tailing the last log for appended records
    /// Read a log that changed under its checkpoint (truncated, rewritten, replaced) again from
    /// offset 0 instead of failing with errc::log_changed; the inbox recognizes what was applied.
    bool restart_changed_logs = false;
    std::chrono::milliseconds poll{100};            ///< how often a followed log is checked for new records
    /// Following, how long a rotated log's old file must go without growing before it is
    /// finished: a writer keeps appending to it until it reopens the log (logrotate's `create`
    /// mode), and what it appends meanwhile is read before the new file. 0: finished at once.
    std::chrono::milliseconds rotation_grace{5000};
};

/// Applies the logs to options.store.path, each batch with its log's position (byte offset,
/// file identity, digest of the bytes before it: log_position) as the checkpoint in the same
/// transaction; a rerun resumes exactly after the last commit. A rotated log is finished in
/// its old file (following, once it has not grown for rotation_grace), then read in its new
/// one; a log truncated or rewritten under its checkpoint, between runs or while it is
/// followed, throws errc::log_changed naming it (unless restart_changed_logs). A last record without its
/// end (a writer mid-append) is left for a later run and reported in the result's `torn`.
/// options.stop is checked after every batch.
log_run_result consume(const consume_options& options);

/// Returns after minus before, counter by counter (what a run added).
consumer_stats difference(const consumer_stats& after, const consumer_stats& before);

}  // namespace idem
