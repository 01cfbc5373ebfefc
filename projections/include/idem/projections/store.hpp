#pragma once

// The synchronous apply path: one consumer's projections over one LMDB environment.
// apply() runs a batch of deliveries in ONE write transaction: inbox check, per-row
// sequence and contributing-set guards, handlers on copies, all-or-nothing per event,
// dead letters, inbox record, checkpoint, commit. Outcomes are returned only after the
// commit succeeded (and, with durability::full, was synced).

// The types it takes and returns have headers of their own (store_options.hpp, snapshot.hpp,
// retention.hpp, dead_letter.hpp, prepared_batch.hpp, message_id.hpp); this one includes them all.

#include <idem/projections/dead_letter.hpp>
#include <idem/projections/delivery.hpp>
#include <idem/projections/message_id.hpp>
#include <idem/projections/operator_results.hpp>
#include <idem/projections/prepared_batch.hpp>
#include <idem/projections/projection.hpp>
#include <idem/projections/retention.hpp>
#include <idem/projections/snapshot.hpp>
#include <idem/projections/store_options.hpp>
#include <idem/projections/upcast.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace idem {

namespace detail {
class operator_session;
struct store_access;
}  // namespace detail

/// One consumer's projections over an LMDB environment, applied synchronously.
///
/// Thread safety: apply() and the other calls that write (prune, redrive, release,
/// migrate_rows, begin_bulk/end_bulk, reopen, add) must not run concurrently with each other
/// (one writer at a time; the writer's kept rows are not locked); snapshots may be taken and
/// read from any thread at any time. A batch that must grow the map waits until
/// no snapshot of this process is live; if the applying thread holds one itself, apply()
/// throws errc::map_full instead (release snapshots before applying).
class store {
public:
    /// Opens the environment and the consumer's tables. Throws std::system_error naming the path.
    explicit store(store_options options);
    ~store();
    store(const store&) = delete;
    store& operator=(const store&) = delete;

    /// Adds a projection; all projections are added before the first apply().
    template <class State>
    store& add(projection<State>&& p) {
        return add_projection(std::make_unique<projection<State>>(std::move(p)));
    }
    /// Adds an upcasting step (upcast.hpp), before the first apply(). Throws errc::invalid_argument
    /// naming it if another step already lifts that version or the type's versions leave a gap.
    store& upcast(upcaster step);

    /// Applies a batch in one transaction and returns one outcome per delivery, in order.
    /// Throws std::system_error if the batch could not be committed: then nothing of it is stored.
    std::vector<outcome> apply(std::span<const delivery> batch, const std::optional<checkpoint>& at = std::nullopt);
    /// Applies a single delivery (a batch of one).
    outcome apply(const delivery& d);

    /// Does the writer-independent half of apply() ahead of it: envelope parsing, the size
    /// limit, payload decoding, key and effect-key functions. Thread-safe (const): other
    /// threads may prepare batches while the writer applies, so key and effect functions
    /// must be safe to call concurrently. apply(span) is apply(prepare(span)).
    prepared_batch prepare(std::span<const delivery> batch) const;
    /// The same into an existing prepared_batch, reusing its memory (a reader thread recycling batches).
    void prepare(std::span<const delivery> batch, prepared_batch& into) const;
    /// Applies a prepared batch in one transaction (as apply(span)).
    std::vector<outcome> apply(const prepared_batch& batch, const std::optional<checkpoint>& at = std::nullopt);
    /// Applies a prepared batch with a checkpoint per source it read from (a batch gathered from
    /// several sources); at most one checkpoint per source.
    std::vector<outcome> apply(const prepared_batch& batch, std::span<const checkpoint> at);

    /// Starts a bulk build, for offline rebuilds into a fresh environment: every apply() until
    /// end_bulk() runs in ONE write transaction, with the same rules and outcomes, and rows stay
    /// in memory until they exceed memory_budget bytes (then they are written in key order and
    /// dropped) or the build ends. Nothing is visible to readers or durable before end_bulk();
    /// if an apply() throws, the whole build is abandoned (the store is as before begin_bulk()).
    /// The map does not grow during a build: open the store with a map_size large enough.
    void begin_bulk(std::size_t memory_budget);
    /// Writes the remaining rows in key order and commits the bulk build (one commit number).
    void end_bulk();
    /// Runs one bounded prune step in its own transaction (or inside a running bulk build):
    /// inbox ids past inbox_retention (or limits.older_than) and contributing-set entries past
    /// the event-time horizon, oldest first, within limits. Returns what it removed; call
    /// again while result.more. Nothing to prune without retention settings.
    prune_result prune(const prune_limits& limits = {});
    /// Applies dead letters again through the apply path (after a handler was fixed), in one
    /// transaction: each one taken is removed, and its event applied to the rows that do not
    /// hold it yet (contributing sets and row sequences guard as on the live path; the inbox and
    /// streams are not changed); an event that fails again is dead-lettered anew with its new
    /// reason. Refused and left in place: truncated bodies, id_conflict (the first effect stands),
    /// late_event (nothing proves it new), and sequenced events unless out_of_order.
    /// Recorded in the audit. Not during a bulk build.
    redrive_result redrive(const redrive_options& options = {});
    /// Gives up on the gaps before the events parked on stream subject: applies them in order,
    /// skipping the missing sequences (or, with drop, dead-letters them as released_dropped and
    /// moves the stream past them), in one transaction recorded in the audit. Throws
    /// errc::invalid_argument if nothing is parked on subject.
    release_result release(std::string_view subject, const release_options& options = {});
    /// Sets the consumer's event clock back to time_ns (ns since the Unix epoch), after a jump
    /// that should not have been taken (two sources with the same bad clock): the horizon follows
    /// it, so current events are no longer judged late, and a pending jump is dropped (its votes
    /// were cast against the old clock). The contributing-set floors and the inbox floor stay,
    /// so nothing pruned can prove an event new again. In one transaction recorded in the audit
    /// (with note). Throws errc::invalid_argument if the consumer has no event time yet or
    /// time_ns is not before it. Not during a bulk build.
    event_clock_result set_event_time_back(std::uint64_t time_ns, const std::string& note);
    /// Records in the audit an operator's action that changes nothing the store holds ("pause",
    /// "resume"), with note and summary, in a commit of its own; returns that commit.
    std::uint64_t record_action(const std::string& action, const std::string& note, const std::string& summary);
    /// Rewrites every row of an older state version at its projection's current one (through its
    /// migrations), per_step rows per transaction, calling progress after each. Rows are also
    /// migrated when read and rewritten when changed; this is for a store read by older readers
    /// or to be done with the old versions. A migration that throws stops it with
    /// errc::invalid_argument naming the row (the steps before it are committed).
    migrate_result migrate_rows(std::size_t per_step = 10000,
                                const std::function<void(const migrate_result&)>& progress = {});
    /// Makes this store the successor of another (a rebuild's fresh store, before it is built):
    /// it takes the other's store id, and its commits are numbered after after_commit, so that a
    /// reader of the other's change feed finds this one's entries after its position (the reset
    /// entries a bulk build records). Only on a store with no commit past after_commit.
    void succeed(const std::string& store_id, std::uint64_t after_commit);
    /// Closes and reopens the environment and rebuilds every index from disk (after MDB_PANIC).
    /// Waits until no snapshot of this process is live.
    void reopen();

    /// Returns a snapshot of the committed state (usable from any thread).
    snapshot read() const;
    /// Returns the number of the last commit made by any writer (0: none).
    std::uint64_t last_commit() const;
    /// Returns the number of message ids the inbox holds.
    std::size_t inbox_size() const;
    /// Returns the options the store was opened with.
    const store_options& options() const noexcept;

    struct impl;  ///< opaque: the implementation's state

private:
    friend struct detail::store_access;
    store& add_projection(std::unique_ptr<projection_base> p);
    /// Runs fn inside one batch's transaction; commits if it returns true, else aborts (operator actions).
    void operate(const std::function<bool(detail::operator_session&)>& fn);
    std::unique_ptr<impl> impl_;
};

}  // namespace idem
