// `relay` publishes a store's change feed to a NATS JetStream stream (idem::jetstream::relay), the
// transactional outbox: the JSON result on stdout, a one-line summary on stderr. With --follow it
// keeps publishing new commits until Ctrl-C or SIGTERM, then stops once the acks in flight are in.
// Built only with the meson feature `jetstream`.

#include "commands.hpp"
#include "interrupt.hpp"
#include "json_writer.hpp"
#include "nats_library.hpp"
#include "options.hpp"
#include "text.hpp"

#include <idem/sources/jetstream_relay.hpp>
#include <idem/storage/duration.hpp>

#include <algorithm>
#include <cstdio>

namespace idem::cli::detail {

namespace {

jetstream::relay_options options_from(const tool_context& t, const arguments& a) {
    jetstream::relay_options o;
    o.servers = {a.required("nats")};  // split by the library
    o.db = a.required("db");
    require_store(o.db);
    o.stream = a.required("stream");
    o.prefix = a.required("subject");
    o.projection = a.get("projection");
    if (o.projection) t.projection_named(*o.projection);  // a usage error naming the tool's projections
    for (const auto& p : t.projections) o.projections.push_back(p.get());
    const bool follow = a.flag("follow");
    if (follow && a.flag("until-caught-up")) throw usage_error("--follow and --until-caught-up exclude each other");
    o.follow = follow;
    o.poll = std::chrono::milliseconds(a.positive("poll-ms", 100));
    o.read_limit = static_cast<std::size_t>(std::min<std::uint64_t>(a.positive("limit", 1000), 1u << 20));
    publishing_from(a, o);
    return o;
}

std::string result_json(const jetstream::relay_result& r) {
    std::string out;
    json_writer w{out};
    const double secs = seconds(std::chrono::duration_cast<std::chrono::steady_clock::duration>(r.elapsed));
    w.begin_object()
        .field("store_id", r.store_id)
        .field("resumed_after", r.resumed_after)
        .field("last_position", r.last_position)
        .field("entries", r.entries)
        .field("changes", r.changes)
        .field("resets", r.resets)
        .field("published", r.published)
        .field("stored", r.stored)
        .field("duplicates", r.duplicates)
        .field("retries", r.retries)
        .field("first_sequence", r.first_sequence)
        .field("last_sequence", r.last_sequence)
        .field("stream_created", r.stream_created)
        .field("duplicates_window", format_duration(r.duplicates_window));
    w.key("seconds").fixed(secs, 3);
    w.key("changes_per_second").fixed(static_cast<double>(r.changes) / std::max(secs, 1e-9), 0);
    w.end_object();
    out += "\n";
    return out;
}

void print_summary(const jetstream::relay_options& o, const jetstream::relay_result& r) {
    const double secs = seconds(std::chrono::duration_cast<std::chrono::steady_clock::duration>(r.elapsed));
    std::string line = "relay: " + with_commas(r.changes) + " changes";
    if (r.resets != 0) line += " and " + with_commas(r.resets) + " resets";
    line += " of store " + r.store_id + " to stream '" + o.stream + "' in " + fixed(secs, 2) + " s (" +
            with_commas(static_cast<std::uint64_t>(static_cast<double>(r.changes) / std::max(secs, 1e-9))) +
            " changes/s), " +
            (r.resumed_after.empty() ? std::string("from the feed's oldest entry")
                                     : "resuming after " + r.resumed_after) +
            (r.last_position.empty() ? std::string() : " through " + r.last_position) + ": " +
            with_commas(r.stored) + " stored";
    if (r.stored != 0) {
        line += " (sequences " + std::to_string(r.first_sequence) + "-" + std::to_string(r.last_sequence) + ")";
    }
    line += ", " + with_commas(r.duplicates) + " duplicates dropped by the stream's " +
            format_duration(r.duplicates_window) + " window";
    if (r.retries != 0) line += ", " + with_commas(r.retries) + " publishes retried";
    if (r.stream_created) line += "; stream created";
    std::fprintf(stderr, "%s\n", line.c_str());
}

int relay(const tool_context& t, const arguments& a) {
    nats_library_scope nats;
    auto o = options_from(t, a);
    stop_signals signals;
    o.stop = &stop_requested;
    auto r = jetstream::relay(o);
    print_summary(o, r);
    print(result_json(r));
    return 0;
}

}  // namespace

command relay_command(context_fn t) {
    return command{
        "relay",
        "publish a store's change feed to a NATS JetStream stream (the transactional outbox): each row change one "
        "CloudEvents message on SUBJ.<projection>.<key> (type idem.change.<projection>, subject the key, sequence "
        "the row's version, data its state, extension idemposition; Nats-Msg-Id <store id>/<projection>/<key>/"
        "<version>), a rebuild's reset one idem.reset.<projection> event. It resumes after the position the stream "
        "holds, so a killed relay loses nothing and what it sends again the stream's Duplicates window drops. A "
        "downstream idem consumes the stream with --gaps apply (versions skip within a commit)",
        {db_option,
         {"nats", "URL[,URL...]", "the NATS servers (nats://host:port), several of a cluster separated by commas",
          true},
         {"stream", "S", "the stream (created with subject SUBJ.> and file storage if it does not exist)", true},
         {"subject", "SUBJ",
          "the subjects' prefix: a change goes to SUBJ.<projection>.<key>, each a token with '.', '*', '>', '%', "
          "spaces and other bytes outside 0x21-0x7E percent-encoded (%2E for a dot)",
          true},
         {"projection", "NAME", "only this projection's changes"},
         {"follow", "", "keep publishing new commits until Ctrl-C or SIGTERM (then the acks in flight are waited for)"},
         {"until-caught-up", "", "stop once the feed is published to its end (the default)"},
         {"limit", "N", "feed entries read per step, whole commits (default 1000)"},
         {"poll-ms", "MS", "with --follow, how often to look for new commits when idle (default 100)"},
         {"replicas", "R", "a new stream's replicas (default 1)"},
         {"duplicates-window", "D", "a new stream's Duplicates window (default the server's, 2m)"},
         {"max-pending", "N", "publishes awaiting their ack at most (default 1024)"},
         {"broker-outage-limit", "D",
          "how long the stream's set-up, and each failing message, is retried while the broker or its cluster is "
          "out of reach before exit 2 (default 60s)"}},
        [t](const arguments& a) { return relay(t(), a); }};
}

}  // namespace idem::cli::detail
