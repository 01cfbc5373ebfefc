#pragma once

// The asynchronous engine: an Asio front over the synchronous apply path. One writer
// thread owns every LMDB write transaction and batches concurrent submissions (group
// commit); a submission completes only after the commit that recorded it is durable.

#include <idem/engine/health.hpp>
#include <idem/engine/subscription.hpp>
#include <idem/projections/store.hpp>

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/execution/outstanding_work.hpp>
#include <boost/asio/prefer.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

namespace idem {

/// Options of an engine.
struct engine_options {
    /// The environment, consumer and apply rules; store.sync picks the durability mode:
    /// full (every batch is fsync'ed, then completed), periodic (at most one commit, and so
    /// one fsync, per sync_interval: deliveries arriving meanwhile join the next batch and
    /// complete after its fsync, so a completion still means durable), none (never fsync:
    /// a completion means committed, not durable — for rebuilds and tests only).
    store_options store{};
    std::size_t max_batch = 4096;                     ///< deliveries per transaction at most
    std::chrono::microseconds max_delay{0};           ///< how long a busy writer lingers to fill a batch
    std::size_t max_in_flight = 65536;                ///< accepted and not completed; past it submissions wait
    std::chrono::milliseconds sync_interval{10};      ///< periodic durability: the shortest time between commits
    /// With store.retention set, every batch removes up to retention.prune_per_batch expired
    /// entries in its own transaction, and an idle writer runs bounded steps (prune_step, each
    /// its own commit) every prune_interval until nothing has expired.
    std::chrono::milliseconds prune_interval{1000};
    prune_limits prune_step{};
    /// The watchdog's threshold (health()): work waiting with no commit, a source failing, or a
    /// gap parked for longer than this makes the consumer stalled.
    std::chrono::milliseconds stall_after{std::chrono::seconds(60)};
};

/// A distribution summary over the most recent samples.
struct distribution {
    double p50 = 0;
    double p99 = 0;
    double max = 0;
    std::uint64_t count = 0;  ///< samples ever recorded
};

/// A Prometheus histogram: counts of observations at most each bound (cumulative when rendered).
struct histogram {
    std::vector<double> bounds{};         ///< upper bounds, ascending (+Inf is implied)
    std::vector<std::uint64_t> counts{};  ///< observations per bucket (bounds.size() + 1, the last: past every bound)
    double sum = 0;
    std::uint64_t count = 0;
    void add(double v);
};
/// Buckets for latencies in seconds, 100 us to 10 s.
histogram latency_histogram();

/// Counters and distributions of a running engine (since it was constructed).
struct engine_stats {
    std::array<std::uint64_t, outcome_kinds> outcomes{};  ///< completed deliveries by outcome_kind
    std::uint64_t failed = 0;         ///< deliveries completed with an error
    std::uint64_t batches = 0;        ///< committed batches
    std::uint64_t syncs = 0;          ///< commits synced to disk (all of them unless durability is none)
    std::uint64_t last_commit = 0;    ///< commit number of the last committed batch
    std::uint64_t durable_commit = 0; ///< last commit known durable (completions never run ahead of it)
    std::size_t queue_depth = 0;      ///< accepted, waiting for the writer
    std::size_t waiting = 0;          ///< submitted past max_in_flight, not yet accepted
    std::size_t in_flight = 0;        ///< accepted and not yet completed
    distribution batch_size;          ///< deliveries per committed batch
    distribution commit_seconds;      ///< apply + commit (+ sync) time per batch
    distribution ack_seconds;         ///< submission to completion per delivery
    std::uint64_t pruned_ids = 0;           ///< inbox entries pruned by separate steps (consumer_stats: all)
    std::uint64_t pruned_contributors = 0;  ///< contributing-set entries pruned by separate steps
    std::uint64_t prune_failures = 0;       ///< prune steps that failed (retried at the next interval)
    distribution prune_seconds;             ///< time per prune step (the writer is busy meanwhile)
    histogram commit_histogram;             ///< apply + commit (+ sync) time per batch, since the start
    histogram ack_histogram;                ///< submission to completion per delivery, since the start
};

/// Applies deliveries asynchronously with group commit over a store.
///
/// Thread safety: async_apply, async_flush, async_stop, read and stats may be called from
/// any thread. add() must be called before the first submission. async_apply parses the
/// envelope, decodes its payload and runs the projections' key and effect-key functions on
/// the calling thread (store::prepare) before queueing it: those functions must be safe to
/// call concurrently; the handlers that change state run on the writer thread only.
class engine {
public:
    using executor_type = boost::asio::any_io_executor;
    /// The completion signature of async_apply.
    using apply_signature = void(std::error_code, outcome);

    /// Opens the store and starts the writer thread. Completion handlers without an
    /// associated executor run on ex. Throws std::system_error naming the path.
    engine(executor_type ex, engine_options options);
    /// Stops as async_stop does and waits for the writer: accepted work is committed and
    /// completed (handlers are posted; they run if their executor still runs).
    ~engine();
    engine(const engine&) = delete;
    engine& operator=(const engine&) = delete;

    /// Adds a projection; only before the first submission.
    template <class State>
    engine& add(projection<State>&& p) {
        add_projections([&p](store& s) { s.add(std::move(p)); });
        return *this;
    }
    /// Adds projections through a function that adds them to the engine's store (a tool's
    /// setup, which holds its projections type-erased); only before the first submission.
    void add_projections(const std::function<void(store&)>& add);

    /// Applies one delivery; completes with (error, outcome) after the commit that recorded
    /// it is durable as the durability mode defines. Works with any completion token
    /// (callback, use_future, use_awaitable, deferred). The handler is never invoked from
    /// within this function; it runs on its associated executor (default: the engine's).
    /// Errors: operation_canceled (ECANCELED) after stop; the storage error of a batch that
    /// failed to commit (then no delivery of that batch was applied). With use_future and
    /// use_awaitable the result is a std::tuple<std::error_code, outcome>.
    template <boost::asio::completion_token_for<apply_signature> CompletionToken>
    auto async_apply(delivery d, CompletionToken&& token) {
        return boost::asio::async_initiate<CompletionToken, apply_signature>(
            [this](auto handler, delivery&& body) {
                auto ex = tracked(boost::asio::get_associated_executor(handler, executor_));
                submit(std::move(body), boost::asio::any_completion_handler<apply_signature>(std::move(handler)),
                       std::move(ex));
            },
            token, std::move(d));
    }

    /// Applies one delivery as async_apply(d, token) does, and commits at as its source's
    /// checkpoint in the same transaction. Deliveries of one batch that name the same source
    /// leave one checkpoint: the highest position if keep_highest (a broker's redeliveries come
    /// out of order), else the last submitted.
    template <boost::asio::completion_token_for<apply_signature> CompletionToken>
    auto async_apply(delivery d, checkpoint at, CompletionToken&& token) {
        return boost::asio::async_initiate<CompletionToken, apply_signature>(
            [this](auto handler, delivery&& body, checkpoint&& position) {
                auto ex = tracked(boost::asio::get_associated_executor(handler, executor_));
                submit(std::move(body), boost::asio::any_completion_handler<apply_signature>(std::move(handler)),
                       std::move(ex), std::move(position));
            },
            token, std::move(d), std::move(at));
    }

    /// Completes (with no error, or the engine's failure) once everything submitted before it
    /// has completed and is durable.
    template <boost::asio::completion_token_for<void(std::error_code)> CompletionToken>
    auto async_flush(CompletionToken&& token) {
        return boost::asio::async_initiate<CompletionToken, void(std::error_code)>(
            [this](auto handler) {
                auto ex = tracked(boost::asio::get_associated_executor(handler, executor_));
                flush(boost::asio::any_completion_handler<void(std::error_code)>(std::move(handler)), std::move(ex),
                      false);
            },
            token);
    }

    /// Stops accepting: work accepted before it is committed and completed, everything
    /// submitted after it completes with operation_aborted; completes when the writer is done.
    template <boost::asio::completion_token_for<void(std::error_code)> CompletionToken>
    auto async_stop(CompletionToken&& token) {
        return boost::asio::async_initiate<CompletionToken, void(std::error_code)>(
            [this](auto handler) {
                auto ex = tracked(boost::asio::get_associated_executor(handler, executor_));
                flush(boost::asio::any_completion_handler<void(std::error_code)>(std::move(handler)), std::move(ex),
                      true);
            },
            token);
    }

    /// Runs fn with the engine's store on the writer thread, between batches: everything
    /// submitted before it is committed first, nothing submitted after it is applied meanwhile.
    /// Completes with no error, or the code of the std::system_error fn threw (another exception:
    /// errc::storage_failed), or the engine's failure. For operator actions on a running engine
    /// (store::record_action, release, redrive); a commit fn makes is seen by read() and
    /// subscriptions once it completes.
    template <boost::asio::completion_token_for<void(std::error_code)> CompletionToken>
    auto async_operate(std::function<void(store&)> fn, CompletionToken&& token) {
        return boost::asio::async_initiate<CompletionToken, void(std::error_code)>(
            [this](auto handler, std::function<void(store&)>&& task) {
                auto ex = tracked(boost::asio::get_associated_executor(handler, executor_));
                operate(std::move(task), boost::asio::any_completion_handler<void(std::error_code)>(std::move(handler)),
                        std::move(ex));
            },
            token, std::move(fn));
    }

    /// Completes (with no error) once commit is durable as the durability mode defines, so that
    /// read() then sees it (read-your-writes across threads: an outcome's commit, then this).
    /// The handler is never invoked from within this function, also when the commit is durable
    /// already. Errors: operation_canceled (ECANCELED) if the engine stops before the commit is durable.
    template <boost::asio::completion_token_for<void(std::error_code)> CompletionToken>
    auto async_wait_commit(std::uint64_t commit, CompletionToken&& token) {
        return boost::asio::async_initiate<CompletionToken, void(std::error_code)>(
            [this](auto handler, std::uint64_t c) {
                auto ex = tracked(boost::asio::get_associated_executor(handler, executor_));
                wait_commit(c, boost::asio::any_completion_handler<void(std::error_code)>(std::move(handler)),
                            std::move(ex));
            },
            token, commit);
    }

    /// Returns a subscription to the change feed after a position (default: from the feed's
    /// start), whose async_next delivers whole durable commits of at most about limit entries.
    /// Thread safety: may be called from any thread, before or after the first submission.
    subscription subscribe(change_position after = {0, UINT32_MAX}, std::size_t limit = 1000);
    /// Returns a subscription to the change feed after every entry of commit after_commit.
    subscription subscribe(std::uint64_t after_commit, std::size_t limit = 1000);

    /// Returns a snapshot of the committed state. Taken after an outcome arrived, it includes
    /// that outcome's commit.
    snapshot read() const;
    /// Returns a snapshot that includes commit at_least; throws errc::invalid_argument if the
    /// environment has not reached it (the commit number came from elsewhere).
    snapshot read(std::uint64_t at_least) const;
    /// Returns the counters and distributions.
    engine_stats stats() const;
    /// Renders stats() and health() in the Prometheus text exposition format.
    std::string prometheus() const;
    /// Judges whether the consumer does its work (idle, running, stalled, paused; docs/OPERATIONS.md).
    health_report health() const;
    /// The watchdog the engine's writer reports to; sources report their input and errors to
    /// it, and a pause is set on it.
    health_monitor& monitor() noexcept;
    /// Returns the last commit known durable (cheap, unlike stats(): for a check per completion).
    std::uint64_t durable_commit() const;
    /// Returns the options the engine was opened with.
    const engine_options& options() const noexcept;
    /// Returns the executor completions default to.
    const executor_type& get_executor() const noexcept { return executor_; }

    struct impl;  ///< opaque: the implementation's state

private:
    template <class Executor>
    static executor_type tracked(const Executor& ex) {
        return boost::asio::prefer(ex, boost::asio::execution::outstanding_work.tracked);
    }
    void submit(delivery d, boost::asio::any_completion_handler<apply_signature> handler, executor_type ex,
                std::optional<checkpoint> at = std::nullopt);
    void flush(boost::asio::any_completion_handler<void(std::error_code)> handler, executor_type ex, bool stop);
    void operate(std::function<void(store&)> task, boost::asio::any_completion_handler<void(std::error_code)> handler,
                 executor_type ex);
    void wait_commit(std::uint64_t commit, boost::asio::any_completion_handler<void(std::error_code)> handler,
                     executor_type ex);

    executor_type executor_;
    std::unique_ptr<impl> impl_;
};

}  // namespace idem
