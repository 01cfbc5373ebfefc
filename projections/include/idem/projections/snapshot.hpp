#pragma once

// Reading a store: a snapshot of the committed state (LMDB snapshot isolation) and the views
// of one consumer's and one projection's diagnostics it hands out.

#include <idem/projections/changes.hpp>
#include <idem/projections/dead_letter.hpp>
#include <idem/projections/delivery.hpp>
#include <idem/projections/operator_results.hpp>
#include <idem/projections/projection.hpp>

#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idem {

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

namespace detail {
struct store_access;

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

/// Decodes a change feed entry's state through its projection (migrated if older).
template <class State>
State state_of(const idem::projection<State>& p, const change& c) {
    return detail::state_through<State>(p, c.state, c.state_version);
}

/// Appends a feed entry as one compact JSON object (no newline), as `idem changes`, GET /changes
/// and `idem relay` give it: {"position":"C.I","commit","kind","projection","key","version",
/// "time_ns","state"}; a reset has no key, version or state. The state is p's JSON of it (null
/// when p is null: a projection the reader does not know).
void append_change_json(std::string& out, const change& c, const projection_base* p);

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
    /// Returns the change feed's entries of the commits after since_commit, in feed order, whole
    /// commits only: at most limit entries unless the first commit alone holds more. Empty: no
    /// commit after it has entries (yet). Throws errc::changes_pruned, naming the oldest commit
    /// kept, if entries after since_commit were pruned.
    std::vector<change> changes(std::uint64_t since_commit, std::size_t limit = 1000) const;
    /// Returns the entries after a position (a reader resuming mid-commit), as changes() does.
    std::vector<change> changes_after(change_position after, std::size_t limit = 1000) const;
    /// Returns what the change feed holds.
    change_feed_info change_feed() const;
    /// Returns the store's identity (32 hex digits; empty for a store made before it had one).
    /// A backup has an identity of its own (copied_from names the store it copies).
    std::string store_id() const;
    /// What a backup was copied from: that store's identity and the commit copied.
    struct store_copy {
        std::string store_id;
        std::uint64_t commit = 0;
    };
    /// Returns what this store is a backup of (idem::backup), if it is one.
    std::optional<store_copy> copied_from() const;
    /// In a backup: a consumer's checkpoint for a source as it was when copied (as
    /// checkpoint_value returns it; nullopt if it had none then, or this is no backup).
    std::optional<std::string> copied_checkpoint(std::string_view consumer, std::string_view source) const;
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
