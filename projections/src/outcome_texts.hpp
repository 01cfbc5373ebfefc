#pragma once

// The texts the apply path's outcomes and dead letters carry: what happened to a delivery, in
// the words an operator reads in `why`, `deadletters` and a source's summary. The steps that
// judge a delivery (batch_run.cpp, inbox_lookup.cpp) decide; these only say it.

#include <idem/projections/delivery.hpp>
#include <idem/storage/envelope.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace idem::detail::outcome_text {

// --- the inbox ----------------------------------------------------------------------------------

/// Names a delivery in the inbox's texts: "<event>: message", or "message" when it did not parse.
std::string message_label(const envelope& ev, bool malformed);
/// Says a message id was already processed, and what its first delivery did when it was dead-lettered.
std::string duplicate_message(std::string_view label, std::string_view message_id, std::uint64_t first_commit,
                              outcome_kind first, reason why);
/// Says a transport id was first used by another event (the outcome is appended once known).
std::string transport_collision(std::string_view label, std::string_view message_id, std::uint64_t first_commit);
/// Appends what the colliding delivery did to its transport_collision() text.
void append_collision_outcome(std::string& collision, const outcome& result);
/// Says a message id was first processed with other content.
std::string id_conflict(std::string_view label, std::string_view message_id, std::uint64_t first_commit,
                        std::uint64_t first_fingerprint, std::uint64_t fingerprint);
/// Says an event id was first processed under another message id with other content.
std::string event_id_conflict(std::string_view label, std::string_view message_id, std::uint64_t first_commit,
                              std::uint64_t first_fingerprint, std::uint64_t fingerprint);
/// Says an envelope was rejected as a whole.
std::string malformed(std::string_view detail);

// --- the stream ---------------------------------------------------------------------------------

/// Says a subject is too long for its stream to be tracked.
std::string subject_too_long(const envelope& ev);
/// Says a sequence at or below the stream's was already applied.
std::string sequence_applied(const envelope& ev, std::uint64_t seq, std::uint64_t highest);
/// Says a sequence skips ahead of the one the stream waits for (gap_policy::reject).
std::string sequence_gap(const envelope& ev, std::uint64_t seq, std::uint64_t next);
/// Says the same event is parked at its sequence already.
std::string already_parked(const envelope& ev, std::uint64_t seq);
/// Says another event is parked at the sequence.
std::string sequence_held(const envelope& ev, std::uint64_t seq);
/// Says an event is parked until the stream reaches the sequence before it.
std::string parked(const envelope& ev, std::uint64_t seq, std::uint64_t next);

// --- the projections ----------------------------------------------------------------------------

/// Says a row key with its effect key exceeds LMDB's key limit.
std::string key_too_long(const envelope& ev, std::string_view projection, std::string_view key, std::size_t effect_size,
                         std::size_t limit);
/// Says a stored row could not be migrated to the projection's state version.
std::string upcast_failed(const envelope& ev, std::string_view key, std::string_view what);
/// Says a handler threw on a row.
std::string handler_threw(const envelope& ev, std::string_view projection, std::string_view key, std::string_view what);
/// Says no projection handles the event's type (unknown_type_policy::dead_letter).
std::string unknown_type(const envelope& ev);
/// Says no projection handles the event's type (the event is ignored).
std::string not_handled(const envelope& ev);
/// Says every row the event maps to holds its effect already.
std::string every_row_holds(const envelope& ev);

// --- the event-time guards ----------------------------------------------------------------------

/// Says an event is too far ahead: ahead_ms of the wall clock (no event time yet) or of the
/// consumer's event time; past_wall_sources, when it is past the wall clock too, counts the
/// sources agreeing on the jump so far.
std::string future_event(const envelope& ev, std::uint64_t ahead_ms, bool no_event_time, std::string_view skew,
                         std::optional<std::size_t> past_wall_sources);
/// Says an unsequenced event has no usable time to be proven new by.
std::string no_usable_time(const envelope& ev);
/// Says an unsequenced event is older than the horizon by ms_before.
std::string older_than_horizon(const envelope& ev, std::uint64_t ms_before);

}  // namespace idem::detail::outcome_text
