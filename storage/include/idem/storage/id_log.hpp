#pragma once

// An id log: a set of ids that only grows by appends (and shrinks from its head when
// pruned), with the time each was recorded. It holds a consumer's inbox (processed message
// ids, "inbox/<consumer>") and a projection's contributing sets (row + effect key pairs,
// "contrib/<projection>").
//
// On disk it is an append-only log keyed by a monotonically increasing position
// (8-byte big-endian), value = [processing time, ns, u64 LE][message id]. Appends
// with MDB_APPEND touch only the rightmost leaf page, so a batch of n ids dirties
// about n*(16+id)/4096 pages instead of one random leaf per id. Lookups by id use an
// in-memory hash index (64-bit hash -> position) that is derived from the log: built
// at open, caught up with entries appended by other processes at the start of every
// write, and only extended after a commit succeeds. Every hit is confirmed against
// the log entry itself, so a hash collision can never turn into a false duplicate.
// Positions are never reused; commit order is processing-time order, which is what
// pruning by age needs (it deletes from the head).

#include <idem/storage/lmdb.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace idem {

/// A set of ids kept as an append-only log plus an in-memory index (see the file comment).
///
/// Not thread-safe: used by the single writer that owns the table.
class id_log {
public:
    /// Opens (creating) the table and builds the index from it.
    id_log(environment& env, const std::string& table);

    /// Extends the index with entries other writers appended since it was last current.
    void catch_up(const txn_base& txn);
    /// Returns whether id was recorded, in the log as txn sees it or staged in this batch.
    bool contains(const txn_base& txn, std::string_view id) const;
    /// Records id for the batch being built; it becomes visible to contains() at once.
    void stage(std::string_view id, std::uint64_t time_ns);
    /// Stages id unless it is recorded or staged already; returns whether it was new (one hash, one probe).
    bool stage_if_new(const txn_base& txn, std::string_view id, std::uint64_t time_ns);

    // The same with the id's hash computed ahead (hash_of), e.g. on another thread, and a
    // prefetch of where a lookup of that hash will probe: a writer looking a few ids ahead
    // overlaps the cache misses of a large index.
    /// Returns the hash the index uses for id.
    static std::uint64_t hash_of(std::string_view id) noexcept;
    bool contains(const txn_base& txn, std::string_view id, std::uint64_t hash) const;
    void stage(std::string_view id, std::uint64_t time_ns, std::uint64_t hash);
    bool stage_if_new(const txn_base& txn, std::string_view id, std::uint64_t time_ns, std::uint64_t hash);
    /// Asks the CPU to bring the index slot for hash into cache.
    void prefetch(std::uint64_t hash) const noexcept {
        if (!slots_.empty()) __builtin_prefetch(&slots_[static_cast<std::size_t>(hash) & (slots_.size() - 1)]);
    }
    /// Appends the staged ids to the log inside txn.
    void write(write_txn& txn);
    /// Merges the staged ids into the index; call only after the commit succeeded.
    void committed();
    /// Drops the staged ids (the batch was aborted).
    void rolled_back();

    /// Returns the number of ids the index holds (committed).
    std::size_t size() const noexcept { return count_; }
    /// Returns the table handle.
    MDB_dbi table() const noexcept { return table_; }

private:
    struct slot {
        std::uint64_t hash = 0;
        std::uint64_t position = 0;  // position + 1; 0 marks an empty slot
    };
    struct staged_id {
        std::string id;
        std::uint64_t time_ns = 0;
        std::uint64_t hash = 0;
    };
    void insert(std::uint64_t hash, std::uint64_t position);
    void rebuild(const txn_base& txn);
    bool indexed(const txn_base& txn, std::string_view id, std::uint64_t hash) const;
    bool staged(std::string_view id, std::uint64_t hash) const;
    void stage_hashed(std::string_view id, std::uint64_t time_ns, std::uint64_t hash);

    MDB_dbi table_;
    std::vector<slot> slots_;
    std::size_t count_ = 0;
    std::uint64_t next_position_ = 1;  // the position the next append gets
    std::vector<staged_id> staged_;
    std::vector<std::uint32_t> staged_slots_;  // open addressing over staged_: index + 1; 0 marks an empty slot
};

}  // namespace idem
