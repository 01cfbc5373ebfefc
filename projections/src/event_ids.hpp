#pragma once

// The event ids of messages that arrived under a transport id, so `why --event` finds them.
//
// The inbox records a delivery under its message id: the event id when the envelope is its
// own identity, else the transport id ("m..."), which says nothing of the event it carried.
// For those deliveries this log keeps (stamp, message id, event id), appended in commit order
// to "eventids/<consumer>": key = position (u64 BE, increasing), value = [stamp u64 LE]
// [message id length u32 LE][message id][event id]. Only first deliveries are recorded (a
// duplicate message never reaches it), and an entry older than the inbox's oldest id is
// removed with the next batch (its message id was pruned), so the log never outlives the inbox.
// Readers walk it (diagnostics only); the writer never reads it.

#include <idem/storage/envelope.hpp>
#include <idem/storage/lmdb.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace idem::detail {

/// The writer's side: entries staged by a batch, written with it.
class event_id_log {
public:
    /// Opens (creating) the consumer's table; inbox is the consumer's inbox table.
    event_id_log(environment& env, const std::string& consumer, MDB_dbi inbox);

    /// Forgets what was staged (a new transaction starts).
    void clear() noexcept {
        staged_.clear();
        ends_.clear();
    }
    /// Stages the event id of a first delivery recorded in the inbox under a transport id.
    void stage(std::string_view message_id, const envelope& ev, std::uint64_t stamp);
    /// Appends what was staged, and removes entries older than the inbox's oldest id.
    void write(write_txn& txn);

    /// Returns the table's name for a consumer.
    static std::string table_name(std::string_view consumer);
    /// Returns the message ids an event arrived under, oldest first (walks the table).
    static std::vector<std::string> message_ids(const txn_base& txn, MDB_dbi table, std::string_view event_id);
    /// Returns the event id a message id carried, if recorded (walks the table).
    static std::optional<std::string> event_id(const txn_base& txn, MDB_dbi table, std::string_view message_id);

private:
    MDB_dbi table_;
    MDB_dbi inbox_;
    // The encoded values back to back, and where each ends: the buffers keep their capacity
    // from batch to batch, so staging allocates nothing.
    std::string staged_;
    std::vector<std::size_t> ends_;
};

}  // namespace idem::detail
