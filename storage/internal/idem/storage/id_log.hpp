#pragma once

// An id log: a set of ids that only grows by appends (and shrinks from its head when
// pruned), with the time each was recorded. It holds a consumer's inbox (processed message
// ids, "inbox/<consumer>") and a projection's contributing sets (row + effect key pairs,
// "contrib/<projection>").
//
// On disk it is an append-only log keyed by a monotonically increasing position
// (8-byte big-endian), value = [stamp, u64 LE][extra words, u64 LE each][id]. The stamp is
// a time in ns on the owner's clock (the inbox: its retention clock, never decreasing along
// the log; a contributing set: the event time), the extra words are the owner's (the inbox
// keeps the content fingerprint and the commit and outcome of the first delivery). Appends
// with MDB_APPEND touch only the rightmost leaf page, so a batch of n ids dirties
// about n*(16+id)/4096 pages instead of one random leaf per id. Lookups by id use an
// in-memory hash index (64-bit hash -> position) that is derived from the log: built
// at open, caught up with entries appended by other processes at the start of every
// write, and only extended after a commit succeeds. Every hit is confirmed against
// the log entry itself, so a hash collision can never turn into a false duplicate.
// Positions are never reused (pruning keeps the last entry, so the log never restarts).
// Pruning deletes from the head while stamps are older than a cutoff, in bounded steps; the
// index keeps slots of pruned entries as reusable tombstones (they are below the head).
// The index grows (or sheds its tombstones) without stopping the writer: a new table takes
// the entries of the old one a few slots per insert, and lookups probe both meanwhile, so no
// single insert pays for moving a million entries; and the new table's memory is faulted in
// a page at a time while the old one fills, not all at once when entries start landing in it.

#include <idem/storage/lmdb.hpp>
#include <idem/storage/slot_index.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace idem {

/// A set of ids kept as an append-only log plus an in-memory index (see the file comment).
///
/// Not thread-safe: used by the single writer that owns the table.
class id_log {
public:
    /// Words an entry may carry besides its stamp and id.
    static constexpr std::size_t max_extra = 3;
    /// One recorded id.
    struct entry {
        std::uint64_t position = 0;  ///< 0 while staged in the batch being built
        std::uint64_t stamp = 0;
        std::array<std::uint64_t, max_extra> extra{};
    };
    /// What one prune step did.
    struct prune_step {
        std::size_t removed = 0;
        bool more = false;                ///< stopped at a limit with expired entries left
        std::uint64_t newest_removed = 0; ///< the highest stamp among the removed entries
    };

    /// Opens (creating) the table and builds the index from it; entries carry extra_words words.
    id_log(environment& env, const std::string& table, std::size_t extra_words = 0);

    /// Extends the index with entries other writers appended since it was last current.
    void catch_up(const txn_base& txn);
    /// Returns whether id was recorded, in the log as txn sees it or staged in this batch.
    bool contains(const txn_base& txn, std::string_view id) const;
    /// Records id for the batch being built; it becomes visible to contains() at once.
    void stage(std::string_view id, std::uint64_t stamp);
    /// Returns id's entry, recorded or staged, or nullopt.
    std::optional<entry> find(const txn_base& txn, std::string_view id, std::uint64_t hash) const;
    /// Returns id's most recent entry, recorded or staged, or nullopt: where an id was recorded again
    /// (an owner re-adds an id it no longer counts), the latest one. Probes every slot of id's hash
    /// chain: slower than find(), for the rare second look.
    std::optional<entry> find_newest(const txn_base& txn, std::string_view id, std::uint64_t hash) const;
    /// Sets the extra words of the entry staged last.
    void annotate_last(const std::array<std::uint64_t, max_extra>& extra);

    // The same with the id's hash computed ahead (hash_of), e.g. on another thread, and a
    // prefetch of where a lookup of that hash will probe: a writer looking a few ids ahead
    // overlaps the cache misses of a large index.
    /// Returns the hash the index uses for id.
    static std::uint64_t hash_of(std::string_view id) noexcept;
    bool contains(const txn_base& txn, std::string_view id, std::uint64_t hash) const;
    void stage(std::string_view id, std::uint64_t stamp, std::uint64_t hash);
    /// Asks the CPU to bring the index slot for hash into cache.
    void prefetch(std::uint64_t hash) const noexcept {
        slots_.prefetch(hash);
        draining_.prefetch(hash);
    }
    /// Appends the staged ids to the log inside txn.
    void write(write_txn& txn);
    /// Merges the staged ids into the index; call only after the commit succeeded.
    void committed();
    /// Drops the staged ids (the batch was aborted).
    void rolled_back();

    /// Deletes entries from the head while their stamp is below cutoff, at most max_rows of
    /// them and until the deadline, never the last entry. Call pruned() after the commit.
    prune_step prune(write_txn& txn, std::uint64_t cutoff, std::size_t max_rows,
                     std::chrono::steady_clock::time_point deadline);
    /// Forgets the entries a committed prune() removed.
    void pruned(const prune_step& step) noexcept;
    /// Decodes a stored entry (value as stored under position).
    entry decode(std::uint64_t position, std::string_view value) const;
    /// Returns the id of a stored entry's value.
    std::string_view id_of(std::string_view value) const noexcept { return value.substr(std::min(value.size(), 8 * (1 + extra_words_))); }

    /// Index tables made from now on ask the kernel for transparent huge pages (on) or keep
    /// small ones (off, the default). A bulk build turns it on: filling a table of millions of
    /// slots then costs one page fault per 2 MiB instead of one per 4 KiB (a fault costs ~11 us
    /// on a virtual machine). The live writer keeps small pages: a huge page's fault may wait
    /// for the kernel to compact memory, a stall a batch in flight should not see.
    void use_huge_pages(bool on) noexcept { huge_pages_ = on; }

    /// Returns the number of ids the index holds (committed).
    std::size_t size() const noexcept { return count_; }
    /// Returns the table handle.
    MDB_dbi table() const noexcept { return table_; }

private:
    struct slot {
        std::uint64_t hash = 0;
        std::uint64_t position = 0;  // position + 1; 0 marks an empty slot
    };
    // A power-of-two table of slots in its own anonymous mapping: it arrives as untouched zero
    // pages, so making one costs no pass over its memory. A small one (128 KiB at most) comes
    // zeroed from the heap instead: unmapping a table costs a TLB flush on every core that ran
    // the process, far more than clearing 128 KiB, and a store makes one per id log at each open.
    class slot_table {
    public:
        slot_table() = default;
        slot_table(std::size_t size, bool huge_pages);
        slot_table(slot_table&& other) noexcept;
        slot_table& operator=(slot_table&& other) noexcept;
        ~slot_table();
        std::size_t size() const noexcept { return size_; }
        bool empty() const noexcept { return size_ == 0; }
        slot& operator[](std::size_t i) noexcept { return data_[i]; }
        const slot& operator[](std::size_t i) const noexcept { return data_[i]; }
        void prefetch(std::uint64_t hash) const noexcept {
            if (size_ != 0) __builtin_prefetch(&data_[static_cast<std::size_t>(hash) & (size_ - 1)]);
        }
        /// Memory pages the table spans.
        std::size_t pages() const noexcept;
        /// Has the kernel back pages [first, first + count) of the table now (within pages()), so
        /// no insert or lookup faults on them later.
        void populate(std::size_t first, std::size_t count) noexcept;

    private:
        void release() noexcept;
        slot* data_ = nullptr;
        std::size_t size_ = 0;
        bool heap_ = false;  // from the heap (small), not a mapping of its own
    };
    // A staged id's bytes are [offset, offset + size) of staged_bytes_: one buffer that keeps
    // its capacity from batch to batch, so staging an id allocates nothing.
    struct staged_id {
        std::size_t offset = 0;
        std::size_t size = 0;
        std::uint64_t stamp = 0;
        std::uint64_t hash = 0;
        std::array<std::uint64_t, max_extra> extra{};
    };
    void insert(std::uint64_t hash, std::uint64_t position);
    void place(std::uint64_t hash, std::uint64_t position);
    void regrow();
    void prepare_next();
    void drain(std::size_t slots);
    void rebuild(const txn_base& txn);
    std::optional<entry> indexed(const txn_base& txn, std::string_view id, std::uint64_t hash) const;
    const staged_id* staged(std::string_view id, std::uint64_t hash) const;
    std::string_view bytes_of(const staged_id& s) const noexcept {
        return std::string_view(staged_bytes_).substr(s.offset, s.size);
    }
    void stage_hashed(std::string_view id, std::uint64_t stamp, std::uint64_t hash);
    bool live(const slot& s) const noexcept { return s.position > head_; }  // position + 1 > head: not pruned

    MDB_dbi table_;
    std::size_t extra_words_ = 0;
    bool huge_pages_ = false;
    slot_table slots_;
    slot_table draining_;       // the previous table while its entries move to slots_ (else empty)
    std::size_t drained_ = 0;   // draining_[0, drained_) have moved
    std::size_t drain_rate_ = 0;  // slots of draining_ moved per insert
    slot_table next_;           // slots_'s successor, its pages populated ahead of need (else empty)
    std::size_t touched_ = 0;   // next_'s pages [0, touched_) are backed
    std::size_t until_touch_ = 0;  // inserts before the next pages of next_ are populated
    std::size_t count_ = 0;     // live entries
    std::size_t occupied_ = 0;  // non-empty slots of slots_: live entries and tombstones of pruned ones
    std::uint64_t head_ = 1;    // the first position not pruned
    std::uint64_t next_position_ = 1;  // the position the next append gets
    std::vector<staged_id> staged_;
    std::string staged_bytes_;  // the staged ids, back to back
    detail::slot_index staged_slots_;  // finds staged_ entries by hash
};

}  // namespace idem
