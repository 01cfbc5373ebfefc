#pragma once

// Event-log files as a source: what a run over logs reads, what it reports, and how a log is
// named as a checkpoint source and as a transport. consume.hpp applies logs to a live store,
// rebuild.hpp replaces a store with what its logs say.
//
// A run reads the logs in order and applies them in batches with the live path's rules
// (inbox, sequences, contributing sets, dead letters): a log holds redeliveries too.

#include <idem/engine/health.hpp>
#include <idem/projections/store.hpp>
#include <idem/storage/event_log.hpp>
#include <idem/storage/log_position.hpp>

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
    /// Set: each batch and the unread bytes of each log are reported to it (the watchdog of a
    /// followed log; docs/OPERATIONS.md "Stalls and lag"). It must outlive the run.
    health_monitor* health = nullptr;
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

/// Returns the transport a log's msgids belong to by default: its file name without rotation
/// suffixes ("/var/log/orders.jsonl.2" -> "orders.jsonl"), so a log's rotations share one.
std::string log_transport(const std::filesystem::path& log);

}  // namespace idem
