// `why` explains what became of one event (explain() in projections/): its JSON on stdout,
// the sentence on stderr.

#include "commands.hpp"
#include "json_writer.hpp"
#include "options.hpp"

#include <idem/projections/explain.hpp>
#include <idem/projections/layout.hpp>
#include <idem/storage/envelope.hpp>

#include <cstdio>

namespace idem::cli::detail {

namespace {

std::string explanation_json(const explanation& x, bool with_rows) {
    std::string out;
    json_writer w{out};
    w.begin_object().field("answer", x.answer);
    if (x.first) w.field("commit", x.first->commit).field("first_seen_ns", x.first->stamp);
    if (!x.message_id.empty()) {
        const auto [transport, id] = split_message_id(x.message_id);
        w.field(layout::is_event_key(x.message_id) ? "event_message_id" : "message_id", id);
        if (!transport.empty()) w.field("transport", transport);
    }
    if (x.parked) {
        w.key("parked").begin_object().field("subject", x.parked->subject);
        w.field("sequence", x.parked->sequence).field("waiting_for", x.parked->waiting_for).end_object();
    }
    if (x.dead) {
        w.key("dead_letter").begin_object().field("position", x.dead->position);
        w.field("reason", to_string(x.dead->why)).end_object();
    }
    w.field("detail", x.detail);
    if (with_rows) {
        w.key("rows").begin_array();
        for (const auto& r : x.rows) {
            w.begin_object().field("projection", r.projection).field("key", r.key).field("effect_key", r.effect_key);
            w.key("holds_effect");
            if (r.holds) {
                w.value(*r.holds);
            } else {
                w.null();
            }
            w.field("note", r.note).end_object();
        }
        w.end_array();
    }
    w.end_object();
    out += "\n";
    return out;
}

int why(const tool_context& t, const arguments& a) {
    std::filesystem::path db = a.required("db");
    require_store(db);
    why_query q;
    if (a.get("event")) {
        std::tie(q.source, q.id) = event_option(a, "event");
    } else if (auto m = a.get("message")) {
        q.message = *m;
        q.transport = a.get("transport").value_or("");
    } else {
        throw usage_error("give --event SOURCE/ID or --message ID");
    }
    auto snap = snapshot::open(db);
    if (auto key = a.get("key")) {
        q.key = *key;
        q.upcasters = t.upcasters;
        for (const auto& p : t.projections) {
            if (auto only = a.get("projection")) {
                if (p->name() == *only) q.projections.push_back(p.get());
            } else if (snap.raw_row(p->name(), *key)) {
                q.projections.push_back(p.get());
            }
        }
        if (auto only = a.get("projection"); only && q.projections.empty()) t.projection_named(*only);  // throws
    }
    const auto x = explain(snap, t.consumer, q);
    std::fprintf(stderr, "%s\n", x.detail.c_str());
    print(explanation_json(x, q.key.has_value()));
    return 0;
}

}  // namespace

command why_command(context_fn t) {
    return command{
        "why",
        "explain what became of an event: applied, duplicate, parked, dead-lettered, late, or never seen",
        {db_option,
         {"event", "SOURCE/ID", "the event: its source and id (split at the last '/')"},
         {"message", "ID", "or the transport message id it was delivered under"},
         {"transport", "NAME",
          "the transport of --message (a log's file name without rotation suffixes; default: any that holds it)"},
         {"key", "KEY", "also say whether this row holds the event's effect (its effect key per projection)"},
         {"projection", "NAME", "the projection of --key (default: every projection with that row)"}},
        [t](const arguments& a) { return why(t(), a); }};
}

}  // namespace idem::cli::detail
