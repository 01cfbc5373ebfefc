#pragma once

// What a store is opened with. Most programs set only the first two fields (where the store
// lives, and the consumer whose inbox and checkpoints it keeps); the policies below them have
// defaults a live consumer wants, and the performance knobs are grouped apart in `tuning`.
//
//   idem::store s{{.path = "orders.db", .consumer = "order-projector"}};

#include <idem/projections/changes.hpp>
#include <idem/projections/retention.hpp>
#include <idem/storage/durability.hpp>
#include <idem/storage/writer_lock.hpp>

#include <cstddef>
#include <filesystem>
#include <functional>
#include <string>

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

/// A store's performance knobs (store_options::tuning): none changes what is stored or how an
/// event is judged, only memory, page faults and how often the row journal is folded.
struct store_tuning {
    std::size_t map_size = std::size_t{1} << 30;       ///< initial map size (address space; the file grows as written)
    std::size_t max_map_size = std::size_t{1} << 40;   ///< the map never grows past this (then: map_full)
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
};

/// Options of a store.
struct store_options {
    std::filesystem::path path{};                      ///< the LMDB environment directory
    std::string consumer = "default";                  ///< consumer name: its inbox, checkpoints, dead letters
    durability sync = durability::full;                ///< fsync policy
    gap_policy gaps = gap_policy::park;                ///< sequence gap policy
    unknown_type_policy unknown_types = unknown_type_policy::ignore;  ///< events no projection handles
    std::size_t max_event_bytes = std::size_t{1} << 20;  ///< larger envelopes are dead-lettered as too_large (0: no limit)
    /// The store takes its writer lock (one writer per store, across processes): empty refuses a
    /// store another process writes (errc::store_locked), else it is called while waiting.
    lock_wait wait_for_writer{};
    retention_options retention{};                     ///< inbox retention and the event-time horizon
    change_retention changes{};                        ///< how long the change feed keeps entries
    /// false: no projection records its changes in this store, whatever projection::changes()
    /// says (a store nobody follows; `consume --no-change-feed`). Entries already kept stay.
    bool change_feed = true;
    /// Called inside every write transaction right before it commits (batches, operator actions,
    /// a bulk build's end): throwing aborts the transaction, so nothing of it is committed. A
    /// partition owner throws errc::lease_lost here once its lease may have expired (fencing).
    std::function<void()> fence{};
    store_tuning tuning{};                             ///< performance knobs
};

}  // namespace idem
