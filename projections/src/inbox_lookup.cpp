// What the inbox and event_contents say of a delivery before it is applied: a message id seen
// before is a duplicate, or with other content an id conflict, or under a transport id first used
// by another event a transport id collision; an event id seen before under another message id
// with other content is an id conflict too. The lookups are index probes, an LMDB read only on a
// hit; deliver() (batch_run.cpp) records the delivery afterwards, in the same transaction.

#include "store_internal.hpp"

#include "outcome_texts.hpp"

namespace idem::detail {

static_assert(std::tuple_size_v<layout::inbox_words> == id_log::max_extra,
              "an inbox entry's extra words are all its id_log entry carries");

std::optional<outcome> batch_run::seen_message(const item& d, const std::string& message_id, std::uint64_t hash,
                                               bool malformed, std::optional<std::string>& collision) {
    if (message_id.empty()) return std::nullopt;
    const auto entry = s_.ids->find(txn_, message_id, hash);
    if (!entry) return std::nullopt;
    const auto first = layout::decode_inbox_first(entry->extra);
    const auto first_commit = entry->position == 0 ? commit_ : first.commit;
    // A signed id names the message whatever the unsigned rest of the delivery says.
    if (d.signed_message_id) return duplicate(d, malformed, message_id, first_commit, first);
    if (first.event_mark != d.identity && !layout::is_event_key(message_id)) {
        // A transport id is unique within its transport only as far as the transport keeps
        // it so: another event under it is reported, and judged on its own as a new message.
        ++stats.transport_collisions;
        collision = outcome_text::transport_collision(outcome_text::message_label(d.ev, malformed), message_id,
                                                      first_commit);
        return std::nullopt;
    }
    if (first.fingerprint != 0 && first.fingerprint != d.fingerprint) {
        // Same id, other content: the first effect stands; this one is kept for the operator.
        ++stats.id_conflicts;
        return dead(d, reason::id_conflict,
                    outcome_text::id_conflict(outcome_text::message_label(d.ev, malformed), message_id, first_commit,
                                              first.fingerprint, d.fingerprint),
                    message_id);
    }
    return duplicate(d, malformed, message_id, first_commit, first);
}

// A message already in the inbox. It says what the first delivery did (and why, when it was
// dead-lettered), so that a source answers a retry as it answered the first delivery.
outcome batch_run::duplicate(const item& d, bool malformed, std::string_view message_id, std::uint64_t first_commit,
                             const layout::inbox_first& first) {
    outcome o{outcome_kind::duplicate_message, reason::none,
              outcome_text::duplicate_message(outcome_text::message_label(d.ev, malformed), message_id, first_commit,
                                              first.outcome, first.why),
              0};
    o.first = first.outcome;
    if (o.first == outcome_kind::dead_lettered) o.why = first.why;
    return o;
}

std::optional<outcome> batch_run::event_id_conflict(const item& d, const std::string& message_id, std::uint64_t hash,
                                                    bool& record_contents) {
    // Its first delivery is in the inbox under the event id (it came without a transport id) or
    // in event_contents (it came under one).
    const bool transported = !d.event_key.empty();
    const auto& key = transported ? d.event_key : message_id;
    const auto key_hash = transported ? d.event_key_hash : hash;
    // event_contents first: the inbox's entry under the event id may be a later delivery
    // without a transport id that was itself an id conflict. Both keep the first delivery's
    // shape: another type, version or sequence is a republication (an upcast, a corrected
    // position), judged by the guards.
    auto seen = s_.event_contents->find(txn_, key, key_hash);
    if (!seen && transported) seen = s_.ids->find(txn_, key, key_hash);
    record_contents = transported && !seen;
    if (!seen) return std::nullopt;
    const auto first = layout::decode_inbox_first(seen->extra);
    if (first.fingerprint == 0 || first.fingerprint == d.fingerprint || first.event_mark != d.shape) return std::nullopt;
    ++stats.id_conflicts;
    const auto first_commit = seen->position == 0 ? commit_ : first.commit;
    return dead(d, reason::id_conflict,
                outcome_text::event_id_conflict(outcome_text::message_label(d.ev, false), message_id,
                                                first_commit, first.fingerprint, d.fingerprint));
}

}  // namespace idem::detail
