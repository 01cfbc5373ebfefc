#pragma once
// Internal to the projections library: where a projection's recently written rows live.

#include <idem/storage/lmdb.hpp>

#include "string_table.hpp"

#include <mutex>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace idem::detail {

/// Row key -> T, looked up by string_view without building a string. The hasher is not
/// noexcept on purpose: libstdc++ then keeps each node's hash, and a lookup walking a bucket
/// compares hashes instead of hashing every key it passes again (measured: 5% of the
/// writer's time went to that).
struct journal_key_hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view k) const { return std::hash<std::string_view>{}(k); }
};
template <class T>
using journal_key_map = std::unordered_map<std::string, T, journal_key_hash, std::equal_to<>>;

/// A projection's recently written rows, kept out of its row table until they are folded in.
///
/// Rewriting each changed row in place dirties one B-tree leaf per row a batch touches: with
/// the rows spread over many leaves, that is one 4 KiB page written and synced per message.
/// Instead a batch appends its changed rows to a journal, a table keyed by a sequence number
/// (its pages fill one after another), and folds a slice of the previous journal into the
/// row table in key order, where one leaf takes many rows. Two journals alternate: the active
/// one takes new rows; the frozen one, a former active journal, is folded a slice per batch
/// (twice as many rows as the batch appended) and emptied when done; once the active one
/// holds swap_at entries and the frozen one is empty, they swap. A row's current record is
/// the active journal's, else the frozen one's, else the row table's.
///
/// On disk, per projection: tables "journal0/<name>" and "journal1/<name>" (key: u64 BE
/// sequence from 1; value: [u32 LE row-key length][row key][row record]) and the meta entry
/// "journal/<name>" = [u64 LE epoch][the last row key folded from the frozen journal];
/// journal epoch % 2 is the active one. Everything changes inside the batch's transaction.
///
/// The writer's index (this class) follows the disk: after an abort, or when another writer
/// changed the journals, catch_up() reads it again.
class row_journal {
public:
    row_journal(environment& env, const std::string& projection, MDB_dbi meta);

    /// Reads the journals again if this index is stale or another writer changed them.
    void catch_up(const txn_base& txn);
    /// Returns a row's current record if a journal holds the row (the view lives with txn);
    /// hash is key_hash(row_key), which the batch has at hand as its aggregate key's hash.
    std::optional<std::string_view> find(const txn_base& txn, std::string_view row_key, std::uint64_t hash) const;
    /// Appends a row's new record to the active journal (hash as for find).
    void append(write_txn& txn, std::string_view row_key, std::string_view record, std::uint64_t hash);
    /// Asks the CPU to bring the index slots of a row (by hash) into cache, a stage ahead of prefetch().
    void prefetch_slot(std::uint64_t hash) const noexcept {
        active_.prefetch_slot(hash);
        frozen_.prefetch_slot(hash);
    }
    /// Asks the CPU to bring the index entries of a row (by hash) into cache.
    void prefetch(std::uint64_t hash) const noexcept {
        active_.prefetch(hash);
        frozen_.prefetch(hash);
    }
    /// Folds up to n rows of the frozen journal into the row table, empties it once folded,
    /// and swaps the journals when the active one holds swap_at entries (0: automatic).
    void fold(write_txn& txn, MDB_dbi rows, std::size_t n, std::size_t swap_at);
    /// Folds both journals into the row table and empties them (a bulk build writes rows directly).
    void fold_all(write_txn& txn, MDB_dbi rows);
    /// The transaction that changed the journals was aborted: the index no longer matches the disk.
    void rolled_back() noexcept { stale_ = true; }

    /// Entries in the active journal.
    std::size_t active_entries() const noexcept { return static_cast<std::size_t>(next_seq_ - 1); }

    /// The meta key of a projection's journal state.
    static std::string meta_key(std::string_view projection);
    /// The journal table names of a projection, by epoch parity.
    static std::string table_name(std::string_view projection, std::uint64_t parity);
    /// Splits a journal value into its row key and row record.
    static std::pair<std::string_view, std::string_view> split(std::string_view value);
    /// Reads a meta entry: epoch and fold cursor.
    static std::pair<std::uint64_t, std::string_view> decode_meta(std::optional<std::string_view> v);
    /// Returns the index's hash of a row key (codec::row_key of an aggregate key): the hash of
    /// the aggregate key itself, string_table::hash_of(key), so that a batch's prepared key
    /// hashes find the journals' entries and can prefetch them.
    static std::uint64_t key_hash(std::string_view row_key);

private:
    using key_map = string_table<std::uint64_t>;    // row key -> its latest sequence, by key_hash
    using key_run = std::vector<std::string_view>;  // row keys in key order, views into a key_map's entries

    void load(const txn_base& txn);
    void write_meta(write_txn& txn);
    void sort_new_keys();
    key_run active_in_order();
    MDB_dbi active() const noexcept { return tables_[epoch_ % 2]; }
    MDB_dbi frozen() const noexcept { return tables_[(epoch_ + 1) % 2]; }
    std::optional<std::string_view> record_at(const txn_base& txn, MDB_dbi table, std::uint64_t seq) const;

    std::string projection_;
    std::string meta_key_;
    MDB_dbi meta_ = 0;
    MDB_dbi tables_[2] = {0, 0};
    bool stale_ = true;
    std::uint64_t epoch_ = 0;
    std::string cursor_;  // the last row key folded from the frozen journal ("": none yet)
    std::uint64_t next_seq_ = 1;
    key_map active_;  // row key -> its latest sequence in the active journal
    // The active journal's keys in key order, kept as sorted runs a batch at a time (sizes
    // falling by at least half from one run to the next, merged like a binary counter), so
    // that a swap merges a few runs instead of sorting every key at once.
    std::vector<key_run> active_runs_;
    key_run new_keys_;     // keys this batch added to active_, not in a run yet
    key_map frozen_;       // row key -> its latest sequence in the frozen journal
    key_run frozen_order_; // frozen_'s keys in key order
    std::size_t folded_ = 0;  // frozen_order_[0, folded_) are in the row table
};

/// Where a snapshot finds a projection's journals: the epoch it sees, the journal tables by
/// role, the active journal's last sequence and the frozen journal's entry count.
struct journal_state {
    std::uint64_t epoch = 0;
    std::optional<MDB_dbi> active;
    std::optional<MDB_dbi> frozen;
    std::uint64_t active_last = 0;
    std::size_t frozen_entries = 0;
    /// Reads it in txn (tables absent: none).
    static journal_state read(const txn_base& txn, std::optional<MDB_dbi> meta, std::optional<MDB_dbi> table0,
                              std::optional<MDB_dbi> table1, std::string_view projection);
};

/// A reader's view of a projection's journals at its snapshot: every row they hold, by row
/// key (scans merge it with the row table; point reads fall back to it, see journal_index).
struct journal_view {
    /// Reads both journals as the snapshot (txn, state) sees them.
    static journal_view read(const txn_base& txn, const journal_state& state);
    std::unordered_map<std::string_view, std::string_view> latest;  // row key -> record (views into the snapshot)
    /// The rows sorted by row key (built on first use).
    const std::vector<std::pair<std::string_view, std::string_view>>& sorted();

private:
    std::vector<std::pair<std::string_view, std::string_view>> sorted_;
    bool sorted_built_ = false;
};

/// Point reads of a projection's journals for every snapshot of an environment in this
/// process: row key -> sequences, so a point read costs a hash lookup and one get, not a walk
/// of the journals. Whichever snapshot reads past the index's end extends it (within an
/// epoch the active journal only grows, and the frozen one only empties, all at once); a
/// snapshot of a newer epoch rebuilds it. A snapshot the index cannot answer for (an older
/// epoch, or a frozen journal the index was built without) is told so, and uses a journal_view.
class journal_index {
public:
    /// Sets out to the record of row_key as the snapshot (txn, state) sees it (nullopt: in no
    /// journal, read the row table). Returns false if this index cannot answer for the snapshot.
    bool find(const txn_base& txn, const journal_state& state, std::string_view row_key,
              std::optional<std::string_view>& out);

private:
    void rebuild(const txn_base& txn, const journal_state& state);

    std::mutex mutex_;
    bool built_ = false;
    std::uint64_t epoch_ = 0;
    std::uint64_t active_seen_ = 0;   // active sequences 1..active_seen_ are indexed
    std::size_t frozen_entries_ = 0;  // the frozen journal's entries when it was read
    journal_key_map<std::vector<std::uint64_t>> active_;  // row key -> sequences, ascending
    journal_key_map<std::uint64_t> frozen_;               // row key -> its latest sequence
};

}  // namespace idem::detail
