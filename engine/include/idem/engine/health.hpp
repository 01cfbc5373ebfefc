#pragma once

// Whether a consumer is doing its work: the facts its writer and its sources report, and the
// watchdog's verdict over them. A consumer is stalled when work waits and nothing is committed
// for longer than stall_after (a handler that hangs, a disk that does not answer, input that is
// there but not read), when a source has failed for that long (a broker that is gone), or when
// a stream's gap has stayed parked that long. A consumer with nothing to do is idle, never
// stalled. docs/OPERATIONS.md ("Stalls and lag") says what each reason means.
//
//   idem::health_monitor health{std::chrono::seconds(60)};
//   health.source("fills.jsonl", unread_bytes, "bytes");   // from the source's reader
//   auto r = health.report(store.read(), "idem");          // r.state, r.reason
//
// The engine keeps one (engine::health()); a program that applies through a store directly
// (the log follower) keeps its own. Thread safety: every member may be called from any thread.

#include <idem/projections/operator_results.hpp>
#include <idem/projections/snapshot.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace idem {

/// What a consumer is doing.
enum class health_state {
    idle,     ///< nothing waits; nothing to do
    running,  ///< work waits and commits follow
    stalled,  ///< work waits and nothing is committed, a source fails, or a gap stays parked
    paused,   ///< an operator paused it (idem pause)
};
std::string_view to_string(health_state s);

/// The watchdog's verdict at one moment, with the figures it was drawn from.
struct health_report {
    health_state state = health_state::idle;
    std::string reason{};                ///< stalled or paused: why, in words (the first reason found)
    std::uint64_t last_commit = 0;       ///< the last commit this process made (0: none yet)
    double seconds_since_commit = -1;    ///< since that commit (-1: none yet)
    std::int64_t last_commit_unix_ns = 0;  ///< its wall time (0: none yet)
    std::uint64_t queued = 0;            ///< deliveries accepted and not yet committed
    double oldest_queued_seconds = 0;    ///< how long the oldest of them has waited (0: none)
    std::uint64_t lag_events = 0;        ///< input the sources know is waiting, in events
    std::uint64_t lag_bytes = 0;         ///< input the sources know is waiting, in bytes (logs)
    /// Now minus the highest event time applied, while input waits; 0 when caught up (an idle
    /// consumer has no lag, however old its last event).
    double lag_seconds = 0;
    std::uint64_t event_time_ns = 0;     ///< the highest event time applied (0: none)
    std::uint64_t parked_streams = 0;    ///< streams holding events behind a gap
    double oldest_gap_seconds = 0;       ///< how long the oldest of those gaps has been parked
    std::string oldest_gap_stream{};     ///< its stream
    std::uint64_t failing_sources = 0;   ///< sources whose last attempt failed
};

/// Writes a report as one JSON object (state, reason, and every figure).
std::string to_json(const health_report& r);

/// Collects what a consumer's writer and sources report and judges it (see the file comment).
class health_monitor {
public:
    using clock = std::chrono::steady_clock;

    explicit health_monitor(std::chrono::milliseconds stall_after = std::chrono::seconds(60));

    /// The writer took a batch of n deliveries.
    void batch_began(std::size_t n);
    /// The writer finished that batch; committed: as commit (false: it failed, nothing applied).
    void batch_ended(bool committed, std::uint64_t commit = 0);
    /// Deliveries accepted and waiting for the writer: how many, and since when the oldest waits.
    void queued(std::size_t n, std::optional<clock::time_point> oldest);
    /// A source's input known to be waiting (0: caught up, or it cannot know), in unit ("events"
    /// or "bytes"), and its error ("": its last attempt worked). A source reports as often as it likes.
    void source(std::string_view name, std::uint64_t pending, std::string_view unit = "events",
                std::string_view error = {});
    /// Paused by an operator with a reason (set), or not (nullopt). Sources stop fetching at
    /// their next batch boundary while it is set (idem pause); the watchdog says paused.
    void paused(std::optional<std::string> reason);
    /// The pause's reason while paused.
    std::optional<std::string> pause_reason() const;
    /// Called by a source that fetches in a loop of its own, once before it starts: the
    /// watchdog then says paused only once that source has taken the pause (pause_taken), so
    /// that nothing is fetched after paused is reported (a fetch in flight ends first).
    void pauses_at_boundaries();
    /// Called by such a source when it stops at a batch boundary because of the pause.
    void pause_taken();

    /// Judges now, reading the highest event time and the parked streams of consumer from s.
    health_report report(const snapshot& s, const std::string& consumer) const;
    /// Where report() without a snapshot reads them: set by the owner of the store while it is
    /// open, cleared (an empty read) before it closes; a clear waits for a read in progress.
    void reader(std::function<snapshot()> read, std::string consumer = {});
    /// Judges now with the reader's snapshot (without one: no event time, no parked streams).
    health_report report() const;
    /// The threshold.
    std::chrono::milliseconds stall_after() const noexcept { return stall_after_; }

private:
    struct source_state {
        std::uint64_t pending = 0;
        std::string unit;
        std::string error;
        clock::time_point waiting_since{};  // when pending last rose from 0 (or the last progress)
        clock::time_point failing_since{};
    };

    std::chrono::milliseconds stall_after_;
    mutable std::mutex m_;
    clock::time_point started_ = clock::now();
    std::optional<clock::time_point> batch_since_;
    std::size_t batch_size_ = 0;
    std::optional<clock::time_point> last_commit_at_;
    std::int64_t last_commit_unix_ns_ = 0;
    std::uint64_t last_commit_ = 0;
    std::size_t queued_ = 0;
    std::optional<clock::time_point> oldest_queued_;
    std::map<std::string, source_state, std::less<>> sources_;
    std::optional<std::string> paused_;
    bool awaits_pause_ = false;  // a source takes the pause at its boundary (pauses_at_boundaries)
    bool pause_taken_ = false;
    mutable std::map<std::string, clock::time_point, std::less<>> gaps_seen_;  // stream -> first seen parked
    mutable std::mutex reader_m_;  // held while the reader reads: the store outlives the read
    std::function<snapshot()> read_;
    std::string consumer_;

    health_report judge(std::uint64_t event_time, const std::vector<parked_stream>& parked) const;
};

}  // namespace idem
