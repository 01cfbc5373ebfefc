// `publish` feeds a NATS JetStream stream from event logs (idem::jetstream::publish): the JSON
// result on stdout, a summary on stderr. Built only with the meson feature `jetstream`.

#include "commands.hpp"
#include "json_writer.hpp"
#include "nats_library.hpp"
#include "options.hpp"
#include "text.hpp"

#include <idem/sources/jetstream_publish.hpp>
#include <idem/storage/duration.hpp>

#include <algorithm>
#include <cstdio>
#include <limits>

namespace idem::cli::detail {

void publishing_from(const arguments& a, jetstream::stream_publishing& o) {
    auto replicas = a.positive("replicas", 1);
    if (replicas > 5) throw usage_error("option '--replicas': " + std::to_string(replicas) + " is more than 5");
    o.replicas = static_cast<int>(replicas);
    o.duplicates_window = duration_option(a, "duplicates-window");
    if (o.duplicates_window && o.duplicates_window->count() <= 0) {
        throw usage_error("option '--duplicates-window': must be longer than 0");
    }
    if (auto d = duration_option(a, "broker-outage-limit")) {
        o.retry_for = std::chrono::duration_cast<std::chrono::milliseconds>(*d);
    }
    o.max_pending =
        static_cast<std::size_t>(std::min<std::uint64_t>(a.positive("max-pending", o.max_pending), 1u << 20));
}

namespace {

jetstream::publish_options options_from(const arguments& a) {
    jetstream::publish_options o;
    o.servers = {a.required("nats")};  // split by the library
    o.stream = a.required("stream");
    o.subject = a.required("subject");
    o.subject_template = a.get("subject-template").value_or("");
    for (const auto& l : a.all("log")) o.logs.emplace_back(l);
    o.format = format_from(a);
    o.skip_bad = a.flag("skip-bad");
    auto msg_id = a.get("msg-id").value_or("envelope");
    if (msg_id == "envelope") {
        o.msg_id = jetstream::msg_id_policy::envelope;
    } else if (msg_id == "none") {
        o.msg_id = jetstream::msg_id_policy::none;
    } else {
        throw usage_error("option '--msg-id': '" + msg_id + "' is neither envelope nor none");
    }
    publishing_from(a, o);
    return o;
}

std::string result_json(const jetstream::publish_result& r) {
    std::string out;
    json_writer w{out};
    const double secs = seconds(std::chrono::duration_cast<std::chrono::steady_clock::duration>(r.elapsed));
    w.begin_object()
        .field("records", r.records)
        .field("published", r.published)
        .field("stored", r.stored)
        .field("duplicates", r.duplicates)
        .field("malformed", r.malformed)
        .field("too_large", r.too_large)
        .field("retries", r.retries)
        .field("skipped", r.skipped)
        .field("first_sequence", r.first_sequence)
        .field("last_sequence", r.last_sequence)
        .field("stream_created", r.stream_created)
        .field("duplicates_window", format_duration(r.duplicates_window));
    w.key("seconds").fixed(secs, 3);
    w.key("messages_per_second").fixed(static_cast<double>(r.published) / std::max(secs, 1e-9), 0);
    w.end_object();
    out += "\n";
    return out;
}

void print_summary(const arguments& a, const jetstream::publish_options& o, const jetstream::publish_result& r) {
    const double secs = seconds(std::chrono::duration_cast<std::chrono::steady_clock::duration>(r.elapsed));
    std::string line =
        "publish: " + with_commas(r.published) + " messages to stream '" + o.stream + "' in " + fixed(secs, 2) +
        " s (" + with_commas(static_cast<std::uint64_t>(static_cast<double>(r.published) / std::max(secs, 1e-9))) +
        " messages/s): " + with_commas(r.stored) + " stored";
    if (r.stored != 0) {
        line += " (sequences " + std::to_string(r.first_sequence) + "-" + std::to_string(r.last_sequence) + ")";
    }
    line += ", " + with_commas(r.duplicates) + " duplicates dropped by the stream's " +
            format_duration(r.duplicates_window) + " window, " + with_commas(r.malformed) +
            " malformed (published without a message id)";
    if (r.retries != 0) line += ", " + with_commas(r.retries) + " publishes retried";
    if (r.skipped != 0) line += ", " + with_commas(r.skipped) + " corrupt records skipped";
    if (r.stream_created) line += "; stream created";
    std::fprintf(stderr, "%s\n", line.c_str());
    // The options that only shape a new stream: say so when the existing one differs.
    if (!r.stream_created) {
        if (o.duplicates_window && *o.duplicates_window != r.duplicates_window) {
            std::fprintf(
                stderr, "publish: stream '%s' exists with a %s Duplicates window; --duplicates-window %s not applied\n",
                o.stream.c_str(), format_duration(r.duplicates_window).c_str(), a.get("duplicates-window")->c_str());
        }
        if (a.get("replicas") && o.replicas != r.replicas) {
            std::fprintf(stderr, "publish: stream '%s' exists with %d replicas; --replicas %d not applied\n",
                         o.stream.c_str(), r.replicas, o.replicas);
        }
    }
    for (const auto& t : r.too_large_records) {
        std::fprintf(stderr, "publish: %s not published: larger than the server accepts\n", t.c_str());
    }
    for (const auto& t : r.torn_tails) std::fprintf(stderr, "publish: %s\n", t.c_str());
}

int publish(const arguments& a) {
    nats_library_scope nats;
    auto o = options_from(a);
    auto r = jetstream::publish(o);
    print_summary(a, o, r);
    print(result_json(r));
    if (r.too_large != 0 && !a.flag("skip-too-large")) {
        // Counted and named above, but an event left out of the stream is not a success.
        std::fprintf(stderr,
                     "publish: %s records not published (larger than the server's max payload): exit 2 "
                     "(--skip-too-large leaves them out with exit 0)\n",
                     with_commas(r.too_large).c_str());
        return 2;
    }
    return 0;
}

}  // namespace

command publish_command() {
    return command{
        "publish",
        "publish event logs to a NATS JetStream stream, one message per record (its text unchanged), creating the "
        "stream if it is missing. Nats-Msg-Id is the envelope's msgid, else its encoded source and id: the stream's "
        "Duplicates window (default 2m) is the publisher-side dedup, so a republish under the same id within the "
        "window stores nothing; outside it, or under a new id, the stream stores it again and the consumer's inbox "
        "and effect keys catch it. Malformed records are published without an id (the consumer dead-letters them)",
        {{"nats", "URL[,URL...]", "the NATS servers (nats://host:port), several of a cluster separated by commas",
          true},
         {"stream", "S", "the stream (created with file storage if it does not exist; an existing one is not changed)",
          true},
         {"subject", "SUBJ",
          "the subject the stream captures; with a wildcard (orders.> or orders.*) each message goes to the envelope's "
          "subject in its place (orders.o-1; 'events' if it has none)",
          true},
         {"subject-template", "T",
          "each message's subject: T with every whole {subject} token replaced by the envelope's subject as one "
          "token (orders.{subject}; '.', '*', '>', '%', spaces and other bytes outside 0x21-0x7E percent-encoded, "
          "'events' if it has none); --subject must capture it"},
         log_option,
         format_option,
         skip_bad_option,
         {"msg-id", "envelope|none",
          "envelope (default): Nats-Msg-Id from the envelope, so the window drops redeliveries; none: no header, every "
          "record is stored"},
         {"replicas", "R", "a new stream's replicas (default 1)"},
         {"duplicates-window", "D", "a new stream's Duplicates window (default the server's, 2m)"},
         {"max-pending", "N", "publishes awaiting their ack at most (default 1024)"},
         {"broker-outage-limit", "D",
          "how long the stream's set-up, and each failing message, is retried while the broker or its cluster is "
          "out of reach or still forming (timeouts, no responders, no leader) before exit 2 (default 60s)"},
         {"skip-too-large", "",
          "records over the server's max payload (1 MiB by default) are named and left out, and the command exits 0 "
          "(without it: the rest is published, then exit 2)"}},
        publish};
}

}  // namespace idem::cli::detail
