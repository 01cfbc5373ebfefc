#include "commands.hpp"

#include <idem/storage/duration.hpp>
#include <idem/projections/explain.hpp>
#include <idem/storage/envelope.hpp>

#include <cstdio>

namespace idem::cli::detail {

void require_store(const std::filesystem::path& db) {
    if (!std::filesystem::exists(db / "data.mdb")) {
        throw std::system_error(ENOENT, std::system_category(), db.string() + ": no idem environment here");
    }
}

int why(const tool_context& t, const arguments& a) {
    std::filesystem::path db = a.required("db");
    require_store(db);
    why_query q;
    if (auto ev_text = a.get("event")) {
        auto slash = ev_text->rfind('/');
        if (slash == std::string::npos || slash == 0 || slash + 1 == ev_text->size()) {
            throw usage_error("option '--event': '" + *ev_text + "' is not SOURCE/ID");
        }
        q.source = ev_text->substr(0, slash);
        q.id = ev_text->substr(slash + 1);
    } else if (auto m = a.get("message")) {
        q.message = *m;
        q.transport = a.get("transport").value_or("");
    } else {
        throw usage_error("give --event SOURCE/ID or --message ID");
    }
    auto snap = snapshot::open(db);
    if (auto key = a.get("key")) {
        q.key = *key;
        for (const auto& p : t.projections) {
            if (auto only = a.get("projection")) {
                if (p->name() == *only) q.projections.push_back(p.get());
            } else if (snap.raw_row(p->name(), *key)) {
                q.projections.push_back(p.get());
            }
        }
        if (auto only = a.get("projection"); only && q.projections.empty()) {
            std::string known;
            for (const auto& p : t.projections) known += (known.empty() ? "" : ", ") + p->name();
            throw usage_error("no projection named '" + *only + "' (this tool has: " + known + ")");
        }
    }
    const auto x = explain(snap, t.consumer, q);
    std::string out = "{\"answer\":";
    append_json_string(out, x.answer);
    if (x.first) {
        out += ",\"commit\":" + std::to_string(x.first->commit);
        out += ",\"first_seen_ns\":" + std::to_string(x.first->stamp);
    }
    if (!x.message_id.empty()) {
        out += x.message_id.starts_with('e') ? ",\"event_message_id\":" : ",\"message_id\":";
        const auto [transport, id] = split_message_id(x.message_id);
        append_json_string(out, id);
        if (!transport.empty()) {
            out += ",\"transport\":";
            append_json_string(out, transport);
        }
    }
    if (x.parked) {
        out += ",\"parked\":{\"subject\":";
        append_json_string(out, x.parked->subject);
        out += ",\"sequence\":" + std::to_string(x.parked->sequence) +
               ",\"waiting_for\":" + std::to_string(x.parked->waiting_for) + "}";
    }
    if (x.dead) {
        out += ",\"dead_letter\":{\"position\":" + std::to_string(x.dead->position) + ",\"reason\":";
        append_json_string(out, to_string(x.dead->why));
        out += "}";
    }
    out += ",\"detail\":";
    append_json_string(out, x.detail);
    if (q.key) {
        out += ",\"rows\":[";
        for (std::size_t i = 0; i < x.rows.size(); ++i) {
            const auto& r = x.rows[i];
            if (i != 0) out.push_back(',');
            out += "{\"projection\":";
            append_json_string(out, r.projection);
            out += ",\"key\":";
            append_json_string(out, r.key);
            out += ",\"effect_key\":";
            if (r.effect_key) {
                append_json_string(out, *r.effect_key);
            } else {
                out += "null";
            }
            out += ",\"holds_effect\":";
            out += r.holds ? (*r.holds ? "true" : "false") : "null";
            out += ",\"note\":";
            append_json_string(out, r.note);
            out += "}";
        }
        out += "]";
    }
    out += "}\n";
    std::fprintf(stderr, "%s\n", x.detail.c_str());
    output w;
    w.write(out);
    w.flush();
    return 0;
}

}  // namespace idem::cli::detail
