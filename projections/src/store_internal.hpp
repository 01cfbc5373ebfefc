#pragma once

// What the store's units share: the consumer's open tables (store::impl), a prepared delivery
// (prepared_batch::item), and one batch's run (detail::batch_run). Not installed.
//
// The units, one job each:
//   consumer_tables.cpp  opening the environment and the consumer's and projections' tables
//   prepare.cpp          the writer-independent half of apply(): parse, decode, keys
//   batch_run.cpp        one batch, top-down: deliver all -> deliver -> process -> apply
//                        projections -> finish (the idempotency argument, in reading order)
//   batch_reads.cpp      what a batch reads through its own state, and what the live writer keeps
//                        of it between batches
//   retention.cpp        pruning the inbox and the contributing sets
//   bulk.cpp             bulk builds: one transaction across apply() calls
//   snapshot.cpp         the reader
//   change_feed.cpp      the change feed: recording with a batch, pruning, reading
//   layout.cpp           every table name, meta key and record codec

#include <idem/projections/layout.hpp>
#include <idem/projections/store.hpp>
#include <idem/projections/store_hooks.hpp>

#include "event_ids.hpp"
#include "operator_session.hpp"
#include "row_journal.hpp"
#include "string_table.hpp"
#include "upcast_chain.hpp"

#include <idem/storage/error.hpp>
#include <idem/storage/id_log.hpp>
#include <idem/storage/slot_index.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <memory>
#include <span>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace idem {

namespace detail {
class batch_run;

/// Returns a new store identity: 32 random hex digits.
std::string new_store_id();
/// Gives the store in env (a fresh copy) an identity of its own and records in its meta the
/// identity it was copied from and the commit copied (snapshot::copied_from).
void mark_as_copy(environment& env, std::uint64_t commit);

/// A row as the writer holds it: decoded, changed by handlers, written at a batch's finish.
struct row_slot {
    codec::row_header header;
    std::unique_ptr<detail::state_box> state;
    bool dirty = false;  // changed by the running batch: its finish writes it
    std::uint32_t counted = 0;  // the largest encoded size of it counted in kept_rows::row_bytes
};
/// An event subject's stream as the writer holds it.
struct stream_state {
    std::uint64_t highest = 0;
    bool dirty = false;
    std::uint32_t parked = 0;  // its events parked and not released yet (counted by the writer)
};
using row_entry = string_table<row_slot>::entry;
using stream_entry = string_table<stream_state>::entry;

/// Rows and streams decoded by the writer, and what they hold; a batch run reads through them.
/// The live writer keeps them from one batch to the next (docs/RUNTIME.md, "Rows kept between
/// batches"): they are valid as of one commit, and dropped whenever anything else may have
/// written the store since (another writer, an operator action, a bulk build, a failed batch).
struct kept_rows {
    std::deque<string_table<row_slot>> rows;  // per projection
    string_table<stream_state> streams;
    std::uint64_t commit = 0;  // the commit they are the state of (0: none yet)
    /// Every event in the parked table was parked through these streams: their counts say which
    /// streams wait, and the others need no look at the table.
    bool parked_counted = false;
    std::size_t parked_entries = 0;  // the parked table's entries at that commit
    /// Every stream in the streams table is here: one that is not has no entry to read.
    bool streams_complete = false;
    std::size_t stream_entries = 0;  // the streams table's entries at that commit
    std::size_t row_bytes = 0;     // an estimate of the memory rows hold
    std::size_t stream_bytes = 0;  // and streams
    void clear() {
        rows.clear();
        streams.clear();
        commit = 0;
        parked_counted = false;
        parked_entries = 0;
        streams_complete = false;
        stream_entries = 0;
        row_bytes = stream_bytes = 0;
    }
};
}  // namespace detail

/// One delivery, parsed and decoded ahead of the writer.
struct prepared_batch::item {
    /// What one projection makes of the event: its decoded payload and rows, or why not.
    struct part {
        std::size_t projection = 0;
        const projection_base::handler* handler = nullptr;
        std::shared_ptr<const void> decoded;
        std::vector<std::string> keys;          // sorted, unique, non-empty
        std::vector<std::string> contributors;  // per key: the contributing-set entry (row + effect key)
        std::vector<std::uint64_t> contributor_hashes;  // per key: id_log::hash_of(contributor)
        std::vector<std::uint64_t> key_hashes;          // per key: its hash in the batch's row table
        std::optional<std::string> effect;
        reason failed = reason::none;  // decode_failed, handler_failed (a key function), missing_key
        std::string detail;
    };
    std::string body;
    std::string transport_id;
    std::string transport;   // the transport the id belongs to
    bool signed_message_id = false;  // delivery::signed_message_id
    std::uint64_t line = 0;  // where it was read from a log (0: not from a log)
    std::uint64_t offset = 0;
    // Taken back out of the store (a released parked event, a redriven dead letter): it has no
    // place in the batch's source, so its dead letter names none.
    bool from_store = false;
    std::string message_id;  // the inbox key (set when the envelope parsed)
    std::uint64_t message_hash = 0;  // id_log::hash_of(message_id)
    // Under a transport id: the inbox key of the event's own id ("e" + event id), under which
    // event_contents records it, so that it is known whatever transport carries it again. Else
    // empty (the message id is that key).
    std::string event_key;
    std::uint64_t event_key_hash = 0;  // id_log::hash_of(event_key)
    // Of its type, schema version and sequence: a republication that changes one of them (another
    // version, a corrected sequence) is judged by the guards, not taken for an id conflict.
    std::uint64_t shape = 0;
    std::uint64_t subject_hash = 0;  // the subject's hash in the batch's stream table
    std::optional<std::uint64_t> time_ns;  // the event time, if it has one that parses
    std::uint64_t fingerprint = 0;         // of the decoded content (or of the bytes, when malformed)
    std::uint64_t identity = 0;            // of the event id (0: malformed, no event id)
    // A too_large body's body_digest(), which its dead letter keeps: hashed where it is prepared,
    // not by the writer (a megabyte a byte at a time).
    std::optional<std::uint64_t> body_digest;
    parse_error err;  // err.why != none: the envelope is rejected as a whole
    envelope ev;
    std::vector<part> parts;  // per projection handling ev.type, in the order projections were added
};

/// The consumer's open tables and indexes, and the store's state between batches.
struct store::impl {
    impl();
    ~impl();
    store_options options;
    std::shared_ptr<environment> env;
    MDB_dbi meta = 0;
    MDB_dbi streams = 0;
    MDB_dbi parked = 0;
    MDB_dbi dead = 0;
    MDB_dbi checkpoints = 0;
    MDB_dbi collisions = 0;
    MDB_dbi changes = 0;       // the change feed (change_feed.cpp)
    MDB_dbi change_times = 0;  // when each commit with feed entries was made
    std::unique_ptr<id_log> ids;                      // the inbox
    std::unique_ptr<id_log> event_contents;           // event ids of deliveries under transport ids, with their content
    std::unique_ptr<detail::event_id_log> event_ids;  // event ids of deliveries under transport ids
    std::vector<std::unique_ptr<projection_base>> projections;
    detail::upcast_chain upcasts;  // applied to every event's data before it is decoded
    std::vector<MDB_dbi> tables;
    std::vector<std::unique_ptr<id_log>> contributors;           // per projection: row + effect key pairs
    std::vector<std::unique_ptr<detail::row_journal>> journals;  // per projection: rows not yet folded in
    envelope_parser parser;

    // A bulk build (begin_bulk .. end_bulk): one transaction and one batch_run across apply() calls.
    std::unique_ptr<write_txn> bulk_txn;
    std::unique_ptr<detail::batch_run> bulk;
    std::size_t bulk_budget = 0;
    detail::kept_rows kept;  // the rows and streams the last live batch left decoded

    // consumer_tables.cpp
    /// Opens the environment's meta table and checks (or writes) the storage format.
    void open_meta();
    /// Opens the consumer's tables and every projection's; all or nothing.
    void open_tables();
    /// Opens one projection's tables (add()).
    void open_projection(const projection_base& p);
    /// Drops what the indexes staged for an aborted transaction.
    void rolled_back();
    /// The wall clock (retention_options::now, else the system clock), ns since the Unix epoch.
    std::uint64_t wall_now() const;

    // change_feed.cpp
    /// Opens the feed's tables and gives a new store its id.
    void open_feed();
    /// Removes feed entries past change_retention, oldest first, whole commits counted pruned
    /// from their first removed entry; at most budget entries, until deadline. more: stopped at a limit.
    /// The newest commit is the one being made (in a batch) or the last made.
    std::size_t prune_changes(write_txn& txn, std::uint64_t newest, std::size_t budget,
                              std::chrono::steady_clock::time_point deadline, bool& more);

    // batch_run.cpp
    /// Runs fn (one write transaction) until it commits: after map_full the transaction is gone
    /// (aborted by unwinding), so the map grows with none of ours live (throwing map_full at the
    /// limit) and fn runs again from the start; any other failure is rethrown.
    template <class F>
    auto until_committed(F&& fn) {
        for (;;) {
            try {
                return fn();
            } catch (const std::system_error& e) {
                rolled_back();
                if (e.code() != errc::map_full) throw;
            } catch (...) {
                rolled_back();
                throw;
            }
            env->grow();
        }
    }
    std::vector<outcome> run(const prepared_batch& batch, std::span<const checkpoint> at);
    void run_operator(const std::function<bool(detail::operator_session&)>& fn);

    // retention.cpp
    using prune_steps = std::vector<std::pair<std::size_t, id_log::prune_step>>;  // SIZE_MAX: the inbox
    static constexpr std::size_t event_contents_step = SIZE_MAX - 1;  // a prune_steps entry of event_contents
    prune_result prune_step(write_txn& txn, const prune_limits& limits, layout::clock_record clock,
                            consumer_stats& stats, prune_steps& steps);
    prune_result prune_run(write_txn& txn, const prune_limits& limits, detail::batch_run& run, prune_steps& steps);
    void prune_in_batch(write_txn& txn, detail::batch_run& run, prune_steps& steps);
    /// The removed entries are gone for good: the indexes drop them (after the commit).
    void forget_pruned(const prune_steps& steps);
    bool retaining() const noexcept {
        return options.retention.inbox_retention.has_value() || options.retention.allowed_lateness.has_value();
    }

    // bulk.cpp
    std::vector<outcome> run_bulk(const prepared_batch& batch, std::span<const checkpoint> at);
    void abandon_bulk();
    /// Has the id indexes' new tables use huge pages during a bulk build or where
    /// store_options::tuning.huge_index_pages asks for them, small ones otherwise (id_log::use_huge_pages).
    void index_pages();
};

namespace detail {

using part = prepared_batch::item::part;

/// Decodes the event for every projection handling its type and runs the key functions (prepare.cpp).
void prepare_parts(const store::impl& s, const envelope& ev, std::vector<part>& parts);
/// Parses out.body and prepares the event it holds: its message id (from out's transport id, else
/// the envelope), identity, time, fingerprint and parts; false (out.err says why) if it does not parse.
bool prepare_envelope(const store::impl& s, prepared_batch::item& out, envelope_parser& parser);

/// Returns a duration's nanoseconds, 0 if not positive.
inline std::uint64_t count_ns(std::chrono::nanoseconds d) {
    return d.count() > 0 ? static_cast<std::uint64_t>(d.count()) : 0;
}

/// The state of one batch while it is being applied; written out at the end, in key order
/// (batch_run.cpp; spill() in bulk.cpp).
class batch_run {
    friend class operator_run;

public:
    /// What the run is: a live batch (it reads through the rows the last one kept, and keeps its
    /// own), a bulk build (it writes rows straight into the row tables, folding the journals in
    /// first) or an operator action.
    enum class kind { live, bulk, operator_action };
    /// Starts on a fresh write transaction: catches the id indexes up with other writers and
    /// reads the consumer's counters and the number this batch will commit as.
    batch_run(store::impl& s, write_txn& txn, kind k);

    /// Applies deliveries in order and returns their outcomes; at is where they were read from
    /// (dead letters name a single log source) and becomes each source's checkpoint at finish().
    std::vector<outcome> deliver_all(std::span<const std::unique_ptr<prepared_batch::item>> batch,
                                     std::span<const checkpoint> at);
    /// Returns the commit number the batch's outcomes carry.
    std::uint64_t commit() const noexcept { return commit_; }
    /// Writes everything the batch holds into the transaction (the caller commits).
    void finish();
    /// Bulk builds: writes what the batch holds so far (ids, effect keys, dead letters) into the
    /// transaction, and the rows too when they exceed budget bytes (then forgets them).
    void spill(std::size_t budget);

    consumer_stats stats;
    /// The consumer's retention clock as this batch has moved it (prune steps in a bulk build read it).
    const layout::clock_record& clock() const noexcept { return clock_; }
    void set_inbox_floor(std::uint64_t floor) noexcept { clock_.inbox_floor = std::max(clock_.inbox_floor, floor); }
    void set_contrib_floor(std::size_t p, std::uint64_t floor) {
        if (p < contrib_floors_.size()) contrib_floors_[p] = std::max(contrib_floors_[p], floor);
    }

private:
    struct staged_change {
        std::size_t projection;
        row_entry* row;
        std::unique_ptr<detail::state_box> state;  // the changed copy (null: changed in place)
        const std::string* contributor;
        std::uint64_t contributor_hash;
        bool own_stream;
    };
    using item = prepared_batch::item;

    // The prefetch schedule (batch_prefetch.cpp): delivery i brings in what later ones read.
    void prefetch_ahead(std::span<const std::unique_ptr<item>> batch, std::size_t i) const noexcept;
    static void prefetch_item(const item& d) noexcept;
    static void prefetch_parts(const item& d) noexcept;
    void prefetch_slots(const item& d) const noexcept;
    void prefetch(const item& d) const noexcept;
    // In the order a delivery meets them; a released parked event enters at process(), future
    // saying whether it is too far ahead of the consumer's event time.
    outcome deliver(const item& d);
    // What the inbox and event_contents say of it (inbox_lookup.cpp).
    /// A message id seen before: its outcome (a duplicate, an id conflict), or nullopt when it is
    /// new or only a transport id collision (then collision says so).
    std::optional<outcome> seen_message(const item& d, const std::string& message_id, std::uint64_t hash,
                                        bool malformed, std::optional<std::string>& collision);
    outcome duplicate(const item& d, bool malformed, std::string_view message_id, std::uint64_t first_commit,
                      const layout::inbox_first& first);
    /// An event id first processed under another message id with other content: its dead letter;
    /// record_contents says whether event_contents is to record the event id.
    std::optional<outcome> event_id_conflict(const item& d, const std::string& message_id, std::uint64_t hash,
                                             bool& record_contents);
    outcome process(const item& d, bool future);
    void release_parked(const std::string& subject, stream_state& st);
    outcome apply_projections(const item& d);
    std::unique_ptr<detail::state_box> copy_of(std::size_t p, const detail::state_box& state);
    void unstage();
    // What finish() and spill() write.
    void write_rows();
    // The change feed's entries of this commit (change_feed.cpp).
    void record_change(std::size_t p, std::string_view key, const codec::row_header& header, std::string_view state);
    void record_resets();
    void record_change_time();
    void write_dead_letters();
    void write_collisions();
    // The guards.
    bool ahead(std::uint64_t time, std::uint64_t identity, std::string_view source);
    bool future_guarded() const;
    bool beyond_wall(std::uint64_t time) const;
    bool far_ahead(std::optional<std::uint64_t> time) const;
    outcome future_event(const item& d);
    std::optional<outcome> late(const item& d);
    bool holds(std::size_t p, const std::string& contributor, std::uint64_t hash) const;
    /// Dead-letters d under message_id (d's own by default), naming where d was read from.
    outcome dead(const item& d, reason why, std::string detail) { return dead(d, why, std::move(detail), d.message_id); }
    outcome dead(const item& d, reason why, std::string detail, std::string_view message_id);
    // What the batch reads through its own state (batch_reads.cpp).
    /// Starts from the rows the last live batch kept if they still hold, else from none.
    void take_kept();
    /// Counts a row's encoded size (once, then as it grows) in the kept rows' estimate.
    void count_size(row_slot& row, std::size_t encoded);
    row_entry& load_row(std::size_t p, const std::string& key, std::uint64_t hash);
    stream_entry& stream(const std::string& subject);
    stream_entry& stream(const std::string& subject, std::uint64_t hash);  // hash: string_table's, computed ahead
    // What finish() writes: marked once per batch, however often changed.
    void mark_dirty(std::size_t p, row_entry& row);
    void mark_dirty(stream_entry& stream);
    std::optional<std::string> parked_value(const std::string& key) const;
    std::string parked_event_id(std::string_view value) const;

    store::impl& s_;
    write_txn& txn_;
    bool bulk_ = false;
    bool live_ = false;
    std::uint64_t time_ns_ = s_.wall_now();
    layout::clock_record clock_;                 // the consumer's event time and inbox floor
    std::uint64_t clock_before_ = 0;             // the event time before the delivery being applied
    std::vector<std::uint64_t> contrib_floors_;  // per projection: its contributing sets were pruned below this
    kept_rows own_;  // a bulk build's or an operator action's: they leave nothing for the next batch
    kept_rows& kept_;  // the live writer's (store::impl::kept), else own_
    std::deque<string_table<row_slot>>& rows_;  // per projection: kept_.rows
    string_table<stream_state>& streams_;       // kept_.streams
    std::vector<std::pair<std::size_t, row_entry*>> dirty_rows_;  // projection, row: what this batch changed
    std::vector<stream_entry*> dirty_streams_;
    bool parked_possible_ = false;  // the parked table or this batch holds an event: release_parked must look
    // The parked table held events the streams did not count when the run began: which streams
    // wait is known only by looking. Without, a stream waits only for what it counts.
    bool parked_in_table_ = false;
    std::map<std::string, std::optional<std::string>> parked_;  // nullopt: deleted in this batch
    std::vector<std::string> dead_letters_;
    std::vector<std::string> collisions_;  // transport collisions seen, encoded as dead letters are
    // The changes of the event being applied, and per projection the state boxes they left
    // behind: a handler runs on a copy, and copying into a spare box allocates nothing.
    std::vector<staged_change> staged_;
    std::vector<std::vector<std::unique_ptr<detail::state_box>>> spare_states_;
    std::string source_;                              // where the batch was read from, if from a log
    std::map<std::string, std::string> checkpoints_;  // source -> stored value, written at finish()
    std::uint64_t commit_ = 1;
    std::uint32_t changes_ = 0;  // feed entries this commit recorded
    std::string change_;         // one feed record, reused
};

}  // namespace detail

/// A snapshot's state: the environment, its read transaction, and the journals it has read.
struct snapshot::impl {
    explicit impl(std::shared_ptr<environment> e);

    /// Returns a table's handle, or nullopt if it does not exist as this transaction sees it.
    std::optional<MDB_dbi> table(const std::string& name) const;
    /// Returns a projection's row table (throws unknown_projection).
    MDB_dbi row_table(std::string_view projection) const;
    /// Returns the rows a projection's journals hold, read on first need.
    detail::journal_view& journal(std::string_view projection) const;
    /// Looks a row up in a projection's journals: true if they answered (v set if they hold it).
    bool find_journaled(std::string_view projection, std::string_view row_key, std::optional<std::string_view>& v) const;

    std::shared_ptr<environment> env;
    read_txn txn;

private:
    /// The journals of each projection as this snapshot sees them.
    struct journals_entry {
        detail::journal_state state;
        std::shared_ptr<detail::journal_index> index;  // shared by the environment's snapshots in this process
        std::optional<detail::journal_view> view;      // read on first need: scans, and point reads the index cannot answer
    };
    journals_entry& journals(std::string_view projection) const;

    mutable std::mutex mutex_;  // a snapshot may be read from several threads
    mutable std::map<std::string, journals_entry, std::less<>> journals_;
};

}  // namespace idem
