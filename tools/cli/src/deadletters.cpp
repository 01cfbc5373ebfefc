// `deadletters` prints what the apply path set aside, one JSON line each, with the event as
// it was received; `--collisions` prints the transport collisions the same way.

#include "commands.hpp"
#include "json_writer.hpp"
#include "options.hpp"

#include <idem/projections/explain.hpp>
#include <idem/storage/envelope.hpp>

#include <simdjson.h>

#include <cinttypes>
#include <cstdio>

namespace idem::cli::detail {

namespace {

int deadletters(const tool_context& t, const arguments& a) {
    std::filesystem::path db = a.required("db");
    std::optional<reason> only;
    if (a.get("reason")) only = reason_option(a, "reason");
    require_store(db);
    const auto snap = snapshot::open(db);
    const auto tables = snap.consumer(t.consumer);
    simdjson::dom::parser parser;
    output out;
    std::string line;
    std::string compact;
    for (const auto& d : a.flag("collisions") ? tables.collisions() : tables.dead_letters()) {
        if (only && d.why != *only) continue;
        line.clear();
        json_writer w{line};
        w.begin_object().field("position", d.position).field("reason", to_string(d.why)).field("detail", located_detail(d));
        // Stored ids carry a namespace: 'm' transport id, 't' transport id of a named transport, 'e' event id.
        const auto [transport, id] = split_message_id(d.message_id);
        w.field("message_id", id);
        if (!transport.empty()) w.field("transport", transport);
        w.field("time_ns", d.time_ns).field("size", d.body_size);
        if (d.truncated) {
            // Only the first bytes were kept: the body is a prefix, never parsed as the event.
            w.field("truncated", true).field("kept", d.body.size());
            char hex[32];
            std::snprintf(hex, sizeof hex, "%016" PRIx64, d.body_digest);
            w.field("digest", "fnv1a64:" + std::string(hex)).field("body_prefix", d.body);
        } else {
            compact.resize(d.body.size());
            std::size_t n = 0;
            simdjson::padded_string padded{d.body};
            simdjson::dom::element e;
            if (parser.parse(padded).get(e) == simdjson::SUCCESS &&
                simdjson::minify(d.body.data(), d.body.size(), compact.data(), n) == simdjson::SUCCESS) {
                compact.resize(n);
                w.key("envelope").raw(compact);  // the event as received, compacted
            } else {
                w.field("body", d.body);  // not JSON: the text as received
            }
        }
        w.end_object();
        line += "\n";
        out.write(line);
    }
    out.flush();
    return 0;
}

}  // namespace

command deadletters_command(context_fn t) {
    return command{
        "deadletters",
        "print the dead letters as JSON Lines: position, reason, detail, message id, time, and the event",
        {db_option, {"reason", "R", "only dead letters with this reason"},
         {"collisions", "", "instead, the transport collisions: deliveries under a transport id another event had "
                            "used, each judged as a new message (its outcome in the detail)"}},
        [t](const arguments& a) { return deadletters(t(), a); }};
}

}  // namespace idem::cli::detail
