// `consume --nats`: a durable JetStream consumer applied through the engine, each message
// acked after the commit that recorded it is durable. Ctrl-C or SIGTERM stops after the
// messages in hand are committed and acked.

#include "audit_file.hpp"
#include "commands.hpp"
#include "interrupt.hpp"
#include "json_writer.hpp"
#include "log_run.hpp"
#include "nats_library.hpp"
#include "health_file.hpp"
#include "pause_file.hpp"
#include "options.hpp"
#include "text.hpp"

#include <idem/engine/engine.hpp>
#include <idem/sources/jetstream.hpp>
#include <idem/storage/duration.hpp>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>

#include <cstdio>
#include <thread>

namespace idem::cli::detail {

namespace {

std::vector<std::chrono::nanoseconds> durations_option(const arguments& a, std::string_view name) {
    std::vector<std::chrono::nanoseconds> out;
    auto v = *a.get(name);
    std::size_t start = 0;
    while (start <= v.size()) {
        auto comma = v.find(',', start);
        auto part = v.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        auto d = parse_duration(part);
        if (!d) throw usage_error("option '--" + std::string(name) + "': '" + part + "' is not a duration (30s, 2m)");
        out.push_back(*d);
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    return out;
}

// --ack-log: one JSON line per ack or nak as it leaves (an audit of ack-after-commit).
void write_ack(audit_file& audit, const jetstream::ack_event& ev, std::uint64_t durable) {
    std::string line;
    json_writer w{line};
    w.begin_object()
        .field("seq", ev.stream_sequence)
        .field("delivered", ev.delivered)
        .field("msgid", ev.message_id)
        .field("acked", ev.acked)
        .field("outcome", ev.acked ? std::string(to_string(ev.result.kind)) : std::string("error"))
        .field("commit", ev.result.commit)
        .field("durable", durable);
    w.end_object();
    audit.write_line(std::move(line));
}

std::string result_json(const jetstream::source_result& r, const redelivery_bound& bound, const std::string& error) {
    std::string out;
    json_writer w{out};
    const double s = std::max(seconds(r.elapsed), 1e-9);
    w.begin_object()
        .field("fetched", r.fetched)
        .field("redelivered", r.redelivered)
        .field("acked", r.acked)
        .field("nakked", r.nakked)
        .field("last_sequence", r.last_sequence)
        .field("disconnects", r.disconnects)
        .field("broker_outages", r.broker_outages)
        .field("redelivery_bound", bound.what);
    w.key("seconds").fixed(seconds(r.elapsed), 3);
    w.field("messages_per_second", std::uint64_t(double(r.fetched) / s));
    w.key("outcomes").begin_object();
    for (std::size_t i = 0; i < outcome_kinds; ++i) w.field(to_string(static_cast<outcome_kind>(i)), r.outcomes[i]);
    w.end_object();
    if (!error.empty()) w.field("error", error);  // the run stopped on it (exit 2)
    w.end_object();
    return out + "\n";
}

}  // namespace

std::vector<option> jetstream_consume_options() {
    return {
        {"nats", "URL[,URL...]", "consume a NATS JetStream stream (servers of one cluster) instead of logs"},
        {"stream", "S", "with --nats: the stream (must exist: see idem publish)"},
        {"consumer", "NAME", "with --nats: the durable pull consumer, created if missing, bound if it exists"},
        {"subject", "FILTER", "with --nats: only the stream's subjects matching FILTER (when creating the consumer)"},
        {"ack-wait", "D", "with --nats: redelivered if not acked within D (default 30s; an existing consumer's)"},
        {"max-deliver", "N", "with --nats: deliveries of a message at most, -1 unlimited (default 5)"},
        {"backoff", "D,D,...", "with --nats: redelivery delays replacing --ack-wait (needs --max-deliver above their number)"},
        {"max-ack-pending", "N", "with --nats: messages delivered and not yet acked at most (default 1000)"},
        {"redelivery-bound", "D",
         "with --nats: how late a message may come again when --max-deliver is -1 (then required)"},
        {"fetch-batch", "N", "with --nats: messages per fetch at most (default 256)"},
        {"ack-sync", "", "with --nats: wait for the server to confirm each ack (a round trip per message)"},
        {"accept-stream-reset", "",
         "with --nats: resume although the stream went back behind the checkpoint (purged, recreated) instead "
         "of stopping with exit 2"},
        {"max-batch", "N",
         "with --nats: deliveries committed in one transaction at most (default 4096)"},
        {"max-delay", "D",
         "with --nats: how long a busy writer waits for --max-batch deliveries to gather before it commits "
         "what it has (default 0: commit at once; an idle writer never waits)"},
        {"accept-exhausted", "",
         "with --nats: start although an earlier run stopped because messages reached MaxDeliver without a "
         "committed outcome (published again, or given up); without it such a store is refused with exit 2"},
        {"until-caught-up", "",
         "with --nats: stop once everything up to the stream's last sequence at the start is acked; with "
         "--partitions, once every partition has an owner whose checkpoint reached that partition's last sequence "
         "at the start (or had one that stopped there)"},
        {"caught-up-wait", "D",
         "with --until-caught-up: how long to wait, connected and with nothing delivered, for the consumer to get "
         "there before stopping with exit 2 (default twice the longest AckWait or BackOff delay, at least 60s); "
         "what it waits for is printed every 5 s"},
        {"ack-log", "FILE", "with --nats: append one JSON line per ack or nak as it is sent (an audit)"},
        {"broker-outage-limit", "D",
         "with --nats: how long the broker may be out of reach (disconnected, refusing connections, its requests "
         "timing out or without responders, its cluster without a leader), at start-up or while running, before "
         "exit 2; meanwhile it reconnects and retries, and says so on stderr (default 60s)"},
        {"partitions", "N",
         "with --nats: partitioned mode: the stream captures '<prefix>.>' mapped to '<prefix>.<k>.<key>' for k < N; "
         "this instance takes partitions through leases in the KV bucket idem-leases-<consumer>, each into DIR/p<k>"},
        {"replica", "NAME",
         "with --nats: replicated mode: this instance's own durable consumer <consumer>-replica-NAME over the whole "
         "stream, and a full read model in --db (not with --partitions)"},
        {"instance", "NAME",
         "with --partitions: this instance's name in the lease bucket (default: host name and a hash of --db)"},
        {"lease-ttl", "D",
         "with --partitions: a lease not renewed within D expires and another instance takes the partition "
         "(default 10s; the bucket keeps the TTL it was created with)"},
        {"replay-threshold", "N",
         "with --partitions: a partition taken without a copy that holds at least N messages is rebuilt from the "
         "stream in one bulk build before its durable consumer follows (default 20000; 0: always through the "
         "durable consumer)"},
    };
}

void fill_source_options(const arguments& a, jetstream::source_options& so) {
    so.servers = jetstream::split_servers(a.required("nats"));
    so.stream = a.required("stream");
    so.consumer = a.required("consumer");
    if (auto f = a.get("subject")) so.filter_subject = *f;
    so.settings.ack_wait = duration_option(a, "ack-wait");
    if (a.get("max-deliver")) {
        auto v = a.required("max-deliver");
        so.settings.max_deliver = v == "-1" ? -1 : static_cast<std::int64_t>(a.positive("max-deliver", 1));
    }
    if (a.get("backoff")) so.settings.backoff = durations_option(a, "backoff");
    if (a.get("max-ack-pending")) so.settings.max_ack_pending = static_cast<std::int64_t>(a.positive("max-ack-pending", 1));
    so.redelivery_bound = duration_option(a, "redelivery-bound");
    if (a.get("fetch-batch")) so.fetch_batch = static_cast<std::size_t>(a.positive("fetch-batch", 1));
    so.ack_sync = a.flag("ack-sync");
    so.accept_stream_reset = a.flag("accept-stream-reset");
    so.accept_exhausted = a.flag("accept-exhausted");
    so.until_caught_up = a.flag("until-caught-up");
    if (auto d = duration_option(a, "caught-up-wait")) {
        if (!so.until_caught_up) throw usage_error("option '--caught-up-wait' needs --until-caught-up");
        so.caught_up_wait = std::chrono::duration_cast<std::chrono::milliseconds>(*d);
    }
    so.stop = &stop_requested;
    if (auto d = duration_option(a, "broker-outage-limit")) {
        if (d->count() <= 0) throw usage_error("option '--broker-outage-limit': must be longer than 0");
        so.broker_outage_limit = std::chrono::duration_cast<std::chrono::milliseconds>(*d);
    }
    // One line when the broker goes out of reach and one when it is back: an outage is visible.
    so.on_broker = [servers = a.required("nats")](const jetstream::broker_event& ev) {
        if (!ev.reachable) {
            std::fprintf(stderr, "consume: the broker at '%s' is out of reach (%s); reconnecting and retrying for up to %s\n",
                         servers.c_str(), ev.failure.c_str(), format_duration(ev.limit).c_str());
        } else {
            std::fprintf(stderr, "consume: the broker at '%s' is back after %s\n", servers.c_str(),
                         format_duration(ev.lasted).c_str());
        }
    };
}

namespace {

int consume_one(const tool_context& t, const arguments& a);

}  // namespace

int consume_jetstream(const tool_context& t, const arguments& a) {
    nats_library_scope nats;
    if (a.get("partitions")) return consume_partitioned(t, a);
    return consume_one(t, a);
}

namespace {

int consume_one(const tool_context& t, const arguments& a) {
    for (const char* name : {"instance", "lease-ttl", "replay-threshold"}) {
        if (a.get(name)) throw usage_error("option '--" + std::string(name) + "' needs --partitions");
    }
    jetstream::source_options so;
    fill_source_options(a, so);
    if (auto replica = a.get("replica")) {
        // Replicated mode: a durable of its own per replica, over the whole stream.
        if (replica->empty()) throw usage_error("option '--replica': the name is empty");
        so.consumer += "-replica-" + *replica;
    }
    std::optional<audit_file> audit;
    if (auto p = a.get("ack-log")) audit.emplace(*p, "ack-log");
    engine* applying = nullptr;  // set once the engine exists, before anything is acked
    if (audit) so.on_ack = [&](const jetstream::ack_event& ev) { write_ack(*audit, ev, applying->durable_commit()); };
    so.on_waiting = [](const std::string& what) { std::fprintf(stderr, "consume: %s\n", what.c_str()); };
    stop_signals signals;

    jetstream::source src{so};

    const std::filesystem::path db = a.required("db");
    if (so.until_caught_up) refuse_if_paused(db, "a consume --until-caught-up");
    engine_options eo;
    eo.store = t.store_for(db);
    eo.store.sync = durability_from(a);
    eo.store.wait_for_writer = writer_wait(t.name, a, db);
    retention_from(a, eo.store);
    gaps_from(a, eo.store);
    eo.store.retention.clock = retention_clock::wall;  // a broker redelivers in wall time
    eo.store.retention.source = src.bound();            // a shorter inbox retention is refused
    eo.max_in_flight = std::max<std::size_t>(eo.max_in_flight, 2 * so.fetch_batch);
    eo.stall_after = stall_after_from(a);
    // A commit holds --max-batch deliveries at most, or what gathered within --max-delay.
    if (a.get("max-batch")) eo.max_batch = static_cast<std::size_t>(a.positive("max-batch", 1));
    if (auto d = duration_option(a, "max-delay")) {
        eo.max_delay = std::chrono::duration_cast<std::chrono::microseconds>(*d);
    }

    boost::asio::io_context io;
    auto work = boost::asio::make_work_guard(io);
    std::thread completions([&io] { io.run(); });
    struct joiner {
        std::thread& t;
        decltype(work)& w;
        ~joiner() {
            w.reset();
            t.join();
        }
    } join_at_end{completions, work};

    engine e{io.get_executor(), eo};
    e.add_projections(t.setup);
    applying = &e;
    health_file health{db, [&e] { return e.health(); }};
    pause_watch paused{db, e.monitor(), record_pauses_in(e)};
    // A run that stops on an error prints its summary too, then the error (exit 2).
    jetstream::source_result r;
    std::exception_ptr failed;
    std::string error;
    try {
        r = src.run(e);
    } catch (const std::exception& err) {
        failed = std::current_exception();
        error = err.what();
        r = src.result();
    }
    e.async_stop(boost::asio::use_future).get();
    std::fprintf(stderr, "consumed stream '%s' into %s: %s messages in %.2f s, %s acked, %s nak'd, %s redelivered; "
                 "checkpoint at sequence %s\n",
                 so.stream.c_str(), db.string().c_str(), with_commas(r.fetched).c_str(), seconds(r.elapsed),
                 with_commas(r.acked).c_str(), with_commas(r.nakked).c_str(), with_commas(r.redelivered).c_str(),
                 with_commas(r.last_sequence).c_str());
    print(result_json(r, src.bound(), error));
    if (failed) std::rethrow_exception(failed);
    return 0;
}

}  // namespace

}  // namespace idem::cli::detail
