#pragma once

// What became of one event or message, read from a consumer's tables: the inbox (with the
// event ids of deliveries under transport ids), the parked events and the dead letters; and
// whether rows hold its effect, computed with each projection's own effect key function.
// What `idem why` prints.

#include <idem/projections/projection.hpp>
#include <idem/projections/store.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace idem {

/// What to explain: an event (source and id) or a transport message id; optionally rows.
struct why_query {
    std::string source{};                    ///< the event: its source and id (both set), or
    std::string id{};
    std::string message{};                   ///< the transport message id it was delivered under
    std::string transport{};                 ///< the transport of message ("": any that holds it)
    std::optional<std::string> key{};        ///< also: does this row hold the event's effect?
    std::vector<const projection_base*> projections{};  ///< whose rows to check (those with a row `key`)
    std::vector<upcaster> upcasters{};  ///< the store's upcasters: an old event is lifted as the apply path lifts it
};

/// Whether a row holds an event's effect.
struct why_row {
    std::string projection;
    std::string key;
    std::optional<std::string> effect_key{};  ///< the effect key checked (nullopt: cannot be known)
    std::optional<bool> holds{};              ///< nullopt: cannot be told
    std::string note;                         ///< why, in words
};

/// The answer.
struct explanation {
    /// applied, duplicate_event, duplicate_message, parked, dead_lettered, late, ignored,
    /// not_in_inbox (pruned or never seen) or never_seen.
    std::string answer;
    std::string detail;                           ///< one paragraph for a person
    std::optional<consumer_view::inbox_record> first{};  ///< the inbox entry of its first delivery
    std::string message_id;                       ///< the stored message id it was found under ("m..." / "e...")
    std::optional<consumer_view::parked_record> parked{};
    std::optional<dead_letter> dead{};            ///< its (first) dead letter, other than id_conflict
    std::uint64_t id_conflicts = 0;               ///< later deliveries under its id with other content
    std::vector<why_row> rows{};
};

/// Returns a dead letter's detail for a person, prefixed with where it was read when that was a
/// log: "path:line (byte offset N): detail", or "path at byte offset N: detail" once resumed
/// mid-file (lines unknown).
std::string located_detail(const dead_letter& d);

/// Explains q from a snapshot of consumer's tables (walks tables: diagnostics only).
/// Throws errc::invalid_argument if q names neither an event nor a message.
explanation explain(const snapshot& snap, std::string_view consumer, const why_query& q);

}  // namespace idem
