#pragma once

// What an operator action (redrive, release) may do inside one batch's transaction. The
// batch run implements it (operator_run.cpp), so the actions go through the apply path's own
// guards and writes; operator_actions.cpp holds the actions themselves.

#include <idem/projections/layout.hpp>
#include <idem/projections/store.hpp>
#include <idem/storage/lmdb.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace idem::detail {

class operator_session {
public:
    virtual ~operator_session() = default;
    /// The batch's write transaction (read and write tables the batch does not cache).
    virtual write_txn& txn() = 0;
    /// The commit number the batch will commit as.
    virtual std::uint64_t commit() const = 0;
    /// The batch's wall-clock time (ns since the Unix epoch).
    virtual std::uint64_t now() const = 0;
    /// The consumer's tables.
    virtual MDB_dbi parked_table() const = 0;
    virtual MDB_dbi dead_table() const = 0;
    /// Applies an event to the rows that do not hold it yet (contributing sets, row sequences,
    /// all-or-nothing; a failure is dead-lettered anew). The inbox and the stream are untouched.
    virtual outcome reapply(const envelope& ev, std::string_view message_id, std::string_view body) = 0;
    /// Returns why the contributing sets cannot prove an event dead-lettered as late new or a
    /// duplicate (no usable time, or a time below a projection's pruned floor); "" when they can.
    virtual std::string unprovable(std::string_view message_id, std::string_view body) = 0;
    /// Dead-letters a body with the batch.
    virtual void dead_letter(reason why, std::string detail, std::string_view message_id, std::string_view body) = 0;
    /// Writes the dead letters staged so far into the transaction (positions after every existing one).
    virtual void write_dead_letters() = 0;
    /// Returns the stream's highest sequence as the batch sees it.
    virtual std::uint64_t stream_highest(const std::string& subject) = 0;
    /// Sets the stream's highest sequence, then releases its parked successors in order.
    virtual void release_after(const std::string& subject, std::uint64_t highest) = 0;
    /// Sets the stream's highest sequence without releasing anything.
    virtual void set_stream(const std::string& subject, std::uint64_t highest) = 0;
    /// Removes a parked event (by its key in the parked table) with the batch.
    virtual void unpark(const std::string& key) = 0;
    /// Returns whether the batch still holds a parked event under key.
    virtual bool is_parked(const std::string& key) const = 0;
    /// Reads a row (migrating it) and writes it back with the batch, at the current state version.
    virtual void rewrite_row(std::size_t projection, const std::string& key) = 0;
    /// The consumer's event clock as the batch holds it; the batch writes it back when it commits.
    virtual layout::clock_record& clock() = 0;
};

}  // namespace idem::detail
