#pragma once

// Event logs through the apply path: an offline rebuild that replaces an environment
// atomically, a resumable consumer of a log file, and a comparison of two environments.
//
//   idem::rebuild_options o;
//   o.store.path = "data";
//   o.store.consumer = "positions-projector";
//   o.logs = {"fills.jsonl"};
//   o.setup = [](idem::store& s) { s.add(positions()); };
//   auto result = idem::rebuild(o);   // "data" now holds exactly what the logs say
//
// The rebuild applies events with the live path's rules (inbox, sequences, contributing
// sets, dead letters): a log holds redeliveries too. It writes into a fresh environment
// beside the target without syncing per batch, syncs once, then swaps directories with one
// rename, so the target is always either the old or the new complete state.

#include <idem/projections/store.hpp>
#include <idem/storage/event_log.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace idem {

/// How far a log run has come (for progress bars).
struct log_progress {
    std::uint64_t records = 0;      ///< records read so far, all logs
    std::uint64_t bytes = 0;        ///< bytes read so far, all logs
    std::uint64_t total_bytes = 0;  ///< size of all logs when the run started
    std::chrono::steady_clock::duration elapsed{};
};

/// A log whose last record was cut short (a crash mid-append): it was not applied.
struct torn_log {
    std::filesystem::path log;
    std::uint64_t offset = 0;
    std::string detail;
};

/// Options shared by rebuild and consume.
struct log_run_options {
    store_options store{};                         ///< where and as which consumer (path, consumer, limits)
    std::vector<std::filesystem::path> logs{};     ///< read in this order
    std::function<void(idem::store&)> setup{};     ///< adds the projections
    std::size_t batch = 10'000;                    ///< deliveries per write transaction
    bool skip_bad = false;                         ///< skip corrupt records of binary logs (counted)
    std::optional<log_format> format{};            ///< expected format (default: detected from each file)
    std::function<void(const log_progress&)> progress{};  ///< called after every batch
    const std::atomic<bool>* stop = nullptr;        ///< set to true to stop (consume commits what it read; a build fails)
    /// The transport the logs' msgids belong to (delivery::transport); unset: each log's own,
    /// log_transport(log). Give the same to a consume that continues a rebuild's inbox.
    std::optional<std::string> transport{};
    /// Per log, in the order of logs: read only the records that end at or before this byte
    /// offset (a build of the prefix a store has consumed, for verify). Empty: read every log whole.
    std::vector<std::uint64_t> until{};
};

/// What a run did.
struct log_run_result {
    std::uint64_t records = 0;          ///< records applied (delivered to the store) by this run
    std::uint64_t skipped = 0;          ///< corrupt records skipped (skip_bad)
    std::vector<torn_log> torn{};       ///< logs that end in an incomplete record
    consumer_stats stats{};             ///< the consumer's counters afterwards (store totals)
    consumer_stats run{};               ///< what this run added to them
    std::chrono::steady_clock::duration elapsed{};
};

/// Options of an offline rebuild.
struct rebuild_options : log_run_options {
    rebuild_options() { batch = 10'000; }
    /// Rows are aggregated in memory up to about this many bytes, then written in key order.
    std::size_t memory_budget = std::size_t{1} << 30;
};

/// Returns dir absolute and normalized, without a trailing separator ("data/" -> "/cwd/data").
std::filesystem::path normalized_dir(const std::filesystem::path& dir);

/// Returns the checkpoint source name of a log file (its absolute path, "log:" prefixed); its
/// value is a log_position (<idem/storage/log_position.hpp>).
std::string log_source(const std::filesystem::path& log);

/// Returns the transport a log's msgids belong to by default: its file name without rotation
/// suffixes ("/var/log/orders.jsonl.2" -> "orders.jsonl"), so a log's rotations share one.
std::string log_transport(const std::filesystem::path& log);

/// Rebuilds options.store.path from the logs: builds a fresh environment beside it
/// ("<path>.rebuild"), syncs it once, and swaps the two directories with one atomic rename.
/// A rebuild killed at any point leaves the target untouched; rerunning it starts over. Holds
/// the target's writer lock throughout, so a store another process writes (a consumer, another
/// rebuild) is refused with errc::store_locked (or waited for: store.wait_for_writer). Refuses
/// a target that holds anything but a store's files (a rebuild replaces the whole directory).
/// Throws std::system_error naming the file and the cause on an I/O or storage failure.
log_run_result rebuild(const rebuild_options& options);

/// Builds an environment at options.store.path (which must not exist yet or be empty) from
/// the logs in one bulk build (store::begin_bulk), synced once at the end; no swap.
/// rebuild() and verify use it.
log_run_result build(const rebuild_options& options);

/// Options of a live, resumable consumer of log files.
struct consume_options : log_run_options {
    bool follow = false;                            ///< keep tailing the last log for appended records
    /// Read a log that changed under its checkpoint (truncated, rewritten, replaced) again from
    /// offset 0 instead of failing with errc::log_changed; the inbox recognizes what was applied.
    bool restart_changed_logs = false;
    std::chrono::milliseconds poll{100};            ///< how often a followed log is checked for new records
};

/// Applies the logs to options.store.path, each batch with its log's position (byte offset,
/// file identity, digest of the bytes before it: log_position) as the checkpoint in the same
/// transaction; a rerun resumes exactly after the last commit. A rotated log is finished in
/// its old file, then read in its new one; a log truncated or rewritten under its checkpoint
/// throws errc::log_changed naming it (unless restart_changed_logs). A last record without its
/// end (a writer mid-append) is left for a later run and reported in the result's `torn`.
/// options.stop is checked after every batch.
log_run_result consume(const consume_options& options);

/// One projection's rows summarized.
struct projection_digest {
    std::string projection;
    std::uint64_t rows = 0;
    std::uint64_t digest = 0;  ///< over keys, versions and encoded states, in key order
};

/// The first difference between two environments, if any.
struct comparison {
    std::vector<projection_digest> left, right;
    std::optional<std::string> first_difference;  ///< names the projection and the row
};

/// Compares the named projections of two environments row by row.
comparison compare(const std::filesystem::path& left, const std::filesystem::path& right,
                   const std::vector<std::string>& projections);
/// The same over two snapshots (the paths name them in the difference).
comparison compare(const snapshot& left, const std::filesystem::path& left_name, const snapshot& right,
                   const std::filesystem::path& right_name, const std::vector<std::string>& projections);

/// Returns after minus before, counter by counter (what a run added).
consumer_stats difference(const consumer_stats& after, const consumer_stats& before);

}  // namespace idem
