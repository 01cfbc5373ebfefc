#pragma once

// What a source hands the apply path (a delivery, the checkpoint committed with it) and what it
// gets back (an outcome per delivery). store.hpp applies them; the engine and the sources pass them.

#include <idem/storage/envelope.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace idem {

/// What happened to one delivery.
enum class outcome_kind : std::uint8_t {
    applied,            ///< at least one row changed
    duplicate_message,  ///< the message id was already in the inbox
    duplicate_event,    ///< every row it maps to already holds the effect (or the sequence)
    parked,             ///< held until the missing earlier sequences of its stream arrive
    dead_lettered,      ///< rejected with a reason, kept in the dead-letter table, counted
    ignored,            ///< no projection of this consumer handles its type
};

/// Number of outcome kinds (for counters indexed by outcome_kind).
inline constexpr std::size_t outcome_kinds = 6;

/// Returns the stable text of an outcome kind ("applied", ...).
std::string_view to_string(outcome_kind k) noexcept;

/// The result of applying one delivery.
struct outcome {
    outcome_kind kind = outcome_kind::applied;
    /// Set for dead_lettered; for a duplicate_message whose first delivery was dead-lettered, that
    /// delivery's reason (none if the inbox entry predates recorded reasons).
    reason why = reason::none;
    std::string detail;         ///< names the event and the cause for dead letters and duplicates
    std::uint64_t commit = 0;   ///< the commit that recorded it (read-your-writes)
    /// For a duplicate_message: what the message's first delivery did, as the inbox recorded it,
    /// so that a source can answer a retry as it answered the first delivery.
    outcome_kind first = outcome_kind::applied;
};

/// One delivery: the envelope as received, and the transport's message id if it has one.
struct delivery {
    delivery() = default;
    /// Takes the envelope as received, the transport's message id ("" to use the envelope's) and,
    /// read from a log, the record's line and byte offset, and the transport.
    /// A constructor, not aggregate initialization: GCC 12 (Debian 12's compiler) destroys an
    /// aggregate temporary twice when it is built inside a co_await expression, so
    /// `co_await e.async_apply(delivery{body, id}, use_awaitable)` crashed before this existed.
    delivery(std::string body_, std::string message_id_, std::uint64_t line_ = 0, std::uint64_t offset_ = 0,
             std::string transport_ = {})
        : body(std::move(body_)),
          message_id(std::move(message_id_)),
          line(line_),
          offset(offset_),
          transport(std::move(transport_)) {}

    std::string body;        ///< CloudEvents JSON text
    std::string message_id;  ///< transport message id (Nats-Msg-Id, Idempotency-Key); "" to use the envelope's
    std::uint64_t line = 0;    ///< read from a log: its line (JSON Lines) or record (binary) number, 1-based; 0: not
    std::uint64_t offset = 0;  ///< read from a log: the byte offset of the record
    /// The transport the message id belongs to (a broker stream, a webhook sender, a log's origin): a
    /// transport id (this message_id or the envelope's msgid) is unique within its transport only, so
    /// the inbox keys it by both. "" is one transport like any other. Unused when the message id is
    /// the event id.
    std::string transport{};
    /// message_id comes from what the sender's signature covers (a signed webhook's id, or a hash
    /// of its signed body): a later delivery under it is the same message whatever else it carries
    /// (headers outside the signature), so it is a duplicate_message, never judged as a transport
    /// collision or an id conflict.
    bool signed_message_id = false;
    /// Read from a binary log: the body's parsed envelope attributes its record carries
    /// (log_record::attributes), taken instead of parsing the body; empty: the body is parsed.
    std::string attributes{};
};

/// A source position committed with the batch that consumed up to it.
struct checkpoint {
    std::string source;          ///< which source (a log path, a stream name)
    std::uint64_t position = 0;  ///< how far it was consumed (byte offset, stream sequence)
    std::string detail{};        ///< stored after the position: what else the source checks on resume (a log's file)
    /// Keep the stored checkpoint when its position is higher and its detail the same (positions
    /// of one incarnation of the source). A broker redelivers older messages after newer ones,
    /// so its checkpoint is the highest position whose outcome is committed, not the last one;
    /// a log's position is the last one (a log read again starts lower).
    bool keep_highest = false;
};

}  // namespace idem
