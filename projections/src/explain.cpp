#include <idem/projections/explain.hpp>

#include "upcast_chain.hpp"

#include <idem/projections/layout.hpp>

#include <idem/storage/duration.hpp>
#include <idem/storage/envelope.hpp>
#include <idem/storage/error.hpp>
#include <idem/storage/log_position.hpp>

#include <algorithm>

namespace idem {

namespace {

/// Checks row `key` of p for the effect of the event whose body is known (or only its id).
why_row check_row(const snapshot& snap, const projection_base& p, const std::string& key,
                  const std::optional<envelope>& ev, const std::string& event_id, const detail::upcast_chain& upcasts) {
    why_row r;
    r.projection = p.name();
    r.key = key;
    if (ev) {
        // Lifted as the apply path lifts it (prepare.cpp): the handler is the lifted type's.
        auto lifted = upcasts.lift(*ev);
        const std::string type(lifted.type.empty() ? std::string_view(ev->type) : lifted.type);
        const auto* h = p.find(type);
        if (h == nullptr) {
            r.holds = false;
            r.note = "projection " + p.name() + " does not handle type '" + type + "'";
            return r;
        }
        if (!lifted.failure.empty()) {
            r.note = "its data cannot be read by projection " + p.name() + " (" + lifted.failure + "): no effect key";
            return r;
        }
        try {
            auto decoded = lifted.decode_for(*h, ev->data);
            meta m{ev->id, ev->source, ev->type, ev->subject, ev->sequence, ev->time, {}};  // as the apply path computes it
            r.effect_key = p.effect_key(*h, decoded.get(), m).value_or(event_id);
        } catch (const std::exception& e) {
            r.note = "its data does not decode for projection " + p.name() + " (" + e.what() + "): no effect key";
            return r;
        }
    } else if (event_id.empty()) {
        r.note = "the event's id is not known for this message, so its effect key cannot be computed";
        return r;
    } else if (!p.keys_effects()) {
        r.effect_key = event_id;
    } else {
        r.note = "projection " + p.name() +
                 " takes effect keys from the payload, and the event's body is not kept once it is processed "
                 "(only parked and dead-lettered events keep it): its effect key cannot be computed";
        return r;
    }
    const auto contributing = snap.projection(p.name());
    r.holds = contributing.contributed(key, *r.effect_key);
    r.note = "row '" + key + "' of " + p.name() + (*r.holds ? " holds" : " does not hold") + " its effect key '" +
             (*r.effect_key == event_id ? "(its event id)" : *r.effect_key) + "'";
    if (!*r.holds && contributing.contributor_floor() != 0) {
        r.note += " (effect keys from before " + format_utc(contributing.contributor_floor()) + " were pruned)";
    }
    return r;
}

}  // namespace

std::string located_detail(const dead_letter& d) {
    const auto path = log_source_path(d.source);
    if (!path) return d.detail;
    if (d.line != 0) {
        return std::string(*path) + ":" + std::to_string(d.line) + " (byte offset " + std::to_string(d.offset) + "): " +
               d.detail;
    }
    return std::string(*path) + " at byte offset " + std::to_string(d.offset) + ": " + d.detail;
}

explanation explain(const snapshot& snap, std::string_view consumer_name, const why_query& q) {
    const std::string consumer(consumer_name);
    const auto tables = snap.consumer(consumer);
    explanation x;
    std::vector<std::string> candidates;  // the message ids it may be recorded under
    std::string event_id;
    std::string label;
    if (!q.source.empty() && !q.id.empty()) {
        envelope e;
        e.source = q.source;
        e.id = q.id;
        event_id = e.event_id();
        candidates = tables.message_ids_of(event_id);
        label = "event " + q.source + " " + q.id;
    } else if (!q.message.empty()) {
        candidates.push_back(transport_message_id(q.transport, q.message));
        label = "message " + q.message + (q.transport.empty() ? std::string() : " of transport " + q.transport);
        if (q.transport.empty() && !tables.inbox_lookup(candidates.front())) {
            // No transport named: the id under whichever transport holds it (a log's, by default).
            if (auto found = tables.inbox_lookup_transport_id(q.message)) {
                candidates.front() = found->first;
                const auto [t, id] = split_message_id(found->first);
                if (!t.empty()) label += " of transport " + std::string(t);
            }
        }
        if (auto e = tables.event_id_of(candidates.front())) event_id = *e;
    } else {
        throw_error(errc::invalid_argument, "explain: name an event (source and id) or a message id");
    }
    auto candidate = [&](std::string_view m) {
        return std::find(candidates.begin(), candidates.end(), m) != candidates.end();
    };
    // The event may have arrived under several ids (a transport id, then re-sent): its story
    // starts with the earliest commit.
    // Within one commit, a delivery dead-lettered as another's id_conflict is not its story's start.
    for (const auto& m : candidates) {
        auto r = tables.inbox_lookup(m);
        if (r && (!x.first || r->commit < x.first->commit ||
                  (r->commit == x.first->commit && x.first->outcome == outcome_kind::dead_lettered &&
                   r->outcome != outcome_kind::dead_lettered))) {
            x.first = r;
            x.message_id = m;
        }
    }
    envelope_parser parser;
    std::optional<envelope> body;  // the event as received, when a table keeps it
    auto same_event = [&](std::string_view text, envelope& out) {
        parse_error err;
        return parser.parse(text, out, err) && !event_id.empty() && out.event_id() == event_id;
    };
    for (auto& p : tables.parked_events()) {
        envelope ev;
        const bool by_id = same_event(p.body, ev);
        if (!by_id && !candidate(p.message_id)) continue;
        x.parked = consumer_view::parked_record{p.subject, p.sequence, p.waiting_for};
        if (x.message_id.empty()) x.message_id = p.message_id;
        parse_error err;
        if (by_id || parser.parse(p.body, ev, err)) body = ev;
        break;
    }
    for (auto& d : tables.dead_letters()) {
        envelope ev;
        const bool by_id = !d.truncated && same_event(d.body, ev);
        if (!by_id && !candidate(d.message_id)) continue;
        if (d.why == reason::id_conflict) {
            ++x.id_conflicts;
            continue;
        }
        if (x.dead) continue;
        parse_error err;
        if (!body && !d.truncated && (by_id || parser.parse(d.body, ev, err))) body = ev;
        if (x.message_id.empty()) x.message_id = d.message_id;
        x.dead = std::move(d);
    }
    // Deliveries that reused a named message id for another event, or that carried this event
    // under a transport id another event had used (each judged as a new message).
    std::uint64_t collided = 0;
    std::optional<dead_letter> carried;
    for (auto& d : tables.collisions()) {
        envelope ev;
        if (!q.source.empty()) {
            if (!carried && same_event(d.body, ev)) carried = std::move(d);
        } else if (candidate(d.message_id)) {
            ++collided;
        }
    }
    if (event_id.empty() && body) event_id = body->event_id();

    auto& detail = x.detail;
    if (x.parked) {
        x.answer = "parked";
        detail = label + " is parked: sequence " + std::to_string(x.parked->sequence) + " of '" + x.parked->subject +
                 "' waits for sequence " + std::to_string(x.parked->waiting_for) +
                 (x.first ? " (since commit " + std::to_string(x.first->commit) + ")" : "") +
                 "; `release --stream` gives up on the gap";
    } else if (x.first) {
        const auto& first = *x.first;
        const auto when = " in commit " + std::to_string(first.commit) + " (first seen at " + format_utc(first.stamp) + ")";
        switch (first.outcome) {
        case outcome_kind::applied: x.answer = "applied"; detail = label + " was applied" + when; break;
        case outcome_kind::duplicate_event:
            x.answer = "duplicate_event";
            detail = label + " was a duplicate event" + when +
                     ": every row it maps to already held its effect key, or its stream a later sequence";
            break;
        case outcome_kind::parked:
            x.answer = "applied";
            detail = label + " was parked" + when + " and applied once its stream reached it (or an operator released it)";
            break;
        case outcome_kind::dead_lettered:
            x.answer = x.dead && x.dead->why == reason::late_event ? "late" : "dead_lettered";
            detail = label + " was dead-lettered" + when +
                     (x.dead ? ": " + std::string(to_string(x.dead->why)) + ": " + located_detail(*x.dead)
                             : std::string(" (its dead letter was redriven since)"));
            break;
        case outcome_kind::ignored:
            x.answer = "ignored";
            detail = label + " was ignored" + when + ": no projection handles its type";
            break;
        case outcome_kind::duplicate_message:
            x.answer = "duplicate_message";
            detail = label + " was a duplicate message" + when;
            break;
        }
        if (layout::is_transport_key(x.message_id) && !q.source.empty()) {
            const auto [transport, id] = split_message_id(x.message_id);
            detail += "; it was delivered under transport message id '" + std::string(id) + "'" +
                      (transport.empty() ? std::string() : " of transport " + std::string(transport));
        }
        detail += "; later deliveries under the same id are duplicate messages";
    } else if (carried && !x.dead) {
        x.answer = "transport_collision";
        detail = label + ": " + carried->detail;
    } else if (x.dead) {
        x.answer = x.dead->why == reason::late_event ? "late" : "dead_lettered";
        detail = label + " was dead-lettered: " + std::string(to_string(x.dead->why)) + ": " + located_detail(*x.dead);
    } else if (const auto retention = tables.retention(); retention.inbox_floor != 0) {
        x.answer = "not_in_inbox";
        detail = label + " is not in the inbox: never seen, or first seen before " + format_utc(retention.inbox_floor) +
                 " and pruned since (the inbox keeps ids from " + format_utc(retention.oldest.value_or(0)) + ")";
    } else {
        x.answer = "never_seen";
        detail = label + " was never seen by consumer '" + consumer + "'";
    }
    if (collided != 0) {
        detail += "; " + std::to_string(collided) + " later deliver" + (collided == 1 ? "y" : "ies") +
                  " under the same id carried other events (transport collisions, each judged as a new message: "
                  "`deadletters --collisions`)";
    }
    if (x.id_conflicts != 0) {
        detail += "; " + std::to_string(x.id_conflicts) + " later deliver" + (x.id_conflicts == 1 ? "y" : "ies") +
                  " under the same id with other content were dead-lettered as id_conflict (the first effect stands)";
    }
    if (q.key) {
        detail::upcast_chain upcasts;
        for (const auto& step : q.upcasters) upcasts.add(step);
        for (const auto* p : q.projections) {
            auto r = check_row(snap, *p, *q.key, body, event_id, upcasts);
            detail += "; " + r.note;
            x.rows.push_back(std::move(r));
        }
    }
    return x;
}

}  // namespace idem
