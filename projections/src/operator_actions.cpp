// Operator actions on a store: redrive dead letters, release parked streams, and the audit
// of both ("audit/<consumer>"); with the snapshot reads an operator needs to decide them.
// The audit record's codec is in layout.hpp.

#include <idem/projections/store.hpp>

#include <idem/projections/layout.hpp>

#include "event_ids.hpp"
#include "operator_session.hpp"
#include "store_internal.hpp"

#include <idem/storage/codec.hpp>
#include <idem/storage/duration.hpp>
#include <idem/storage/envelope.hpp>
#include <idem/storage/error.hpp>

#include <algorithm>
#include <map>
#include <set>

namespace idem {

namespace {

void record(detail::operator_session& op, MDB_dbi audit, operator_action a) {
    a.time_ns = op.now();
    a.commit = op.commit();
    cursor c{op.txn(), audit};
    auto last = c.last();
    const std::uint64_t position = last ? codec::get_u64_be(last->first) + 1 : 1;
    c.put(codec::u64_key(position), layout::encode_action(a), MDB_APPEND);
}

/// A parked entry: its sequence and stored value (layout::decode_parked reads it).
struct parked_entry {
    std::uint64_t sequence = 0;
    std::string key;
    std::string value;
};

std::vector<parked_entry> parked_of(const txn_base& txn, MDB_dbi parked, std::string_view subject) {
    std::vector<parked_entry> out;
    const auto prefix = codec::contributor_key(subject, {});
    cursor c{txn, parked};
    for (auto e = c.seek(prefix); e && e->first.starts_with(prefix); e = c.next()) {
        auto k = codec::decode_table_key(e->first);
        if (!k || k->aggregate != subject || k->effect.size() != 8) continue;
        out.push_back(parked_entry{codec::get_u64_be(k->effect), std::string(e->first), std::string(e->second)});
    }
    return out;
}

std::string list(const std::vector<std::uint64_t>& v) {
    std::string out;
    for (auto s : v) out += (out.empty() ? "" : ",") + std::to_string(s);
    return out;
}

std::string ranges(const std::vector<sequence_range>& v) {
    std::string out;
    for (const auto& r : v) {
        out += (out.empty() ? "" : ",") + std::to_string(r.from);
        if (r.to != r.from) out += "-" + std::to_string(r.to);
    }
    return out;
}

}  // namespace

release_result store::release(std::string_view subject_view, const release_options& options) {
    const std::string subject(subject_view);
    if (this->options().gaps != gap_policy::park && !options.drop) {
        throw_error(errc::invalid_argument, "releasing parked events applies them as the park gap policy does; "
                                            "this store was opened with another policy");
    }
    const auto audit = impl_->env->table(layout::audit_table(this->options().consumer));  // before the write transaction
    release_result result;
    operate([&](detail::operator_session& op) {
        result = release_result{};
        result.subject = subject;
        auto entries = parked_of(op.txn(), op.parked_table(), subject);
        if (entries.empty()) {
            throw_error(errc::invalid_argument, "stream '" + subject + "' has nothing parked");
        }
        result.highest_before = op.stream_highest(subject);
        operator_action a;
        a.stream = subject;
        a.note = options.note;
        if (options.drop) {
            a.action = "release_drop";
            for (const auto& e : entries) {
                const auto [message_id, rest] = layout::decode_parked(e.value);
                op.unpark(e.key);
                op.dead_letter(reason::released_dropped,
                               "sequence " + std::to_string(e.sequence) + " of '" + subject +
                                   "' was parked waiting for " + std::to_string(result.highest_before + 1) +
                                   " and dropped by an operator" + (options.note.empty() ? "" : ": " + options.note),
                               message_id, rest);
                result.dropped.push_back(e.sequence);
            }
            // Like any dead-lettered sequenced event, a dropped one moves its stream on.
            op.set_stream(subject, std::max(result.highest_before, entries.back().sequence));
            a.sequences = result.dropped;
        } else {
            a.action = "release";
            // Each gap is skipped: the stream moves to just before the next parked event and the
            // apply path releases it and its consecutive successors.
            for (const auto& e : entries) {
                const auto highest = op.stream_highest(subject);
                if (e.sequence <= highest) continue;  // released with its predecessor
                if (e.sequence > highest + 1) result.skipped.push_back({highest + 1, e.sequence - 1});
                op.release_after(subject, e.sequence - 1);
            }
            for (const auto& e : entries) {
                if (!op.is_parked(e.key)) result.released.push_back(e.sequence);
            }
            a.skipped = result.skipped;
            a.sequences = result.released;
        }
        result.highest_after = op.stream_highest(subject);
        a.summary = options.drop ? "dropped sequences " + list(result.dropped) + " of '" + subject +
                                       "' to dead letters; stream moved from " + std::to_string(result.highest_before) +
                                       " to " + std::to_string(result.highest_after)
                                 : "released sequences " + list(result.released) + " of '" + subject +
                                       "' skipping " + (result.skipped.empty() ? "nothing" : ranges(result.skipped)) +
                                       "; stream moved from " + std::to_string(result.highest_before) + " to " +
                                       std::to_string(result.highest_after);
        result.commit = op.commit();
        record(op, audit, std::move(a));
        return true;
    });
    return result;
}

redrive_result store::redrive(const redrive_options& options) {
    const auto audit = impl_->env->table(layout::audit_table(this->options().consumer));
    redrive_result result;
    operate([&](detail::operator_session& op) {
        result = redrive_result{};
        envelope_parser parser;
        std::vector<std::pair<std::uint64_t, std::string>> taken;  // position, value (copied: the table changes)
        {
            cursor c{op.txn(), op.dead_table()};
            for (auto e = c.first(); e; e = c.next()) taken.emplace_back(codec::get_u64_be(e->first), e->second);
        }
        std::vector<std::uint64_t> positions;
        for (const auto& [position, value] : taken) {
            if (options.position && *options.position != position) continue;
            auto letter = layout::decode_dead_letter(position, value);
            const std::string_view v = letter.body;
            redriven item;
            item.position = position;
            item.was = letter.why;
            item.message_id = std::move(letter.message_id);
            const bool truncated = letter.truncated;
            if (options.why && *options.why != item.was) continue;
            envelope ev;
            parse_error err;
            const bool parsed = !truncated && parser.parse(v, ev, err);
            if (options.event_id && (!parsed || ev.event_id() != *options.event_id)) continue;
            auto refuse = [&](std::string why) {
                item.refused = true;
                item.result = outcome{outcome_kind::dead_lettered, item.was, std::move(why), 0};
                ++result.refused;
                result.items.push_back(std::move(item));
            };
            if (truncated) {
                refuse("only the first bytes of its envelope were kept (too_large): nothing to apply");
                continue;
            }
            if (item.was == reason::id_conflict) {
                refuse("another version of this message was applied first; the first effect stands");
                continue;
            }
            if (item.was == reason::late_event && parsed) {
                if (auto why = op.unprovable(item.message_id, v); !why.empty()) {
                    refuse("late, and " + why);
                    continue;
                }
            }
            if (parsed && ev.sequence && !options.out_of_order) {
                refuse("sequence " + std::to_string(*ev.sequence) + " of '" + ev.subject +
                       "': its stream moved past it; --out-of-order applies it to the rows that do not hold a "
                       "later sequence of its stream");
                continue;
            }
            positions.push_back(position);
            if (!parsed) {
                op.dead_letter(err.why, "malformed event: " + err.detail, item.message_id, v);
                item.result = outcome{outcome_kind::dead_lettered, err.why, "malformed event: " + err.detail, 0};
            } else {
                item.result = op.reapply(ev, item.message_id, v);
            }
            item.result.commit = op.commit();
            switch (item.result.kind) {
            case outcome_kind::applied: ++result.applied; break;
            case outcome_kind::dead_lettered: ++result.dead_lettered; break;
            default: ++result.duplicates; break;
            }
            result.items.push_back(std::move(item));
        }
        if (positions.empty()) return false;  // nothing taken: nothing to commit
        // What failed again is written first, so its positions follow every existing one and a
        // position is never reused; then the dead letters taken leave, in the same transaction.
        op.write_dead_letters();
        for (auto position : positions) op.txn().del(op.dead_table(), codec::u64_key(position));
        result.commit = op.commit();
        operator_action a;
        a.action = "redrive";
        a.sequences = positions;
        a.note = options.note;
        a.summary = "redrove " + std::to_string(positions.size()) + " dead letters: applied " +
                    std::to_string(result.applied) + ", already held " + std::to_string(result.duplicates) +
                    ", dead-lettered again " + std::to_string(result.dead_lettered) +
                    (options.out_of_order ? " (out of order allowed)" : "") + "; refused " +
                    std::to_string(result.refused);
        record(op, audit, std::move(a));
        return true;
    });
    return result;
}

event_clock_result store::set_event_time_back(std::uint64_t time_ns, const std::string& note) {
    const auto audit = impl_->env->table(layout::audit_table(this->options().consumer));
    event_clock_result result;
    operate([&](detail::operator_session& op) {
        auto& clock = op.clock();
        result = event_clock_result{};
        result.before = clock.event_time;
        if (clock.event_time == 0) {
            throw_error(errc::invalid_argument, "consumer '" + options().consumer + "' has no event time yet: nothing to set back");
        }
        if (time_ns == 0 || time_ns >= clock.event_time) {
            throw_error(errc::invalid_argument, "event time " + format_utc(time_ns) + " is not before the event clock of consumer '" +
                                                    options().consumer + "' (" + format_utc(clock.event_time) +
                                                    "): it is only ever set back");
        }
        // Only the clock moves: the floors below which effect keys and ids were pruned stay, so an
        // event below them is still late, whatever the horizon says now.
        if (!clock.jump_votes.empty()) {
            result.dropped_jump = clock.jump_time;
            result.dropped_votes = clock.jump_votes.size();
        }
        clock.event_time = time_ns;
        clock.jump_time = 0;
        clock.jump_votes.clear();
        clock.jump_sources.clear();
        result.after = time_ns;
        result.commit = op.commit();
        operator_action a;
        a.action = "event_clock";
        a.note = note;
        a.summary = "set the event clock back from " + format_utc(result.before) + " to " + format_utc(result.after);
        if (result.dropped_votes != 0) {
            a.summary += "; dropped a pending jump to " + format_utc(result.dropped_jump) + " (" +
                         std::to_string(result.dropped_votes) + " vote" + (result.dropped_votes == 1 ? "" : "s") + ")";
        }
        record(op, audit, std::move(a));
        return true;
    });
    return result;
}

std::uint64_t store::record_action(const std::string& action, const std::string& note, const std::string& summary) {
    const auto audit = impl_->env->table(layout::audit_table(this->options().consumer));
    std::uint64_t commit = 0;
    operate([&](detail::operator_session& op) {
        operator_action a;
        a.action = action;
        a.note = note;
        a.summary = summary;
        record(op, audit, std::move(a));
        commit = op.commit();
        return true;
    });
    return commit;
}

// --- a consumer's parked events and audit, as a snapshot sees them ----------------------------

std::vector<parked_stream> consumer_view::parked_streams() const {
    std::vector<parked_stream> out;
    auto parked = snap_->table(layout::parked_table(name_));
    if (!parked) return out;
    auto streams = snap_->table(layout::streams_table(name_));
    std::map<std::string, std::size_t> at_message;  // parked message id -> index in out
    {
        cursor c{snap_->txn, *parked};
        for (auto e = c.first(); e; e = c.next()) {
            auto k = codec::decode_table_key(e->first);
            if (!k || k->effect.size() != 8) continue;
            if (out.empty() || out.back().subject != k->aggregate) {
                parked_stream s;
                s.subject = k->aggregate;
                if (streams) {
                    if (auto h = snap_->txn.get(*streams, s.subject); h && h->size() >= 8) s.highest = codec::get_u64_le(*h);
                }
                out.push_back(std::move(s));
            }
            auto& s = out.back();
            const auto seq = codec::get_u64_be(k->effect);
            const auto before = s.sequences.empty() ? s.highest : s.sequences.back();
            if (seq > before + 1) s.missing.push_back({before + 1, seq - 1});
            s.sequences.push_back(seq);
            at_message.emplace(std::string(layout::decode_parked(e->second).first), out.size() - 1);
        }
    }
    // When each was parked: its message id's inbox stamp (one walk of the inbox).
    if (auto inbox = snap_->table(layout::inbox_table(name_)); inbox && !at_message.empty()) {
        cursor c{snap_->txn, *inbox};
        for (auto e = c.first(); e; e = c.next()) {
            const auto entry = layout::decode_inbox_entry(e->second);
            if (!entry) continue;
            auto it = at_message.find(std::string(entry->message_id));
            if (it == at_message.end()) continue;
            auto& s = out[it->second];
            const auto stamp = entry->record.stamp;
            if (s.oldest_ns == 0 || stamp < s.oldest_ns) s.oldest_ns = stamp;
        }
    }
    return out;
}

std::vector<consumer_view::parked_event> consumer_view::parked_events() const {
    std::vector<parked_event> out;
    auto parked = snap_->table(layout::parked_table(name_));
    if (!parked) return out;
    auto streams = snap_->table(layout::streams_table(name_));
    cursor c{snap_->txn, *parked};
    for (auto e = c.first(); e; e = c.next()) {
        auto k = codec::decode_table_key(e->first);
        if (!k || k->effect.size() != 8) continue;
        parked_event p;
        p.subject = k->aggregate;
        p.sequence = codec::get_u64_be(k->effect);
        std::uint64_t highest = 0;
        if (streams) {
            if (auto h = snap_->txn.get(*streams, p.subject); h && h->size() >= 8) highest = codec::get_u64_le(*h);
        }
        p.waiting_for = highest + 1;
        const auto [message_id, body] = layout::decode_parked(e->second);
        p.message_id = message_id;
        p.body = body;
        out.push_back(std::move(p));
    }
    return out;
}

std::vector<operator_action> consumer_view::operator_actions() const {
    std::vector<operator_action> out;
    auto t = snap_->table(layout::audit_table(name_));
    if (!t) return out;
    cursor c{snap_->txn, *t};
    for (auto e = c.first(); e; e = c.next()) out.push_back(layout::decode_action(codec::get_u64_be(e->first), e->second));
    return out;
}

std::vector<std::string> consumer_view::message_ids_of(std::string_view event_id) const {
    std::vector<std::string> out{"e" + std::string(event_id)};
    if (auto t = snap_->table(layout::event_ids_table(name_))) {
        for (auto& m : detail::event_id_log::message_ids(snap_->txn, *t, event_id)) out.push_back(std::move(m));
    }
    return out;
}

std::optional<std::string> consumer_view::event_id_of(std::string_view message_id) const {
    auto t = snap_->table(layout::event_ids_table(name_));
    if (!t) return std::nullopt;
    return detail::event_id_log::event_id(snap_->txn, *t, message_id);
}

}  // namespace idem
