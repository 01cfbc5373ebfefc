// The texts the apply path's outcomes and dead letters carry (see outcome_texts.hpp).

#include "outcome_texts.hpp"

#include <idem/projections/layout.hpp>

namespace idem::detail::outcome_text {

std::string message_label(const envelope& ev, bool malformed) {
    return malformed ? std::string("message") : describe(ev) + ": message";
}

std::string duplicate_message(std::string_view label, std::string_view message_id, std::uint64_t first_commit,
                              outcome_kind first, reason why) {
    auto text = std::string(label) + " " + layout::describe_message_id(message_id) + " already processed in commit " +
                std::to_string(first_commit);
    if (first == outcome_kind::dead_lettered) {
        text += ", where it was dead-lettered" +
                (why != reason::none ? " (" + std::string(to_string(why)) + ")" : std::string());
    }
    return text;
}

std::string transport_collision(std::string_view label, std::string_view message_id, std::uint64_t first_commit) {
    return std::string(label) + " " + layout::describe_message_id(message_id) + " was first used in commit " +
           std::to_string(first_commit) + " by another event: a transport id collision, judged as a new message";
}

void append_collision_outcome(std::string& collision, const outcome& result) {
    collision += ": " + std::string(to_string(result.kind)) +
                 (result.why != reason::none ? " (" + std::string(to_string(result.why)) + ")" : std::string());
}

std::string id_conflict(std::string_view label, std::string_view message_id, std::uint64_t first_commit,
                        std::uint64_t first_fingerprint, std::uint64_t fingerprint) {
    return std::string(label) + " " + layout::describe_message_id(message_id) + " was first processed in commit " +
           std::to_string(first_commit) + " with other content (fingerprint " + std::to_string(first_fingerprint) +
           ", this delivery " + std::to_string(fingerprint) + "); the first effect stands";
}

std::string event_id_conflict(std::string_view label, std::string_view message_id, std::uint64_t first_commit,
                              std::uint64_t first_fingerprint, std::uint64_t fingerprint) {
    return std::string(label) + " " + layout::describe_message_id(message_id) +
           ": its event id was first processed in commit " + std::to_string(first_commit) +
           " under another message id with other content (fingerprint " + std::to_string(first_fingerprint) +
           ", this delivery " + std::to_string(fingerprint) + "); the first effect stands";
}

std::string malformed(std::string_view detail) { return "malformed event: " + std::string(detail); }

std::string subject_too_long(const envelope& ev) {
    return describe(ev) + ": subject of " + std::to_string(ev.subject.size()) +
           " bytes is too long to track its stream (limit ~500 bytes)";
}

std::string sequence_applied(const envelope& ev, std::uint64_t seq, std::uint64_t highest) {
    return describe(ev) + ": sequence " + std::to_string(seq) + " of '" + layout::truncate(ev.subject) +
           "' already applied (stream at " + std::to_string(highest) + ")";
}

std::string sequence_gap(const envelope& ev, std::uint64_t seq, std::uint64_t next) {
    return describe(ev) + ": sequence " + std::to_string(seq) + " of '" + layout::truncate(ev.subject) +
           "' skips ahead of " + std::to_string(next);
}

std::string already_parked(const envelope& ev, std::uint64_t seq) {
    return describe(ev) + ": already parked at sequence " + std::to_string(seq);
}

std::string sequence_held(const envelope& ev, std::uint64_t seq) {
    return describe(ev) + ": sequence " + std::to_string(seq) + " of '" + layout::truncate(ev.subject) +
           "' is already held by another event";
}

std::string parked(const envelope& ev, std::uint64_t seq, std::uint64_t next) {
    return describe(ev) + ": sequence " + std::to_string(seq) + " of '" + layout::truncate(ev.subject) +
           "' waits for " + std::to_string(next);
}

std::string key_too_long(const envelope& ev, std::string_view projection, std::string_view key, std::size_t effect_size,
                         std::size_t limit) {
    return describe(ev) + ", projection '" + std::string(projection) + "': row key '" + layout::truncate(key) + "' (" +
           std::to_string(key.size()) + " bytes) with its effect key (" + std::to_string(effect_size) +
           " bytes) exceeds LMDB's " + std::to_string(limit) + "-byte key limit";
}

std::string upcast_failed(const envelope& ev, std::string_view key, std::string_view what) {
    return describe(ev) + ", row '" + layout::truncate(key) + "': " + std::string(what);
}

std::string handler_threw(const envelope& ev, std::string_view projection, std::string_view key, std::string_view what) {
    return describe(ev) + ", projection '" + std::string(projection) + "', row '" + layout::truncate(key) +
           "': handler threw: " + std::string(what);
}

std::string unknown_type(const envelope& ev) {
    return describe(ev) + ": no projection handles type '" + layout::truncate(ev.type) + "'";
}

std::string not_handled(const envelope& ev) { return describe(ev) + ": no projection handles " + ev.type; }

std::string every_row_holds(const envelope& ev) {
    return describe(ev) + ": every row it maps to already holds its effect";
}

std::string future_event(const envelope& ev, std::uint64_t ahead_ms, bool no_event_time, std::string_view skew,
                         std::optional<std::size_t> past_wall_sources) {
    std::string why;
    if (no_event_time) {
        why = " is " + std::to_string(ahead_ms) + " ms ahead of the wall clock, more than the allowed skew of " +
              std::string(skew) + ", and the consumer has no event time yet";
    } else {
        why = " is " + std::to_string(ahead_ms) + " ms ahead of the consumer's event time, more than the allowed skew of " +
              std::string(skew);
    }
    if (past_wall_sources) {
        const auto n = *past_wall_sources;
        why += "; it is also past the wall clock, where only events of two sources agreeing confirm a jump (" +
               std::to_string(n) + " source" + (n == 1 ? "" : "s") + " so far)";
    }
    return describe(ev) + ": event time " + ev.time + why + "; it did not move the event-time horizon";
}

std::string no_usable_time(const envelope& ev) {
    return describe(ev) + ": no usable time ('" + layout::truncate(ev.time) +
           "'): with an event-time horizon an unsequenced event needs one to be proven new";
}

std::string older_than_horizon(const envelope& ev, std::uint64_t ms_before) {
    return describe(ev) + ": event time " + ev.time + " is older than the horizon (" + std::to_string(ms_before) +
           " ms before it) and no sequence proves it new; its contributing sets may be pruned";
}

}  // namespace idem::detail::outcome_text
