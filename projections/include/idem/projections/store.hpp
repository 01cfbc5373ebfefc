#pragma once

// The synchronous apply path: one consumer's projections over one LMDB environment.
// apply() runs a batch of deliveries in ONE write transaction: inbox check, per-row
// sequence and contributing-set guards, handlers on copies, all-or-nothing per event,
// dead letters, inbox record, checkpoint, commit. Outcomes are returned only after the
// commit succeeded (and, with durability::full, was synced).

#include <idem/projections/delivery.hpp>
#include <idem/projections/operator_results.hpp>
#include <idem/projections/projection.hpp>
#include <idem/projections/upcast.hpp>
#include <idem/storage/durability.hpp>
#include <idem/storage/writer_lock.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idem {

/// What to do with an event whose sequence skips ahead of its stream.
enum class gap_policy {
    park,    ///< hold it until the gap fills, then apply in order (default)
    apply,   ///< apply now; earlier sequences arriving later are duplicates
    reject,  ///< dead-letter it as sequence_gap
};

/// What to do with an event whose type no projection of the consumer handles.
enum class unknown_type_policy {
    ignore,       ///< count it as `ignored` (a consumer of a shared stream; default)
    dead_letter,  ///< dead-letter it as unknown_type (a log meant for exactly these projections)
};

/// Which clock stamps inbox entries and measures their age.
enum class retention_clock {
    wall,   ///< the time each message was processed (a live source: its redeliveries come in wall time)
    event,  ///< the consumer's event time: the highest event time seen (a log: rebuilds are deterministic)
};

/// A source's redelivery bound: how long after a first delivery it may deliver the same message again.
struct redelivery_bound {
    std::chrono::nanoseconds bound{0};
    std::string what;  ///< how it follows from the source's settings, for messages ("AckWait 30s x MaxDeliver 5")
};

/// What a consumer keeps, and for how long (docs/DESIGN.md, "Retention").
struct retention_options {
    /// Message ids older than this (on the retention clock) are pruned from the inbox; unset: kept forever.
    std::optional<std::chrono::nanoseconds> inbox_retention{};
    /// The retention clock.
    retention_clock clock = retention_clock::wall;
    /// Contributing-set entries older than the event-time horizon (the highest event time seen
    /// minus this) are pruned, and an unsequenced event older than the horizon is dead-lettered
    /// as late_event. Unset: contributing sets are kept forever and no event is late.
    std::optional<std::chrono::nanoseconds> allowed_lateness{};
    /// The source's redelivery bound; the store refuses to open with an inbox_retention shorter than it.
    std::optional<redelivery_bound> source{};
    /// While the consumer's event time matters (allowed_lateness set, or an inbox_retention on the
    /// event clock), an event whose time is more than this ahead of the consumer's event time is
    /// dead-lettered as future_event and does not move it, unless `future_confirmations` such events
    /// agree (future_confirmations; see docs/DESIGN.md, "The event-time horizon"). Unset: any event time moves the clock.
    /// Measured in event time; the wall clock (now) is read only for events more than this past it.
    std::optional<std::chrono::nanoseconds> max_future_skew = std::chrono::hours(24);
    /// A jump forward is taken when this many events in a row of the jump agree: events more than
    /// max_future_skew ahead, within max_future_skew of each other; for a jump more than
    /// max_future_skew past the wall clock, from at least two distinct sources among them. The last
    /// of them moves the clock and is judged as usual; the ones before it were dead-lettered as future_event.
    std::uint32_t future_confirmations = 3;
    /// How far ahead, in event time, the source may re-send an event under a new id and a new time
    /// (a drop copy): its effect key must still be in the contributing sets then, so the store
    /// refuses to open with an allowed_lateness shorter than this. Unset: not declared.
    std::optional<std::chrono::nanoseconds> resend_within{};
    /// Each batch's transaction also removes up to this many expired entries (no extra commit,
    /// no extra fsync; 0: only store::prune removes them). On the event clock a batch removes
    /// all that expired, so a log run's state depends on the log alone, not on timing.
    std::size_t prune_per_batch = 1000;
    /// The wall clock, ns since the Unix epoch (tests replace it); unset: the system clock.
    std::function<std::uint64_t()> now{};
};

/// Limits of one prune step (store::prune): it holds the writer for at most this long.
struct prune_limits {
    std::size_t max_rows = 1000;                 ///< entries deleted per step at most
    std::chrono::microseconds max_time{1000};    ///< time per step at most (its commit comes on top)
    /// Prune inbox ids older than this instead of the configured inbox_retention (idem prune --older-than).
    std::optional<std::chrono::nanoseconds> older_than{};
};

/// What one prune step removed.
struct prune_result {
    std::size_t ids = 0;           ///< inbox entries removed
    std::size_t contributors = 0;  ///< contributing-set entries removed
    bool more = false;             ///< stopped at a limit: call again
};

/// One dead-lettered delivery.
struct dead_letter {
    std::uint64_t position = 0;  ///< order in the dead-letter table
    reason why = reason::none;
    std::string detail;
    std::string message_id;
    std::string body;           ///< the envelope as received (only its first bytes when truncated)
    std::uint64_t time_ns = 0;  ///< when it was dead-lettered (Unix time, ns)
    std::uint64_t body_size = 0;    ///< the envelope's full size in bytes
    bool truncated = false;         ///< body holds only the first dead_letter_prefix bytes (a too_large envelope)
    std::uint64_t body_digest = 0;  ///< when truncated: body_digest() of the full envelope
    /// Where it was read, when the batch named a source: the checkpoint's source (a log's is
    /// "log:<path>", see log_source_path()), and in a log its line (1-based; 0: not known, as after
    /// a resume mid-file) and byte offset. Empty and 0 otherwise, and in records stored before
    /// dead letters kept their origin.
    std::string source{};
    std::uint64_t line = 0;
    std::uint64_t offset = 0;
};

/// A too_large envelope's dead letter keeps this many of its first bytes, its size and its digest.
inline constexpr std::size_t dead_letter_prefix = std::size_t{64} << 10;

/// Returns the 64-bit FNV-1a hash of bytes: the digest a truncated dead letter keeps of its envelope.
std::uint64_t body_digest(std::string_view bytes) noexcept;

/// Counters of one consumer, durable (kept in the environment, updated with every batch).
struct consumer_stats {
    std::array<std::uint64_t, outcome_kinds> outcomes{};  ///< indexed by outcome_kind
    std::uint64_t released = 0;                            ///< parked events applied once their gap filled
    std::uint64_t batches = 0;                             ///< committed batches
    std::uint64_t late_events = 0;                         ///< dead-lettered as late_event (also in outcomes)
    std::uint64_t id_conflicts = 0;                        ///< dead-lettered as id_conflict (also in outcomes)
    std::uint64_t pruned_ids = 0;                          ///< inbox entries pruned
    std::uint64_t pruned_contributors = 0;                 ///< contributing-set entries pruned
    std::uint64_t transport_collisions = 0;  ///< a transport id already used by another event (judged as new)
    std::uint64_t future_events = 0;         ///< dead-lettered as future_event (also in outcomes)
};

/// Returns the inbox key of a transport id within its transport: "m<id>" for the unnamed transport,
/// else "t<len(transport)>:<transport><id>" (length-prefixed: no two (transport, id) pairs alias, and
/// neither aliases an event id's "e..." key).
std::string transport_message_id(std::string_view transport, std::string_view transport_id);
/// Splits an inbox key into (transport, id): "t<n>:<transport><id>", "m<id>" (transport "") or
/// "e<event id>" (transport "", id the event id).
std::pair<std::string_view, std::string_view> split_message_id(std::string_view key);
namespace detail {
struct store_access;
/// What the library's own tests inject into a store; opaque to its users.
class store_hooks {
    friend struct store_access;
    std::function<void(std::uint64_t commit)> before_commit_{};
};
}  // namespace detail

/// Options of a store.
struct store_options {
    std::filesystem::path path{};                      ///< the LMDB environment directory
    std::string consumer = "default";                  ///< consumer name: its inbox, checkpoints, dead letters
    durability sync = durability::full;                ///< fsync policy
    gap_policy gaps = gap_policy::park;                ///< sequence gap policy
    unknown_type_policy unknown_types = unknown_type_policy::ignore;  ///< events no projection handles
    std::size_t max_event_bytes = std::size_t{1} << 20;  ///< larger envelopes are dead-lettered as too_large (0: no limit)
    std::size_t map_size = std::size_t{1} << 30;       ///< initial map size (address space; the file grows as written)
    std::size_t max_map_size = std::size_t{1} << 40;   ///< the map never grows past this (then: map_full)
    /// The store takes its writer lock (one writer per store, across processes): empty refuses a
    /// store another process writes (errc::store_locked), else it is called while waiting.
    lock_wait wait_for_writer{};
    retention_options retention{};                     ///< inbox retention and the event-time horizon
    /// Rows a batch changed go to an append-only journal and are folded into the row table in
    /// key order later (see docs/RUNTIME.md "Row journal"); the journal is frozen for folding once
    /// it holds this many entries. 0: automatic (16 per leaf page of the row table, at least 1024).
    std::size_t journal_rows = 0;
    /// The writer keeps the rows and streams it decoded from one batch to the next, up to about
    /// this many bytes (past it they are dropped before the next batch and read again as needed;
    /// docs/RUNTIME.md, "Rows kept between batches"). 0: every batch reads its rows from the store.
    std::size_t kept_rows_bytes = std::size_t{64} << 20;
    /// The in-memory id indexes (the inbox's and the contributing sets') ask the kernel for
    /// transparent huge pages as they grow: one page fault per 2 MiB instead of per 4 KiB, for
    /// jobs that insert millions of ids (`idem consume --log` sets it). Off by default: a huge
    /// page's fault may wait for the kernel to compact memory, a stall a live batch should not
    /// see. A bulk build (rebuild) uses them whatever this says.
    bool huge_index_pages = false;
    /// Called inside every write transaction right before it commits (batches, operator actions,
    /// a bulk build's end): throwing aborts the transaction, so nothing of it is committed. A
    /// partition owner throws errc::lease_lost here once its lease may have expired (fencing).
    std::function<void()> fence{};
    /// The library's own test hooks: nothing to set (reached only from the library's internal headers).
    detail::store_hooks hooks{};
};

class snapshot;
namespace detail {
class operator_session;

template <class S>
concept declares_state_version = requires { std::uint32_t{S::state_version}; };

/// Refuses a row that is not at the state version State declares (1 if it declares none).
void check_read_version(std::string_view projection, std::uint32_t row_version, std::uint32_t declared);

/// A row's state read by type alone: only at the state version State declares.
template <class State>
State state_at_version(std::string_view projection, std::string_view bytes, std::uint32_t row_version) {
    if constexpr (declares_state_version<State>) {
        check_read_version(projection, row_version, State::state_version);
    } else {
        check_read_version(projection, row_version, 1);
    }
    return load_state<State>(bytes);
}

/// A row's state read through its projection (migrated if older).
template <class State>
State state_through(const projection<State>& p, std::string_view bytes, std::uint32_t row_version) {
    auto box = p.load(bytes, row_version);
    return std::move(static_cast<typed_state<State>&>(*box).value);
}
}  // namespace detail

/// Deliveries parsed and decoded ahead of the writer by store::prepare(), for store::apply().
class prepared_batch {
public:
    prepared_batch();
    ~prepared_batch();
    prepared_batch(prepared_batch&&) noexcept;
    prepared_batch& operator=(prepared_batch&&) noexcept;

    /// Returns the number of deliveries.
    std::size_t size() const noexcept;
    /// Moves other's deliveries to the end of this batch (a writer gathering prepared submissions).
    void append(prepared_batch&& other);
    /// Moves delivery i of other to the end of this batch (a writer handing deliveries back,
    /// so that the thread which prepared them also frees them).
    void take(prepared_batch& other, std::size_t i);
    /// Empties the batch, keeping its memory.
    void clear() noexcept;
    /// Makes room for n deliveries, so that appending up to n moves each item once.
    void reserve(std::size_t n);

    struct item;  ///< opaque: one delivery, parsed, its payload decoded per projection

private:
    friend class store;
    // Each item on the heap: a writer gathering submissions and handing them back moves
    // pointers, not the items' dozens of strings.
    std::vector<std::unique_ptr<item>> items_;
};

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
    /// Rewrites every row of an older state version at its projection's current one (through its
    /// migrations), per_step rows per transaction, calling progress after each. Rows are also
    /// migrated when read and rewritten when changed; this is for a store read by older readers
    /// or to be done with the old versions. A migration that throws stops it with
    /// errc::invalid_argument naming the row (the steps before it are committed).
    migrate_result migrate_rows(std::size_t per_step = 10000,
                                const std::function<void(const migrate_result&)>& progress = {});
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

class consumer_view;
class projection_view;

/// A consistent read-only view of an environment (LMDB snapshot isolation).
///
/// Take one per read, from any thread (store::read(), or snapshot::open() from another
/// process); it pins the pages it sees until destroyed, so do not keep it for long. Rows,
/// the commit number and checkpoints are read here; a consumer's and a projection's
/// diagnostics through the views consumer() and projection() return.
class snapshot {
public:
    /// Opens a snapshot of the environment at path (read-only, e.g. from another process).
    static snapshot open(const std::filesystem::path& path);
    ~snapshot();
    snapshot(snapshot&&) noexcept;
    snapshot& operator=(snapshot&&) noexcept;

    /// Returns a row's state and version, or nullopt if the row does not exist. Reads only rows
    /// at the state version State declares (`static constexpr std::uint32_t state_version`,
    /// else 1) and refuses others (errc::state_version_mismatch): read those through their
    /// projection, which migrates them.
    template <class State>
    std::optional<row<State>> get(std::string_view projection, std::string_view key) const {
        auto raw = raw_row(projection, key);
        if (!raw) return std::nullopt;
        return row<State>{std::string(key), detail::state_at_version<State>(projection, raw->state, raw->state_version), raw->version,
                          raw->highest_sequence};
    }
    /// Returns a row read through its projection: a row of an older state version is migrated
    /// (projection::migrate), one newer than the code is refused (errc::state_version_mismatch).
    template <class State>
    std::optional<row<State>> get(const idem::projection<State>& p, std::string_view key) const {
        auto raw = raw_row(p.name(), key);
        if (!raw) return std::nullopt;
        return row<State>{std::string(key), detail::state_through<State>(p, raw->state, raw->state_version), raw->version, raw->highest_sequence};
    }
    /// Calls fn(row<State>) for every row of a projection, in key order (versions as get() reads them).
    template <class State, class F>
    void scan(std::string_view projection, F&& fn) const {
        scan_raw(projection, [&](const raw_row_view& r) {
            fn(row<State>{std::string(r.key), detail::state_at_version<State>(projection, r.state, r.state_version), r.version,
                          r.highest_sequence});
        });
    }
    /// Calls fn(row<State>) for every row of a projection, read through it, in key order.
    template <class State, class F>
    void scan(const idem::projection<State>& p, F&& fn) const {
        scan_raw(p.name(), [&](const raw_row_view& r) {
            fn(row<State>{std::string(r.key), detail::state_through<State>(p, r.state, r.state_version), r.version, r.highest_sequence});
        });
    }
    /// Returns every row of a projection, in key order.
    template <class State>
    std::vector<row<State>> rows(std::string_view projection) const {
        std::vector<row<State>> out;
        scan<State>(projection, [&](row<State> r) { out.push_back(std::move(r)); });
        return out;
    }
    /// Returns every row of a projection, read through it, in key order.
    template <class State>
    std::vector<row<State>> rows(const idem::projection<State>& p) const {
        std::vector<row<State>> out;
        scan(p, [&](row<State> r) { out.push_back(std::move(r)); });
        return out;
    }

    /// A row before decoding: its key, version and encoded state (views valid while the snapshot lives).
    struct raw_row_view {
        std::string_view key;
        std::uint64_t version = 0;
        std::uint64_t highest_sequence = 0;
        std::uint32_t state_version = 0;
        std::string_view state;
        bool checked = false;  ///< its checksum matched (false: written before rows carried one)
    };
    /// Returns a row without decoding its state. A row whose record is damaged (its checksum does
    /// not match) throws errc::corrupt_record naming the projection and the key, as every read does.
    std::optional<raw_row_view> raw_row(std::string_view projection, std::string_view key) const;
    /// Calls fn(raw_row_view) for every row of a projection, in key order.
    void scan_raw(std::string_view projection, const std::function<void(const raw_row_view&)>& fn) const;
    /// Walks a projection's rows in key order, one next() at a time (two can walk in step).
    /// Valid while the snapshot it came from lives.
    class row_reader {
    public:
        ~row_reader();
        row_reader(row_reader&&) noexcept;
        row_reader& operator=(row_reader&&) noexcept;
        /// Returns the next row, or nullopt after the last; its views live until the next call.
        std::optional<raw_row_view> next();

        struct state;  ///< opaque: the cursor and the journals' overlay

    private:
        friend class snapshot;
        explicit row_reader(std::unique_ptr<state> s);
        std::unique_ptr<state> state_;
    };
    /// Returns a reader over a projection's rows (throws unknown_projection if it has none).
    row_reader read_rows(std::string_view projection) const;

    /// Returns the commit number this snapshot sees (0: nothing committed yet).
    std::uint64_t commit() const;
    /// Returns a consumer's checkpoint for a source, if it has one.
    std::optional<std::uint64_t> checkpoint(std::string_view consumer, std::string_view source) const;
    /// Returns a consumer's checkpoint for a source as stored: the u64 LE position, then its detail.
    std::optional<std::string> checkpoint_value(std::string_view consumer, std::string_view source) const;
    /// Returns every checkpoint of a consumer as (source, position), sorted by source.
    std::vector<std::pair<std::string, std::uint64_t>> checkpoints(std::string_view consumer) const;

    /// Returns a view of a consumer's inbox, parked events, dead letters, counters and audit.
    consumer_view consumer(std::string_view name) const;
    /// Returns a view of a projection's contributing sets.
    projection_view projection(std::string_view name) const;

    struct impl;  ///< opaque: the environment, the read transaction and the journals it sees

private:
    friend class store;
    friend struct detail::store_access;
    explicit snapshot(std::unique_ptr<impl> i);
    std::unique_ptr<impl> impl_;
};

/// What a snapshot holds of one consumer: its inbox, parked events, dead letters, durable
/// counters and operator actions (most of it for diagnostics: lookups walk a table).
///
/// Borrows the snapshot that returned it: valid while that snapshot lives (a move of the
/// snapshot keeps it valid; its destruction does not).
class consumer_view {
public:
    /// What the inbox says of one message id.
    struct inbox_record {
        std::uint64_t stamp = 0;        ///< on the retention clock, ns since the Unix epoch
        std::uint64_t fingerprint = 0;  ///< of the content first delivered
        std::uint64_t commit = 0;       ///< the commit that recorded its first delivery
        outcome_kind outcome = outcome_kind::applied;  ///< what its first delivery did
        reason why = reason::none;  ///< dead_lettered: why (none in entries recorded before reasons were kept)
    };
    /// Retention figures of the consumer.
    struct retention_state {
        std::uint64_t event_time = 0;        ///< the highest event time seen (ns; 0: none yet)
        std::optional<std::uint64_t> oldest; ///< stamp of the oldest inbox id
        std::uint64_t inbox_floor = 0;       ///< ids stamped before this may have been pruned
        std::uint64_t jump_time = 0;         ///< a pending jump of the event time: its lowest time (0: none)
        std::size_t jump_votes = 0;          ///< the events that agree on it so far
        std::size_t jump_sources = 0;        ///< their distinct CloudEvents sources
    };
    /// Where a parked message is held: its stream, sequence, and the sequence the stream waits for.
    struct parked_record {
        std::string subject;
        std::uint64_t sequence = 0;
        std::uint64_t waiting_for = 0;
    };
    /// One parked event as stored.
    struct parked_event {
        std::string subject;
        std::uint64_t sequence = 0;
        std::uint64_t waiting_for = 0;  ///< the sequence its stream waits for
        std::string message_id;         ///< as stored ('m' transport id or 'e' event id)
        std::string body;               ///< the envelope as received
    };

    /// Returns the consumer's name.
    const std::string& name() const noexcept { return name_; }
    /// Returns the consumer's durable counters.
    consumer_stats stats() const;
    /// Returns the retention figures.
    retention_state retention() const;

    /// Returns the number of ids in the inbox.
    std::size_t inbox_size() const;
    /// Looks a message id up in the inbox (walks the inbox: diagnostics only). For an envelope's
    /// own id pass envelope::message_id(), for a transport id transport_message_id().
    std::optional<inbox_record> inbox_lookup(std::string_view message_id) const;
    /// Looks a transport id up in the inbox under any transport (walks the inbox: diagnostics
    /// only); returns the inbox key it was found under (the first, oldest) and its record.
    std::optional<std::pair<std::string, inbox_record>> inbox_lookup_transport_id(std::string_view transport_id) const;
    /// Returns the message ids an event (envelope::event_id()) was recorded under in the inbox:
    /// its own, and transport ids it arrived under (walks a log: diagnostics only).
    std::vector<std::string> message_ids_of(std::string_view event_id) const;
    /// Returns the event id a transport message id carried, if recorded (diagnostics only).
    std::optional<std::string> event_id_of(std::string_view message_id) const;

    /// Returns the number of events held parked.
    std::size_t parked() const;
    /// Looks a message id up among the parked events (walks them: diagnostics only).
    std::optional<parked_record> parked_lookup(std::string_view message_id) const;
    /// Returns the parked streams, by subject (walks the parked table and the inbox).
    std::vector<parked_stream> parked_streams() const;
    /// Returns the parked events in (subject, sequence) order.
    std::vector<parked_event> parked_events() const;

    /// Returns the number of dead letters (without reading them).
    std::size_t dead_letter_count() const;
    /// Returns the dead letters in the order they were recorded.
    std::vector<dead_letter> dead_letters() const;
    /// Returns the transport collisions in the order they were seen: deliveries whose transport id
    /// was already used by another event (why = reason::transport_collision; each was judged as a
    /// new message, its outcome in the detail).
    std::vector<dead_letter> collisions() const;
    /// Returns the recorded operator actions, oldest first.
    std::vector<operator_action> operator_actions() const;

private:
    friend class snapshot;
    consumer_view(const snapshot::impl& snap, std::string_view name) : snap_(&snap), name_(name) {}
    const snapshot::impl* snap_;
    std::string name_;
};

/// What a snapshot holds of one projection's contributing sets (diagnostics: queries of one
/// row walk the projection's whole contributor log).
///
/// Borrows the snapshot that returned it: valid while that snapshot lives.
class projection_view {
public:
    /// Returns the projection's name.
    const std::string& name() const noexcept { return name_; }
    /// Calls fn(effect key) for each effect key in a row's contributing set, oldest first.
    void scan_contributors(std::string_view key, const std::function<void(std::string_view effect)>& fn) const;
    /// Returns the number of effect keys in a row's contributing set.
    std::size_t contributors(std::string_view key) const;
    /// Returns whether effect contributed to a row.
    bool contributed(std::string_view key, std::string_view effect) const;
    /// Returns the number of entries in the contributing sets (all rows).
    std::size_t contributor_entries() const;
    /// Returns the event time below which the contributing sets were pruned (0: never).
    std::uint64_t contributor_floor() const;

private:
    friend class snapshot;
    projection_view(const snapshot::impl& snap, std::string_view name) : snap_(&snap), name_(name) {}
    const snapshot::impl* snap_;
    std::string name_;
};

}  // namespace idem
